# Device: papermill wheels (.whl) and gptqmodel's (.whl_awq) into /root/site; source this file. gptqmodel 7.6.0's
# needs that ship as source were built here with `pip wheel --no-deps` (pure Python); PyPcre (C) is built on the
# device from its sdist (sha256 78e81d22...), linked to libpcre2-8.so.0 (the image's, or .whl_awq/lib's).
if ! ls .whl_awq/pypcre-*cp312*.whl >/dev/null 2>&1; then
  lib=/usr/lib/x86_64-linux-gnu/libpcre2-8.so.0; [ -e $lib ] || lib=$PWD/.whl_awq/lib/libpcre2-8.so.0
  PYPCRE_LIBRARY_PATH=$lib python3 -m pip wheel -q --no-deps --no-build-isolation .whl_awq/pypcre-0.6.4.tar.gz -w .whl_awq 2>&1 | tail -2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl .whl_awq/*.whl 2>&1 | tail -2
export LD_LIBRARY_PATH=$PWD/.whl_awq/lib:${LD_LIBRARY_PATH:-} PYTHONPATH=/root/site:$PWD PATH=/root/site/bin:$PATH TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
python3 -c "import gptqmodel, transformers, torch; print('gptqmodel', gptqmodel.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
