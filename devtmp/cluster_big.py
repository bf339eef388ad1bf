"""The cluster-size study on more real states than the default run's 177: smollm2 with Spec-Bench's questions,
PER prompts a group (python3 devtmp/cluster_big.py PER); writes $STUDY_OUTPUTS/smollm2/cluster_sizes.json."""
import sys, time
from dataclasses import replace
import pandas as pd
from lib.study import reclustering as step
pd.set_option("display.width", 250)
P = step.setup("smollm2")
P = replace(P, prompts=replace(P.prompts, file="/work/shared/spec_bench/question.jsonl", per_group=int(sys.argv[1])))
t = time.time()
r = step.cluster_size_study(P)
print("seconds", round(time.time() - t, 1), r["device"], r["n_states"], "states; dense agree_target", r["dense"]["agree_target"])
print(step.cluster_size_table(r).round(4).to_string())
print(step.least_read_table(r).round(4).to_string())
print(r["sizes"])
