"""Device-only (issue 25, seventh pass): attention splits of 8 positions against 16, with FlashHead's new kernels
(dc1aff3 + 16 warps) and the old ones (3980e4c: where splits of 8 made FlashHead add 0.16 ms a token). Runner.chain,
k=6, position 300. Writes $OUT/split8.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "devtmp"))
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode, kernels as K, flash_kernels as F, heads as HD
import kernels_old as KO
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
head = HD.FlashHead(W, cents, assign, 16, kernel="triton")
c2t_ext = torch.cat([head.c2t, torch.full((1, 16), -1, device=dev)]).contiguous()
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
x = prompt[:, -1:]
const = x.view(1).clone()
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "block": {}, "checks": {}, "tokens": {}}
bodies = {"S16": dict(split=16), "S8": dict(split=8), "S8_tile4k": dict(split=8, tile_bytes=4096)}
heads = {"none": lambda h: const,
         "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "flash": lambda h: F.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16),
         "flash_old": lambda h: KO.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16)}
fns = {}
for bname, kw in bodies.items():
    v = decode.FusedDecode(r, **kw)
    r.decode = v
    res["checks"][bname] = decode.check(r, v) or "ok"
    r.prefill(prompt)
    for hname, h in heads.items():
        pick = lambda hh, h=h: h(hh)
        r.warm_chain(pick, 1, k)
        res["tokens"][f"{bname}/{hname}"] = r.chain(pick, x, pos, k).tolist()
        fns[f"{bname}/{hname}"] = (lambda pick=pick: r.chain(pick, x, pos, k))
print("checks", res["checks"], flush=True)
print("tokens", res["tokens"], flush=True)
raw = bench.interleaved(fns, 20, 200, dev)
for n, ms in raw.items():
    res["block"][n] = bench.stats(ms)
for n, v in res["block"].items():
    b = res["block"][n.split("/")[0] + "/none"]["p50_ms"]
    print("%-24s per token p50 %.4f mean %.4f  head adds %.1f us" % (n, v["p50_ms"] / k, v["mean_ms"] / k,
                                                                    1000 * (v["p50_ms"] - b) / k), flush=True)
json.dump(res, open(f"{OUT}/split8.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
