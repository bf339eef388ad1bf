"""Notebook 02's batch study (lib/study/head_batches.py) on a GPU for one profile, without the rest of notebook 02
(no reference-path drafts): python3 devtmp/batch_gpu.py PROFILE. Results to $STUDY_OUTPUTS/PROFILE/head_batches.json;
also the single-row Triton heads' time on the first state, for comparison at B = 1."""
import json, sys, time
import torch
from lib import bench, modes
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.study import microbench as step

t0 = time.time()
P = step.setup(sys.argv[1])
ensure_flash_checkpoint(P)
drafts = engines.build_drafts(P, (modes.DENSE, modes.FLASH))
print(f"drafts built {time.time() - t0:.0f} s", flush=True)
hb = step.head_batch_study(P, drafts)
print(f"study done {time.time() - t0:.0f} s", flush=True)
import pandas as pd
pd.set_option("display.width", 250)
print(hb["device"], hb["n_states"], "states; synthetic:", hb["synthetic"], "skipped", hb["skipped"])
print(step.head_batch_table(hb).round(4).to_string())
from lib.study.common import trajectory_states
fh = drafts[modes.FLASH].head.head
H, _ = trajectory_states(P, fh)
h = H[:1].contiguous()
one = bench.interleaved({"dense_triton": lambda: drafts[modes.DENSE].head(h), "flash_triton": lambda: drafts[modes.FLASH].head(h)},
                        P.bench.warmup, P.bench.iters, h.device)
print({k: bench.stats(v) for k, v in one.items()})
print("kernels:", drafts[modes.DENSE].head.kernel_ran, drafts[modes.FLASH].head.kernel_ran)
