# Forty-third session: the GPU-relevant tests at HEAD on one H200 (gptqmodel installed).
source devtmp/awq_setup.sh
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
git log --oneline -1 | tee $OUT/head.txt
timeout ${1:-320} python3 -m pytest -q -p no:cacheprovider -x tests/test_kernels_cuda.py tests/test_speculative.py tests/test_batch_invariant.py tests/test_adaptive.py tests/test_pipelined.py tests/test_sampling.py tests/test_launch.py tests/test_heads.py tests/test_w4a16_mma.py 2>&1 | tee $OUT/pytest.log | tail -15
