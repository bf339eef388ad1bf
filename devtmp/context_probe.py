"""Device (twelfth session): does a target call cost what notebook 03's isolated bench says inside a round? In the
e2e runs on h100awq the ordinary schedule's single-token append takes 7.86 ms and its verify(6) about 9.4 ms, against
8.62-8.63 ms for both alone. Patterns, each call timed by events, a host sync after each as in the rounds:
  round:   draft block (K, fed 2), verify(K+0) [K rows], append(1)
  nodraft: verify(K), append(1)
  single:  append(1) only (a sync after each)
  stream:  append(1) back to back, no sync (the baseline's way)
With the draft on its own GPU (two_gpu_awq; thirteenth session) the block runs there and the events are on the
target's GPU, so a round's block is timed as the target's GPU sees it.
Usage: python3 devtmp/context_probe.py PROFILE."""
import json, os, sys, statistics, time
sys.path.insert(0, ".")
import torch
from lib import modes
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
tm = load_target(P); ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, (modes.DENSE,), target_model=tm)
d = drafts[modes.DENSE]
k = P.decode.k
dev = target.runner.device
prompt = common.encoded_prompts(P)[0][1]
pos = len(prompt) + 40
target.runner.prefill(torch.tensor([prompt + prompt[:40]], device=dev)) if hasattr(target.runner, "prefill") else None
dd = d.runner.device                                           # the draft's GPU (two_gpu_awq: its own)
d.runner.prefill(torch.tensor([prompt + prompt[:40]], device=dd))
ids_k = torch.tensor([prompt[:k]], device=dev); ids_1 = ids_k[:, :1]; ids_2 = ids_k[:, :2].to(dd)
def ev():
    e = torch.cuda.Event(enable_timing=True); e.record(); return e
def timed(fn, sync=True):
    a = ev(); fn(); b = ev()
    if sync:
        b.synchronize()
    return a, b
block = lambda: d.runner.chain(d.head.head, ids_2, pos - 1, k)
verify = lambda: target.runner.greedy(ids_k, pos)
append = lambda: target.runner.greedy(ids_1, pos)
res = {}
for rep in range(2):
    for pat in ("round", "nodraft", "single", "stream"):
        times = {"block": [], "verify": [], "append": []}
        for i in range(30):
            if pat == "round":
                ps = [("block", timed(block)), ("verify", timed(verify)), ("append", timed(append))]
            elif pat == "nodraft":
                ps = [("verify", timed(verify)), ("append", timed(append))]
            elif pat == "single":
                ps = [("append", timed(append))]
            else:
                ps = [("append", timed(append, sync=False))]
            torch.cuda.synchronize()
            if i >= 5:
                for n, (a, b) in ps:
                    times[n].append(a.elapsed_time(b))
        res[f"{pat}_{rep}"] = {n: statistics.median(v) for n, v in times.items() if v}
        print(pat, rep, {n: round(statistics.median(v), 3) for n, v in times.items() if v}, flush=True)
json.dump({"device": torch.cuda.get_device_name(), "k": k, "pos": pos, "res": res},
          open(f"{OUT}/context_probe_{P.name}.json", "w"), indent=1)
