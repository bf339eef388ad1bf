"""Device-only (issue 25, third pass): body launch settings (GEMV tile and warps, attention split and warps) as the
engine runs them (Runner.chain, k=6, one replay) with the dense and FlashHead heads and with none; FlashHead launch
settings. Writes $OUT/step25c.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode, kernels as K
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
order = torch.argsort(assign, stable=True)
c2t_ext = torch.cat([order.view(9496, 16), torch.full((1, 16), -1, device=dev)]).contiguous()
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
x = prompt[:, -1:]
const = x.view(1).clone()
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "block": {}, "checks": {}}
bodies = {f"tile{t // 1024}k_w{w}_aw{aw}_S{s}": dict(tile_bytes=t, warps=w, attention_warps=aw, split=s)
          for t, w, aw, s in [(16384, 2, 2, 32), (16384, 2, 1, 16), (8192, 1, 1, 16), (8192, 1, 1, 8),
                              (4096, 1, 1, 8), (8192, 2, 1, 8), (16384, 1, 1, 8)]}
heads = {"none": lambda h: const,
         "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "flash": lambda h: K.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16, R=16, warps=4)}
fns = {}
for bname, kw in bodies.items():
    v = decode.FusedDecode(r, **kw)
    r.decode = v
    res["checks"][bname] = decode.check(r, v) or "ok"
    r.prefill(prompt)
    for hname, h in heads.items():
        pick = lambda hh, h=h: h(hh)                                   # its own id: its own graph
        r.warm_chain(pick, 1, k)
        fns[f"{bname}/{hname}"] = (lambda pick=pick: r.chain(pick, x, pos, k))
print("checks", res["checks"], flush=True)
for hname, kw in {"flash_R16w2": dict(R=16, warps=2), "flash_R8w1": dict(R=8, warps=1),
                  "flash_w2_1": dict(R=16, warps=4, warps2=1), "flash_w2_2": dict(R=16, warps=4, warps2=2)}.items():
    pick = lambda hh, kw=kw: K.flash_greedy_triton(hh.contiguous(), W, cents, c2t_ext, 16, **kw)
    r.warm_chain(pick, 1, k)
    fns[f"{bname}/{hname}"] = (lambda pick=pick: r.chain(pick, x, pos, k))
raw = bench.interleaved(fns, 20, 150, dev)
for n, ms in raw.items():
    res["block"][n] = bench.stats(ms)
for n, v in res["block"].items():
    b = res["block"][n.split("/")[0] + "/none"]["p50_ms"]
    print("%-40s per step p50 %.4f mean %.4f  head adds %.1f us" % (n, v["p50_ms"] / k, v["mean_ms"] / k,
                                                                    1000 * (v["p50_ms"] - b) / k), flush=True)
json.dump(res, open(f"{OUT}/step25c.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
