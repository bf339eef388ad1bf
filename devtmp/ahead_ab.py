"""Device (issue 26, seventeenth session): the int4 target step (1 and 8 rows) with weights started into L2 ahead of
their projection (lib.engine.layer_kernels.AHEAD): none; the o-projection's from the q/k norms + RoPE kernel (under
the attention); plus q/k/v's from the input norm; plus gate/up's first AHEAD_BYTES from the post-attention norm; the
last with 40 MB. One runner a variant, each captured with its own setting; interleaved graphed calls; tokens
compared; profiler breakdowns. Usage: python3 devtmp/ahead_ab.py [PROFILE]; writes $OUT/ahead_ab.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.engine import layer_kernels
from lib.models import build as engines
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)
prompt = encoded_prompts(P)[0][1]
VARIANTS = {"none": (set(), 24), "o": ({"o"}, 24), "o_qkv": ({"o", "qkv"}, 24), "all": ({"o", "qkv", "gate_up"}, 24),
            "all40": ({"o", "qkv", "gate_up"}, 40)}
fns, toks = {}, {}
for name, (ahead, mb) in VARIANTS.items():
    layer_kernels.AHEAD, layer_kernels.AHEAD_BYTES = ahead, mb << 20
    runner = engines.build_target(P, model).runner
    for n, fn in target_calls(runner, prompt, [1, 8]).items():
        fns[f"{name}_{n}"] = fn
        toks[f"{name}_{n}"] = fn().tolist()
    bench.sync(runner.device)
    print(name, "captured", toks[f"{name}_8"], round(time.time() - t0), flush=True)
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 60, dev)
res = {"device": bench.device_name(dev), "tokens": toks, "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-10s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
print("tokens equal:", len({str(v) for k, v in toks.items() if k.endswith("_8")}) == 1,
      len({str(v) for k, v in toks.items() if k.endswith("_1")}) == 1, flush=True)
for name in ("none", "all"):
    bd = bench.breakdown(fns[name + "_1"], dev)
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us", "kernels")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/ahead_ab.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
