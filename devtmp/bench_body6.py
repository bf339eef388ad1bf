"""Device-only (issue 25, fourth pass): the o-projection inside the attention's grid (decode.FUSE_O: its programs
read their weights and residual rows first, then wait on the count of combined query heads) against the o GEMV
as its own kernel. Runner.chain, k=6, positions 300 and 100, cache 340, h100 draft. Writes $OUT/body6.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode, kernels as K, flash_kernels as F, heads as HD
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
head = HD.FlashHead(W, cents, assign, 16, kernel="triton")
c2t_ext = torch.cat([head.c2t, torch.full((1, 16), -1, device=dev)]).contiguous()
L, k = 340, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, r.decode.checked, flush=True)
bodies = {"fuse_o": decode.FusedDecode(r, fuse_o=True), "apart": decode.FusedDecode(r, fuse_o=False)}
res = {"device": bench.device_name(dev), "k": k, "L": L, "block": {}, "equal": {}, "checked": {}}
for n, b in bodies.items():
    res["checked"][n] = (decode.check(r, b) or "ok", b.checked)
heads = {"none": None, "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "flash": lambda h: F.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16)}
for pos in (300, 100):
    prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
    x = prompt[:, -1:]
    const = x.view(1).clone()
    r.prefill(prompt)
    st = torch.tensor(pos, device=dev)
    outs = {n: b(x, st).clone() for n, b in bodies.items()}
    res["equal"][pos] = bool(torch.equal(outs["fuse_o"], outs["apart"]))
    r.prefill(prompt)
    fns = {}
    for bname, v in bodies.items():
        r.decode = v
        for hname, h in heads.items():
            pick = (lambda c: (lambda hh: c))(const) if h is None else (lambda hh, h=h: h(hh))
            r.warm_chain(pick, 1, k)
            fns[f"{bname}/{hname}/p{pos}"] = (lambda pick=pick, x=x, pos=pos: r.chain(pick, x, pos, k))
    raw = bench.interleaved(fns, 20, 200, dev)
    for n, ms in raw.items():
        res["block"][n] = s = bench.stats(ms)
        print("%-22s per token p50 %.4f mean %.4f p95 %.4f" % (n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k),
              flush=True)
print("equal", res["equal"], res["checked"], flush=True)
json.dump(res, open(f"{OUT}/body6.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
