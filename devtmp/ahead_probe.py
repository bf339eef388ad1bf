"""Device (issue 25, twelfth session): is a proposal block slower on the GPU when it is enqueued behind long work
(launched ahead) than when the host launches it after that work has finished? The dense draft's K = 6 block fed 2
tokens, timed by events around it only, after: nothing (idle), busy work then a host sync (the usual path), busy work
with no sync (launched ahead), the same with the start position copied from a device tensor, and busy work as a
graph. Busy work: ~8 ms of memory-bound copies. Usage: python3 devtmp/ahead_probe.py PROFILE."""
import json, os, sys, statistics
sys.path.insert(0, ".")
import torch
from lib.study import common
from lib.study.microbench import step_drafts
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
drafts, x, pos = step_drafts(P)
d = drafts["dense"]
k = P.decode.k
x2 = x.repeat(1, 2)
src = torch.empty(1 << 30, dtype=torch.uint8, device=x.device); dst = torch.empty_like(src)
def busy():
    for _ in range(6):
        dst.copy_(src)
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    busy()
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    busy()
dev_start = torch.tensor(pos - 1, device=x.device)
block = lambda st: d.runner.chain(d.head.head, x2, st, k)
block(pos - 1); block(dev_start); torch.cuda.synchronize()
def timed(pre, sync_between, st):
    pre()
    if sync_between:
        torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); block(st); b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b)
modes = {"idle": (lambda: None, True, pos - 1), "after_sync": (busy, True, pos - 1), "behind": (busy, False, pos - 1),
         "behind_dev_start": (busy, False, dev_start), "behind_graph": (g.replay, False, pos - 1),
         "after_sync_graph": (g.replay, True, pos - 1)}
raw = {m: [] for m in modes}
for i in range(40):
    for m in (list(modes) if i % 2 == 0 else list(modes)[::-1]):
        raw[m].append(timed(*modes[m]))
res = {m: {"p50": statistics.median(v[5:]), "mean": statistics.fmean(v[5:]), "max": max(v[5:])} for m, v in raw.items()}
for m, r in res.items():
    print("%-18s p50 %.3f mean %.3f max %.3f ms" % (m, r["p50"], r["mean"], r["max"]), flush=True)
json.dump(res, open(f"{OUT}/ahead_probe.json", "w"), indent=1)
