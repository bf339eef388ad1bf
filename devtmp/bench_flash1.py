"""Device-only (issue 25, fourth pass): FlashHead in one launch (token workers spin inside the scoring launch) against
two launches and the old kernels (3980e4c, devtmp/kernels_old.py); exactness against heads.exact_fp32 on many hidden
states; block timing in Runner.chain (k=6). Writes $OUT/flash1.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "devtmp"))
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import kernels as K, flash_kernels as F, heads
import kernels_old as KO
import flash_prev as FP
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
head = heads.FlashHead(W, cents, assign, 16, kernel="triton")
print("FlashHead built, launches", head.launches, round(time.time() - t0, 1), flush=True)
c2t_ext = torch.cat([head.c2t, torch.full((1, 16), -1, device=dev)]).contiguous()
variants = {"old": lambda h, **kw: KO.flash_greedy_triton(h, W, cents, c2t_ext, 16, **kw),
            "prev_one": lambda h, **kw: FP.flash_greedy_triton(h, W, cents, c2t_ext, 16, **kw),
            "two": lambda h, **kw: F.flash_greedy_triton(h, W, cents, c2t_ext, 16, one_launch=False, **kw),
            "one": lambda h, **kw: F.flash_greedy_triton(h, W, cents, c2t_ext, 16, **kw)}
res = {"device": bench.device_name(dev), "launches": head.launches, "exact": {}, "block": {}}
g = torch.Generator(device=dev).manual_seed(1)
hs = W[torch.randint(0, W.shape[0], (200,), device=dev, generator=g)] + 0.05 * torch.randn(200, W.shape[1], device=dev, generator=g).to(W.dtype)
want = heads.exact_fp32(head, hs)
for name, fn in variants.items():
    for extra in ({}, {"R": 32}, {"WIN": 64}, {"WIN": 4096}):
        if name in ("old", "prev_one") and extra:
            continue
        got = torch.stack([fn(h[None].contiguous(), **extra)[0] for h in hs])
        key = name + "".join(f"_{k}{v}" for k, v in extra.items())
        res["exact"][key] = int((got == want).sum())
        print("exact", key, res["exact"][key], "of", len(hs), flush=True)
s = K.scratch(dev, 9496, 256)
res["state_clean"] = bool(s["ctl"].eq(0).all() and s["hist"].eq(0).all())
print("state clean", res["state_clean"], s["ctl"].tolist(), flush=True)
json.dump(res, open(f"{OUT}/flash1.json", "w"), indent=1)
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
r.prefill(prompt)
x = prompt[:, -1:]
const = x.view(1).clone()
picks = {"body_only": lambda h: const,
         "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "flash_old": lambda h: variants["old"](h.contiguous()),
         "flash_two": lambda h: variants["two"](h.contiguous()),
         "flash_one": lambda h: variants["one"](h.contiguous()),
         "flash_prev_one": lambda h: variants["prev_one"](h.contiguous()),
         "flash_prev_two": lambda h: variants["prev_one"](h.contiguous(), one_launch=False),
         "flash_one_R32": lambda h: variants["one"](h.contiguous(), R=32),
         "flash_two_R32": lambda h: variants["two"](h.contiguous(), R=32),
         "flash_one_WIN4096": lambda h: variants["one"](h.contiguous(), WIN=4096),
         "probes_only": lambda h: (F.flash_probes_triton(h.contiguous(), cents, 16), const)[1],
         "probes_only_prev": lambda h: (FP.flash_probes_triton(h.contiguous(), cents, 16), const)[1],
         "probes_only_old": lambda h: (KO.flash_probes_triton(h.contiguous(), cents, 16), const)[1],
         "gemv_argmax_centroids": lambda h: K.dense_greedy_triton(h.contiguous(), cents)}
toks = {}
for name, fn in picks.items():
    r.warm_chain(fn, 1, k)
    toks[name] = r.chain(fn, x, pos, k).tolist()
res["chain_tokens"] = toks
print("chain tokens equal (flash variants):", len({str(toks[n]) for n in toks if n.startswith("flash")}) == 1, flush=True)
raw = bench.interleaved({n: (lambda fn=fn: r.chain(fn, x, pos, k)) for n, fn in picks.items()}, 20, 300, dev)
body = bench.stats(raw["body_only"])["p50_ms"]
for n, ms in raw.items():
    v = res["block"][n] = bench.stats(ms)
    print("block %-24s p50 %.4f ms  mean %.4f  per token %.4f  added %.1f us" % (
        n, v["p50_ms"], v["mean_ms"], v["p50_ms"] / k, 1000 * (v["p50_ms"] - body) / k), flush=True)
json.dump(res, open(f"{OUT}/flash1.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
