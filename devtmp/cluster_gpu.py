"""Notebook 01's cluster-size study on a GPU profile (sizes 8-64): python3 devtmp/cluster_gpu.py PROFILE; writes
$STUDY_OUTPUTS/PROFILE/cluster_sizes.json and prints its table."""
import sys, time
from dataclasses import replace
import pandas as pd
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.study import reclustering as step
pd.set_option("display.width", 250)
P = step.setup(sys.argv[1])

t = time.time()
r = step.cluster_size_study(P)
print("seconds", round(time.time() - t, 1), r["device"], r["n_states"], "states", flush=True)
print(step.cluster_size_table(r).round(4).to_string())
print(step.least_read_table(r).round(4).to_string())
print(r["sizes"], r["dense"])
