"""Device (issue 26, eleventh session): the int4 target step (8 rows, single token) with its Triton kernels (W4A16,
attention, rope_cache, RMSNorm) as programmatic dependent launches (each lets the next launch at its start and waits
for the previous at its top) or plain launches. One runner each, interleaved graphed calls; also a verify of 8.
Writes $OUT/target_pdl.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.engine import layer_kernels as LK
from lib.models import build as engines, w4a16 as W
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)
prompt = encoded_prompts(P)[0][1]
fns, outs = {}, {}
for name, on in (("plain", False), ("pdl", True)):
    W.PDL = LK.PDL = on
    runner = engines.build_target(P, model).runner
    calls = target_calls(runner, prompt, [1, 8])
    for n, f in calls.items():
        fns[f"{name}_{n}"] = f
        outs[f"{name}_{n}"] = f().clone()
    bench.sync(runner.device)
    print(name, "captured", round(time.time() - t0), flush=True)
same = {n: bool(torch.equal(outs[f"plain_{n}"], outs[f"pdl_{n}"])) for n in ("1", "8")}
print("tokens equal", same, flush=True)
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 60, dev)
res = {"device": bench.device_name(dev), "equal": same, "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-8s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
for name in ("plain_1", "pdl_1"):
    bd = bench.breakdown(fns[name], dev)
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/target_pdl.json", "w"), indent=1)
