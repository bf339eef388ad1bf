# Device: papermill wheels (.whl) and gptqmodel's (.whl_awq) into /root/site; source this file.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl .whl_awq/*.whl 2>&1 | tail -2
export LD_LIBRARY_PATH=$PWD/.whl_awq/lib:${LD_LIBRARY_PATH:-} PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
python3 -c "import gptqmodel, transformers, torch; print('gptqmodel', gptqmodel.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
