# Forty-second session, third call: where h100awq's engine and HF forward part (devtmp/layer_drift.py).
source devtmp/awq_setup.sh >/dev/null 2>&1
export PYTHONPATH=/root/site:$PWD STUDY_OUTPUTS=/tmp/o
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
timeout 400 python3 devtmp/layer_drift.py h100awq 2>&1 | grep -v "Warning\|warn(\|INFO\|Configuration" | tee $OUT/drift.log
