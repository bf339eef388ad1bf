"""Device (issue 26, sixteenth session): the int4 target step (8 rows) with the RMSNorms split between the W4A16
projections (Int4Linear.folds_norm, the library's default now) against the norm kernels (folds_norm off), one runner
a variant, compiled and captured with its own setting; interleaved graphed calls of 1 and 8 tokens; breakdowns.
Writes $OUT/fold_ab.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.models import build as engines
from lib.models.int4_linear import Int4Linear
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)
prompt = encoded_prompts(P)[0][1]
fns, toks, hidden = {}, {}, {}
for name, fold in (("norm_kernels", False), ("folded", True)):
    Int4Linear.folds_norm = fold
    runner = engines.build_target(P, model).runner
    calls = target_calls(runner, prompt, [1, 8])
    for n, fn in calls.items():
        fns[f"{name}_{n}"] = fn
        toks[f"{name}_{n}"] = fn().tolist()
    bench.sync(runner.device)
    print(name, "captured", toks[f"{name}_8"], round(time.time() - t0), flush=True)
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 60, dev)
res = {"device": bench.device_name(dev), "tokens": toks, "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-16s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
for name in ("norm_kernels_1", "folded_1"):
    bd = bench.breakdown(fns[name], dev)
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us", "kernels")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
    for k in bd["kernels"][:12]:
        print("   %.1f %d %s" % (k["us"], k["launches"], k["kernel"][:90]), flush=True)
json.dump(res, open(f"{OUT}/fold_ab.json", "w"), indent=1)
