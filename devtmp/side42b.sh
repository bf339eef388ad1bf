# Forty-second session, second call: h100awq's adaptive study with its committed microbench.json present (the cost
# block policy reads it), then the peers' divergence (devtmp/peer_gap.py). The tree is the claimed commit.
export STUDY_OUTPUTS=/tmp/o STUDY_COMMIT=$(cat devtmp/claim.txt)
mkdir -p /tmp/o && cp -r outputs/h100awq /tmp/o/ && rm -f /tmp/o/h100awq/adaptive.json
source devtmp/awq_setup.sh >/dev/null 2>&1
export PYTHONPATH=/root/site:$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
timeout 300 python3 devtmp/side_gpu.py h100awq adaptive 2>&1 | grep -v "Warning\|warn(" | tee $OUT/adaptive.log | tail -5
mkdir -p $OUT/outputs/h100awq && cp /tmp/o/h100awq/adaptive.json $OUT/outputs/h100awq/
timeout 200 python3 devtmp/peer_gap.py h100awq 2>&1 | grep -v "Warning\|warn(\|INFO\|Configuration" | tee $OUT/peer_gap.log
