"""Device (issue 26, seventeenth session): the int4 target step (1 and 8 rows) with SiLU(gate) * up as torch.compile's
fused elementwise kernel (a plain launch) against layer_kernels.silu_mul (a programmatic dependent launch). One runner
a variant, captured in turn (dynamo reset between); interleaved graphed calls; tokens compared. Writes
$OUT/glu_ab.json."""
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
kernel = layer_kernels.TritonLayer.gated
def compiled(mlp, gu):
    g, u = gu.chunk(2, dim=-1)
    return mlp.act_fn(g) * u
fns, toks = {}, {}
for name, fn_ in (("compiled", compiled), ("kernel", kernel)):
    layer_kernels.TritonLayer.gated = staticmethod(fn_)
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
    print("%-12s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
print("tokens equal:", toks["compiled_8"] == toks["kernel_8"], toks["compiled_1"] == toks["kernel_1"], flush=True)
json.dump(res, open(f"{OUT}/glu_ab.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
