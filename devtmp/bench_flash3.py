"""Device-only (issue 25, sixth pass): FlashHead with the plan made by every token program (lib/engine/flash_kernels.py)
against the old kernels (3980e4c) and the last-program plan (e33c6ee, two launches); launch settings; launch 1 alone.
Exactness against heads.exact_fp32, and the overflow path. Writes $OUT/flash3.json."""
import json, os, sys, time
import torch, triton
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "devtmp"))
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import kernels as K, flash_kernels as F, heads
import kernels_old as KO
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
head = heads.FlashHead(W, cents, assign, 16, kernel="triton")
c2t_ext = torch.cat([head.c2t, torch.full((1, 16), -1, device=dev)]).contiguous()
res = {"device": bench.device_name(dev), "exact": {}, "block": {}}
cfgs = {"lib": {}, "w2_8": dict(warps2=8), "w2_16": dict(warps2=16), "w2_8_R32": dict(R=32, warps2=8),
        "w2_8_w4": dict(warps=4, warps2=8), "w2_8_BD512": dict(warps2=8, BLOCK_D2=512), "w2_16_BD512": dict(warps2=16, BLOCK_D2=512),
        "w2_32": dict(warps2=32)}
fns = {n: (lambda h, kw=kw: F.flash_greedy_triton(h, W, cents, c2t_ext, 16, **kw)) for n, kw in cfgs.items()}
fns["old"] = lambda h: KO.flash_greedy_triton(h, W, cents, c2t_ext, 16)
g = torch.Generator(device=dev).manual_seed(1)
hs = W[torch.randint(0, W.shape[0], (200,), device=dev, generator=g)] + 0.05 * torch.randn(200, W.shape[1], device=dev, generator=g).to(W.dtype)
want = heads.exact_fp32(head, hs)
for name, fn in fns.items():
    got = torch.stack([fn(h[None].contiguous())[0] for h in hs])
    res["exact"][name] = int((got == want).sum())
    print("exact", name, res["exact"][name], "of", len(hs), flush=True)
# the overflow path on the GPU: 4 slab slots a bin (most top bins overflow), and 64 probes
for name, kw, p in (("overflow_S4", dict(S=4), 16), ("overflow_S4_p64", dict(S=4), 64), ("p64", {}, 64)):
    fh = head.with_probes(p, "torch")
    w = heads.exact_fp32(fh, hs[:50])
    got = torch.stack([F.flash_greedy_triton(h[None].contiguous(), W, cents, c2t_ext, p, **kw)[0] for h in hs[:50]])
    res["exact"][name] = int((got == w).sum())
    print("exact", name, res["exact"][name], "of 50; plan", K.scratch(dev, 9496, kw.get("S", 256))["plan"].tolist(), flush=True)
s = K.scratch(dev, 9496, 256)
res["state_clean"] = bool(s["ctl"].eq(0).all() and s["hist"].eq(0).all())
print("state clean", res["state_clean"], flush=True)
json.dump(res, open(f"{OUT}/flash3.json", "w"), indent=1)
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
r.prefill(prompt)
x = prompt[:, -1:]
const = x.view(1).clone()
s16 = K.scratch(dev, 9496, 256)


def scores_only(h, R=16, warps=8):
    pdl, opts = K.launches(dev, warps)
    F._flash_scores[(triton.cdiv(9496, R),)](h, cents, s16["keys"], s16["hist"], s16["slab"], 9496, 1024, R, 1024, 256,
                                             pdl, **opts)
    return const


picks = {"body_only": lambda h: const, "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "gemv_argmax_centroids": lambda h: K.dense_greedy_triton(h.contiguous(), cents)}
picks.update({f"flash_{n}": (lambda h, fn=fn: fn(h.contiguous())) for n, fn in fns.items()})
picks["scores_only"] = lambda h: scores_only(h.contiguous())
picks["scores_only_R32"] = lambda h: scores_only(h.contiguous(), R=32)
toks = {}
for name, fn in picks.items():
    r.warm_chain(fn, 1, k)
raw = bench.interleaved({n: (lambda fn=fn: r.chain(fn, x, pos, k)) for n, fn in picks.items()}, 20, 300, dev)
body = bench.stats(raw["body_only"])["p50_ms"]
for n, ms in raw.items():
    v = res["block"][n] = bench.stats(ms)
    print("block %-26s p50 %.4f ms  per token %.4f  added %.1f us" % (n, v["p50_ms"], v["p50_ms"] / k,
                                                                       1000 * (v["p50_ms"] - body) / k), flush=True)
s16["hist"].zero_()
json.dump(res, open(f"{OUT}/flash3.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
