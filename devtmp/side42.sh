# Forty-second session: the GPU test of warm_prefill, then side studies $2 of profile $1 at the claimed commit (lib/,
# notebooks/, params/ from devtmp/tree.tgz, a git archive of it), results under $OUT/outputs.
[ -f devtmp/tree.tgz ] && rm -rf lib notebooks params tests && tar xzf devtmp/tree.tgz   # else the tree is the claimed commit
export STUDY_OUTPUTS=$OUT/outputs STUDY_COMMIT=$(cat devtmp/claim.txt)
source devtmp/awq_setup.sh
export PYTHONPATH=/root/site:$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
echo "$STUDY_COMMIT" > $OUT/claim.txt
timeout 150 python3 -m pytest -q tests/test_kernels_cuda.py -k "warmed_length or speculative_output" 2>&1 | tail -3 | tee $OUT/pytest.log
timeout ${3:-420} python3 devtmp/side_gpu.py $1 $2 2>&1 | grep -v "Warning\|warn(" | tee $OUT/side_$1.log | tail -40
