"""Device-only (issue 25, second pass): where FlashHead's 26-29 us a step go (launch 1 alone; a plain GEMV+argmax over
the same centroid bytes), the fused body's GEMV tile and warps, the attention at 8 positions a split.
Writes $OUT/step25b.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration, capture
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
print("decode path", r.decode_path, "split", r.decode.split, "attention warps", r.decode.attention_warps, flush=True)
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
r.prefill(prompt)
x = prompt[:, -1:]
const = x.view(1).clone()
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "decode_path": r.decode_path, "block": {}, "body": {}}
picks = {"body_only": lambda h: const,
         "flash": lambda h: K.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16, R=16, warps=4),
         "flash_launch1_only": lambda h: (K.flash_probes_triton(h.contiguous(), cents, 16, R=16, warps=4), const)[1],
         "flash_R32w4": lambda h: K.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16, R=32, warps=4),
         "flash_R8w2": lambda h: K.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16, R=8, warps=2),
         "flash_S64": lambda h: K.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16, R=16, warps=4, S=64),
         "gemv_argmax_centroids": lambda h: K.dense_greedy_triton(h.contiguous(), cents),
         "gemv_argmax_centroids_R32w8": lambda h: K.dense_greedy_triton(h.contiguous(), cents, R=32, warps=8),
         "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W)}
for name, fn in picks.items():
    r.warm_chain(fn, 1, k)
raw = bench.interleaved({n: (lambda fn=fn: r.chain(fn, x, pos, k)) for n, fn in picks.items()}, 20, 200, dev)
for n, ms in raw.items():
    res["block"][n] = bench.stats(ms)
body = res["block"]["body_only"]["p50_ms"]
for n, v in res["block"].items():
    print("block %-28s p50 %.4f ms  per step %.4f  added %.1f us" % (n, v["p50_ms"], v["p50_ms"] / k,
                                                                      1000 * (v["p50_ms"] - body) / k), flush=True)
json.dump(res, open(f"{OUT}/step25b.json", "w"), indent=1)
st = torch.tensor(pos, device=dev)
graphs = {}
for tile, warps, aw, split in [(16384, 2, 1, 16), (8192, 2, 1, 16), (32768, 4, 1, 16), (16384, 4, 1, 16),
                               (8192, 1, 1, 16), (32768, 2, 1, 16), (16384, 2, 1, 8), (16384, 2, 2, 8)]:
    v = decode.FusedDecode(r, tile_bytes=tile, warps=warps, split=split, attention_warps=aw)
    name = f"tile{tile // 1024}k_w{warps}_aw{aw}_S{split}"
    why = decode.check(r, v)
    r.prefill(prompt)
    res["body"][name] = {"check": why or "ok"}
    graphs[name], _ = capture(lambda v=v: v(x, st))
raw = bench.interleaved({n: (lambda g=g: g.replay()) for n, g in graphs.items()}, 20, 200, dev)
for n, ms in raw.items():
    res["body"][n]["step"] = bench.stats(ms)
    print("%-28s p50 %.4f ms" % (n, res["body"][n]["step"]["p50_ms"]), res["body"][n]["check"], flush=True)
res["body_breakdown"] = bench.breakdown(lambda: r.decode(x, st), dev)
json.dump(res, open(f"{OUT}/step25b.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
