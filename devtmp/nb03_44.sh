# Forty-fourth session: (tests) the fill and speculative GPU tests and devtmp/fill_ab.py, then notebook 03 of $1 at the
# claimed commit within $2 s (a second call resumes: the unfinished e2e run comes back with the working tree).
date +%s > /tmp/t0
source devtmp/awq_setup.sh
export PYTHONPATH=/root/site:$PWD STUDY_COMMIT=$(cat devtmp/claim.txt)
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $OUT/gpu.txt
echo "$STUDY_COMMIT" > $OUT/claim.txt; touch /tmp/start
if [ "$3" = tests ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "fill or speculative_output or warmed_length" 2>&1 | tee $OUT/pytest.log | tail -6
  timeout 150 python3 devtmp/fill_ab.py 2>&1 | tee $OUT/fill_ab.log | tail -14
fi
left=$(( $2 - ($(date +%s) - $(cat /tmp/t0)) - 15 ))
echo "notebook 03 within $left s"
timeout $left python3 devtmp/run_first.py $1 3 3 2>&1 | tee $OUT/nb03.log | tail -25
find outputs/$1 -newer /tmp/start -type f | grep -v '/earlier/' > /tmp/new.txt
cat /tmp/new.txt | head -40
tar czf $OUT/new.tgz -T /tmp/new.txt
