# Forty-second session, fourth call: the GPU tests of the fused int4 projections and warm_prefill, then h100awq's
# peers again at the claimed commit (the tree is that commit), results under $OUT/outputs.
export STUDY_OUTPUTS=$OUT/outputs STUDY_COMMIT=$(cat devtmp/claim.txt)
source devtmp/awq_setup.sh >/dev/null 2>&1
export PYTHONPATH=/root/site:$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
echo "$STUDY_COMMIT" > $OUT/claim.txt
timeout 150 python3 -m pytest -q tests/test_kernels_cuda.py -k "fused_side_by_side or warmed_length or w4a16" 2>&1 | tail -3 | tee $OUT/pytest.log
timeout 300 python3 devtmp/side_gpu.py h100awq peers 2>&1 | grep -v "Warning\|warn(" | tee $OUT/peers.log | tail -3
python3 -c "
import json; p = json.load(open('$OUT/outputs/h100awq/peers.json'))
print({m: (round(a['exact_match_rate'], 2), round(a['mean_prefix_frac'], 3), round(a['decode_tok_s'] or 0, 1)) for m, a in p['aggregate'].items()})" | tee -a $OUT/peers.log
