"""Device (issue 26): `sweep`: lib/engine/attention.py's launch settings at the 32B target's heads (8 rows, 342 cache
positions) against SDPA; `step <variant>`: h100awq's target step (1 and 8 tokens, graphed, p50 of 60), its
exactness (a verify of 8 equals the 8 single-token calls, bitwise) and its kernels, with the W4A16 epilogue /
prologue fusions on (`fused`) or off (`unfused`: Int4Linear.adds_residual = takes_glu = False). Writes $OUT/*.json."""
import json, os, sys, time
import torch, torch.nn.functional as F
sys.path.insert(0, ".")
from lib import bench
from lib.engine import layer_kernels as attention
from lib.engine.runner import capture
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
what = sys.argv[1]
res = {"device": bench.device_name(dev)}
if what == "sweep":
    REP, fns, L, n = 16, {}, 342, 8
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, 64, n, 128, device=dev, generator=g).half()
    k, v = (torch.randn(1, 8, L, 128, device=dev, generator=g).half() for _ in range(2))
    configs = [(s, b, w) for s in (64, 128, 256) for b in (32, 64, 128) for w in (2, 4, 8) if b <= s]
    for start in (64, 200, 320):
        pos = start + torch.arange(n, device=dev)
        mask = torch.arange(L, device=dev)[None, :] <= pos[:, None]
        sd = lambda pos=pos, mask=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        fns[f"{start}/sdpa"] = capture(lambda sd=sd: [sd() for _ in range(REP)])[0].replay
        ref = sd().transpose(1, 2).float()
        for s, b, w in configs:
            tr = lambda pos=pos, s=s, b=b, w=w: attention.cached_attention(q, k, v, pos, s, b, w)
            assert (tr().float() - ref).abs().max().item() < 2e-3, (s, b, w)
            fns[f"{start}/S{s}_B{b}_w{w}"] = capture(lambda tr=tr: [tr() for _ in range(REP)])[0].replay
    raw = bench.interleaved(fns, 5, 60, dev)
    res["us"] = {key: 1000 * bench.stats([m / REP for m in ms])["p50_ms"] for key, ms in raw.items()}
    for cfg in ["sdpa"] + [f"S{s}_B{b}_w{w}" for s, b, w in configs]:
        print("%-16s" % cfg, " ".join("%6.2f" % res["us"][f"{p}/{cfg}"] for p in (64, 200, 320)), flush=True)
    json.dump(res, open(f"{OUT}/sweep.json", "w"), indent=1)
    sys.exit(0)
variant = sys.argv[2]
from lib.engine.layer_kernels import TritonLayer
from lib.models.w4a16 import Int4Linear
if variant == "noresidual":                      # the down projection's residual added by a kernel of its own
    Int4Linear.adds_residual = False
if variant == "attention":                       # the Triton attention, the model's norms (compiled)
    TritonLayer.norm = staticmethod(lambda m, x: m(x))
    TritonLayer.add_norm = staticmethod(lambda m, x, y: (x + y, m(x + y)))
from lib.study import common, microbench
from lib.study.common import encoded_prompts
from lib.models import build as engines
from lib.models.checkpoints import load_target
P = common.setup("h100awq")
model = load_target(P)
print(variant, "target loaded", round(time.time() - t0), flush=True)
from dataclasses import replace
P = replace(P, decode=replace(P.decode, triton_layers=variant != "torch"))
if variant == "qprep":                           # devtmp/qprep.py: q norm + RoPE inside the attention kernel
    sys.path.insert(0, "devtmp")
    import qprep
    qprep.install(model, engines.cache_len(P), P.decode.k_max + 1)
r = engines.build_target(P, model).runner
prompt = encoded_prompts(P)[0][1]
fns = microbench.target_calls(r, prompt, [1, 8])
raw = bench.interleaved(fns, 5, 60, dev)
res["step"] = {key: bench.stats(ms) for key, ms in raw.items()}
for key, s in res["step"].items():
    print("%s step %s p50 %.3f mean %.3f p95 %.3f ms" % (variant, key, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
p0 = len(prompt)
ids = torch.tensor([prompt[-8:]], device=dev)
whole = r.forward(ids, p0).clone()
single = torch.cat([r.forward(ids[:, i:i + 1], p0 + i).clone() for i in range(8)], 1)
res["exact"] = {"verify_equals_single_bitwise": torch.equal(whole, single), "layers": r.layer_path}
print(variant, "exact", res["exact"], flush=True)
b = res["breakdown"] = bench.breakdown(lambda: r.greedy(ids[:, :1], p0), dev)
print(variant, "total_us %.0f launches %d" % (b["total_us"], b["launches"]), flush=True)
for k_ in b["kernels"]:
    print("   %-90s %4d %8.1f %6.2f" % (k_["kernel"][:90], k_["launches"], k_["us"], k_["us"] / max(k_["launches"], 1)))
json.dump(res, open(f"{OUT}/step_{variant}.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
