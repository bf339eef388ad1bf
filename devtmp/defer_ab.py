"""Device (issue 26, prepared in the seventeenth session, not run; apply devtmp/deferred_splitk.diff first): the int4
target step (1 and 8 rows) with q/k/v's and o's split-K partials summed by the W4A16 kernel's own last program
(leaves_sum off) against summed by the kernel after them (rope_cache, the post-attention norm: leaves_sum on). Two
runners captured in turn (dynamo reset between: split_k is traced), interleaved graphed calls, tokens compared,
breakdowns. Writes $OUT/defer_ab.json."""
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
fns, toks = {}, {}
ORDER = os.environ.get("ORDER", "os").split(",")       # o: own pass, s: summed after; instances in capture order
for inst, pair in enumerate(ORDER):
  for c in pair:
    name, leaves = ("own_pass" if c == "o" else "summed_after") + (f"#{inst}" if len(ORDER) > 1 else ""), c == "s"
    Int4Linear.leaves_sum = leaves
    torch._dynamo.reset()
    runner = engines.build_target(P, model).runner
    for n, fn in target_calls(runner, prompt, [1, 8]).items():
        fns[f"{name}_{n}"] = fn
        toks[f"{name}_{n}"] = fn().tolist()
    bench.sync(runner.device)
    print(name, "captured", toks[f"{name}_8"], round(time.time() - t0), flush=True)
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 80, dev)
res = {"device": bench.device_name(dev), "tokens": toks, "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-16s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
print("tokens equal:", len({str(v) for k, v in toks.items() if k.endswith("_8")}) == 1,
      len({str(v) for k, v in toks.items() if k.endswith("_1")}) == 1, flush=True)
for name in [n[:-2] for n in fns if n.endswith("_1")][:2]:
    bd = bench.breakdown(fns[name + "_1"], dev)
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us", "kernels")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/defer_ab.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
