"""Device (issue 26): lib/engine/attention.py against SDPA over the masked cache (as layer_forward called it), at
the 32B target's and the 0.6B draft's heads, 8 rows, 342 cache positions; then h100awq's target step through each
(interleaved), its exactness (a verify of 8 equals the 8 single-token calls, bitwise) and where its time goes.
Writes $OUT/attn2.json."""
import json, os, sys, time
from dataclasses import replace
import torch, torch.nn.functional as F
sys.path.insert(0, ".")
from lib import bench
from lib.engine import attention
from lib.engine.runner import capture
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
res = {"device": bench.device_name(dev), "kernels": {}, "step": {}}
REP = 16
fns, checks = {}, {}
for name, (HQ, HKV) in {"target": (64, 8), "draft": (16, 8)}.items():
    L, n = 342, 8
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, HQ, n, 128, device=dev, generator=g).half()
    k, v = (torch.randn(1, HKV, L, 128, device=dev, generator=g).half() for _ in range(2))
    for start in (64, 200, 320):
        pos = start + torch.arange(n, device=dev)
        mask = torch.arange(L, device=dev)[None, :] <= pos[:, None]
        sd = lambda q=q, k=k, v=v, mask=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
        tr = lambda q=q, k=k, v=v, pos=pos: attention.cached_attention(q, k, v, pos)
        whole = tr()
        inv = all(torch.equal(attention.cached_attention(q[:, :, r:r + 1], k, v, pos[r:r + 1])[:, 0], whole[:, r]) for r in range(n))
        checks[f"{name}/{start}"] = {"max_abs_vs_sdpa": (whole.float() - sd().float()).abs().max().item(), "rows_invariant": inv}
        for kind, f in (("sdpa", sd), ("triton", tr)):
            graph, _ = capture(lambda f=f: [f() for _ in range(REP)])
            fns[f"{name}/{start}/{kind}"] = graph.replay
print("checks", checks, flush=True)
res["checks"] = checks
raw = bench.interleaved(fns, 10, 100, dev)
for key, ms in raw.items():
    s = bench.stats([m / REP for m in ms])
    res["kernels"][key] = s
    print("%-22s p50 %.2f us  mean %.2f us" % (key, 1000 * s["p50_ms"], 1000 * s["mean_ms"]), flush=True)
json.dump(res, open(f"{OUT}/attn2.json", "w"), indent=1)
if "step" not in sys.argv[1:]:
    sys.exit(0)
from lib.study import common, microbench
from lib.study.common import encoded_prompts
from lib.models import build as engines
from lib.models.checkpoints import load_target
P = common.setup("h100awq")
model = load_target(P)
print("target loaded", round(time.time() - t0), flush=True)
runners = {}
for att in ("triton", "sdpa"):
    Pa = replace(P, decode=replace(P.decode, triton_attention=att == "triton"))
    runners[att] = r = engines.build_target(Pa, model).runner
    print(att, r.attention_path, r.rows, flush=True)
prompt = encoded_prompts(P)[0][1]
fns = {}
for att, r in runners.items():
    for n, f in microbench.target_calls(r, prompt, [1, 8]).items():
        fns[f"{att}/{n}"] = f
print("captured", round(time.time() - t0), flush=True)
raw = bench.interleaved(fns, 5, 40, dev)
for key, ms in raw.items():
    res["step"][key] = s = bench.stats(ms)
    print("step %-10s p50 %.3f mean %.3f p95 %.3f ms" % (key, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
exact = {}
for att, r in runners.items():
    p0 = len(prompt)
    ids = torch.tensor([prompt[-8:]], device=dev)
    whole = r.forward(ids, p0).clone()
    single = torch.cat([r.forward(ids[:, i:i + 1], p0 + i).clone() for i in range(8)], 1)
    exact[att] = {"verify_equals_single_bitwise": torch.equal(whole, single),
                  "max_abs": (whole.float() - single.float()).abs().max().item()}
    res["step"][f"{att}/breakdown"] = bench.breakdown(lambda r=r: r.greedy(ids[:, :1], p0), dev)
print("exact", exact, flush=True)
res["exact"] = exact
for att in runners:
    b = res["step"][f"{att}/breakdown"]
    print(att, json.dumps({k: v for k, v in b.items() if k != "rows"})[:1500], flush=True)
json.dump(res, open(f"{OUT}/attn2.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
