"""Device-only (issue 25, fifth pass): where FlashHead's first launch spends its time over a plain GEMV+argmax of the
centroids (ablations of devtmp/flash_exp.py: no filing, filing only each program's local top P, no highest-bin atomic,
no sort), and full-head variants that stay exact. Writes $OUT/flash2.json."""
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
import flash_exp as FX
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
full = {"lib": {}, "lib_R32": dict(R=32), "x_top_R32": dict(R=32, FILE=2), "x_top_R32_nohigh": dict(R=32, FILE=2, HIGH=False),
        "x_nohigh": dict(HIGH=False), "x_top_R64": dict(R=64, BLOCK_D=512, FILE=2), "x_R32_w4": dict(R=32, warps=4, FILE=2)}
fns = {n: (lambda h, kw=kw, n=n: (F if n.startswith("lib") else FX).flash_greedy_triton(h, W, cents, c2t_ext, 16, **kw))
       for n, kw in full.items()}
fns["old"] = lambda h: KO.flash_greedy_triton(h, W, cents, c2t_ext, 16)
g = torch.Generator(device=dev).manual_seed(1)
hs = W[torch.randint(0, W.shape[0], (200,), device=dev, generator=g)] + 0.05 * torch.randn(200, W.shape[1], device=dev, generator=g).to(W.dtype)
want = heads.exact_fp32(head, hs)
for name, fn in fns.items():
    got = torch.stack([fn(h[None].contiguous())[0] for h in hs])
    res["exact"][name] = int((got == want).sum())
    print("exact", name, res["exact"][name], "of", len(hs), flush=True)
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
r.prefill(prompt)
x = prompt[:, -1:]
const = x.view(1).clone()
picks = {"body_only": lambda h: const, "gemv_argmax_centroids": lambda h: K.dense_greedy_triton(h.contiguous(), cents)}
picks.update({f"flash_{n}": (lambda h, fn=fn: fn(h.contiguous())) for n, fn in fns.items()})
probes = {"lib": {}, "x_nofile": dict(FILE=0, HIGH=False, SORT=False), "x_nohigh": dict(HIGH=False),
          "x_nosort": dict(SORT=False), "x_top_R32": dict(R=32, FILE=2), "x_top_R32_nohigh_nosort": dict(R=32, FILE=2, HIGH=False, SORT=False),
          "x_R32": dict(R=32), "x_nofile_R32": dict(R=32, FILE=0, HIGH=False, SORT=False)}
for n, kw in probes.items():
    mod = F if n == "lib" else FX
    picks[f"probes_{n}"] = lambda h, mod=mod, kw=kw: (mod.flash_probes_triton(h.contiguous(), cents, 16, **kw), const)[1]
for name, fn in picks.items():
    r.warm_chain(fn, 1, k)
raw = bench.interleaved({n: (lambda fn=fn: r.chain(fn, x, pos, k)) for n, fn in picks.items()}, 20, 300, dev)
body = bench.stats(raw["body_only"])["p50_ms"]
for n, ms in raw.items():
    v = res["block"][n] = bench.stats(ms)
    print("block %-34s p50 %.4f ms  per token %.4f  added %.1f us" % (n, v["p50_ms"], v["p50_ms"] / k,
                                                                       1000 * (v["p50_ms"] - body) / k), flush=True)
json.dump(res, open(f"{OUT}/flash2.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
