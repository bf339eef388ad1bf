"""Device (issue 26, prepared in the twenty-third session, not run): the int4 target step (1 and 8 rows) with the
attention's rows inside the first split written by their program (layer_kernels.DIRECT, devtmp/direct_attention.diff
applied) against the split combination for every row. One runner a variant, captured in turn (dynamo reset
between); interleaved graphed calls; tokens compared. Usage: git apply devtmp/direct_attention.diff; python3
devtmp/direct_ab.py [h100awq]. Writes $OUT/direct_ab.json."""
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
f = layer_kernels.cached_attention
fns, toks = {}, {}
ORDER = os.environ.get("ORDER", "cd").split(",")       # e.g. cd,dc,cd: instances in that order of capture
for inst, pair in enumerate(ORDER):
  for c in pair:
    name, flag = ("combined" if c == "c" else "direct") + (f"#{inst}" if len(ORDER) > 1 else ""), c == "d"
    f.__defaults__ = f.__defaults__[:-1] + (flag,)
    torch._dynamo.reset()
    runner = engines.build_target(P, model).runner
    for n, fn in target_calls(runner, prompt, [1, 8]).items():
        fns[f"{name}_{n}"] = fn
        toks[f"{name}_{n}"] = fn().tolist()
    bench.sync(runner.device)
    print(name, "captured at position", len(prompt), toks[f"{name}_8"], round(time.time() - t0), flush=True)
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 80, dev)
res = {"device": bench.device_name(dev), "position": len(prompt), "tokens": toks,
       "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-12s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
print("tokens equal:", len({str(v) for k, v in toks.items() if k.endswith("_8")}) == 1,
      len({str(v) for k, v in toks.items() if k.endswith("_1")}) == 1, flush=True)
json.dump(res, open(f"{OUT}/direct_ab.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
