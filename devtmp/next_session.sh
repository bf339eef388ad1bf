# Device, one H100 (nvidia-h100-x1), about 9 min: what the seventh session prepared and could not run.
# Set STUDY_COMMIT from `.venv/bin/python -m lib.study.preflight --claim` first; carry devtmp .whl .whl_awq.
source devtmp/awq_setup.sh; export PYTHONPATH=/root/site:$PWD
timeout 100 python3 -m pytest -q -p no:logging --tb=short tests/test_kernels_cuda.py 2>&1 | grep -E "^E |passed|failed" | tee $OUT/test.log
timeout 150 python3 devtmp/w4a16_variants.py 2>&1 | grep -v Warn | tee $OUT/variants.log
timeout 300 python3 devtmp/awq_e2e.py h100awq run 2>&1 | grep -v Warning | tee $OUT/e2e.log | tail -12   # Runner.fill end to end
tar czf $OUT/h100awq.tgz outputs/h100awq --exclude='*.safetensors'
