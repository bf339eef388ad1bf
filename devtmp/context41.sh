# Forty-first session: notebook 03's context study alone (devtmp/context_gpu.py) for profile $1 at the claimed commit:
# lib/, notebooks/, params/ replaced by devtmp/tree.tgz (git archive of that commit; the working tree may hold
# other workers' edits), results written under $OUT/outputs.
rm -rf lib notebooks params && tar xzf devtmp/tree.tgz
export PYTHONPATH=$PWD STUDY_OUTPUTS=$OUT/outputs STUDY_COMMIT=$(cat devtmp/claim.txt)
case $1 in *awq) source devtmp/awq_setup.sh;; esac
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu_$1.txt
echo "$STUDY_COMMIT" > $OUT/claim.txt
timeout ${2:-570} python3 devtmp/context_gpu.py $1 $((${2:-570} - 20)) 2>&1 | tee $OUT/context_$1.log | tail -40
