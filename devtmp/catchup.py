"""Device (issue 25, tenth session): what a round's two-token catch-up costs. A round's proposal block (Runner.chain,
one graph replay) fed 1 token (the usual catch-up) or 2 (after a round whose proposals were all accepted: the last
one was never fed), and one draft call of 1 token (the fused step) or 2 (the multi-token path), interleaved.
Usage: python3 devtmp/catchup.py PROFILE. Writes $OUT/catchup.json."""
import json, os, sys
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.study import common
from lib.study.microbench import step_drafts
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
drafts, x, pos = step_drafts(P)
k, b = P.decode.k, P.bench
x2 = x.repeat(1, 2)
fns = {}
for name, d in drafts.items():
    fns[f"{name}_block_m1"] = lambda d=d: d.runner.chain(d.head.head, x, pos, k)
    fns[f"{name}_block_m2"] = lambda d=d: d.runner.chain(d.head.head, x2, pos - 1, k)
    fns[f"{name}_call_1"] = lambda d=d: d.runner.forward(x, pos)
    fns[f"{name}_call_2"] = lambda d=d: d.runner.forward(x2, pos - 1)
for f in fns.values():                                          # capture every graph before timing
    f()
raw = bench.interleaved(fns, b.warmup, max(10, b.iters // 4), x.device)
res = {"device": bench.device_name(x.device), "k": k, "pos": pos,
       "paths": {n: getattr(d.runner, "decode_path", "") for n, d in drafts.items()},
       "stats": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["stats"].items():
    print("%-22s p50 %.3f ms  mean %.3f  p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
json.dump(res, open(f"{OUT}/catchup.json", "w"), indent=1)
