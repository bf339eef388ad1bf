"""Device (issue 26, sixteenth session): the int4 target step (8 rows) with its Triton kernels as programmatic
dependent launches, the trigger placed differently: plain launches; every kernel triggering at its start (the
eleventh session's b6b1aa8 experiment); W4A16 and attention triggering after their main loop (late); late plus
the W4A16 program's first two K-blocks of weights asked into L2 before its wait (late_prefetch). One runner a
variant, each captured with its own setting; interleaved graphed calls of 1 and 8 tokens; breakdowns.
Writes $OUT/pdl_ab.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.engine import layer_kernels
from lib.models import build as engines, w4a16
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)
prompt = encoded_prompts(P)[0][1]
VARIANTS = {"plain": (0, 0), "start": (1, 1), "late": (2, 2), "late_prefetch": (3, 2)}
fns, toks = {}, {}
for name, (wp, lp) in VARIANTS.items():
    w4a16.PDL, layer_kernels.PDL = wp, lp
    runner = engines.build_target(P, model).runner
    for n, fn in target_calls(runner, prompt, [1, 8]).items():
        fns[f"{name}_{n}"] = fn
        toks[f"{name}_{n}"] = fn().tolist()
    bench.sync(runner.device)
    print(name, "captured", toks[f"{name}_8"], round(time.time() - t0), flush=True)
w4a16.PDL, layer_kernels.PDL = 0, 0
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 60, dev)
res = {"device": bench.device_name(dev), "tokens": toks, "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-18s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
print("tokens equal:", len({str(v) for k, v in toks.items() if k.endswith("_8")}) == 1, flush=True)
for name in VARIANTS:
    bd = bench.breakdown(fns[name + "_1"], dev)
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us", "kernels")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/pdl_ab.json", "w"), indent=1)
