"""Device (issue 26, twenty-fifth session): the int4 target step (1 and 8 rows) with loads moved before the
programmatic launch's wait: W = the W4A16 programs' first K-block of weights (Tiles.early), A = the attention's first
block of older keys/values (layer_kernels.EARLY), WA = both, 0 = neither. One runner a variant, captured in the
order given (dynamo reset between); interleaved graphed calls; tokens compared. Usage: ORDER=0,W,A,WA,WA,A,W,0
python3 devtmp/early_ab.py [h100awq]. Writes $OUT/early_ab.json."""
import dataclasses, json, os, sys, time
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
base = w4a16.DEFAULT_TILES
fns, toks = {}, {}
ORDER = os.environ.get("ORDER", "0,W,A,WA,WA,A,W,0").split(",")
seen = {}
for v in ORDER:
    seen[v] = seen.get(v, -1) + 1
    name = f"{v}#{seen[v]}"
    w4a16.DEFAULT_TILES = dataclasses.replace(base, early="W" in v)
    layer_kernels.EARLY = "A" in v
    torch._dynamo.reset()
    runner = engines.build_target(P, model).runner
    for n, fn in target_calls(runner, prompt, [1, 8]).items():
        fns[f"{name}_{n}"] = fn
        toks[f"{name}_{n}"] = fn().tolist()
    bench.sync(runner.device)
    print(name, "captured at position", len(prompt), toks[f"{name}_8"], round(time.time() - t0), flush=True)
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 80, dev)
res = {"device": bench.device_name(dev), "position": len(prompt), "tokens": toks, "order": ORDER,
       "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-8s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
for rows in ("1", "8"):
    for v in dict.fromkeys(ORDER):
        p50 = [s["p50_ms"] for n, s in res["variants"].items() if n.split("#")[0] == v and n.endswith("_" + rows)]
        print(f"rows {rows} {v:3s} p50s", " ".join("%.3f" % x for x in p50), flush=True)
print("tokens equal:", len({str(v) for k, v in toks.items() if k.endswith("_8")}) == 1,
      len({str(v) for k, v in toks.items() if k.endswith("_1")}) == 1, flush=True)
json.dump(res, open(f"{OUT}/early_ab.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
