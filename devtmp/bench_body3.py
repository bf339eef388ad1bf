"""Device-only (issue 25, fourth pass, third call): launch settings around heads=1 (GEMV tile bytes and warps,
attention split and warps). Runner.chain, k=6, position 300 (and 100, 600 for the best), h100 draft. $OUT/body3.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode, kernels as K
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
L, k = 700, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, flush=True)
V = {"t8w1_s16": {}, "t4w1_s16": dict(tile_bytes=4096), "t16w1_s16": dict(tile_bytes=16384),
     "t8w2_s16": dict(warps=2), "t16w2_s16": dict(tile_bytes=16384, warps=2), "t8w1_s8": dict(split=8),
     "t4w1_s8": dict(tile_bytes=4096, split=8), "t8w1_s16a2": dict(attention_warps=2, split=32)}
bodies = {n: decode.FusedDecode(r, heads=1, **kw) for n, kw in V.items()}
res = {"device": bench.device_name(dev), "k": k, "variants": V, "block": {}}
for pos in (300, 100, 600):
    prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
    x = prompt[:, -1:]
    const = x.view(1).clone()
    r.prefill(prompt)
    # one pick per body: re-capture per body since the graph keys on id(pick)
    fns = {}
    for bname, v in bodies.items():
        if pos != 300 and bname not in ("t8w1_s16", "t4w1_s16", "t8w1_s8"):
            continue
        r.decode = v
        pick = (lambda c: (lambda hh: c))(const)
        r.warm_chain(pick, 1, k)
        fns[f"{bname}/p{pos}"] = (lambda pick=pick, x=x, pos=pos: r.chain(pick, x, pos, k))
    raw = bench.interleaved(fns, 20, 200, dev)
    for n, ms in raw.items():
        res["block"][n] = s = bench.stats(ms)
        print("%-20s per token p50 %.4f mean %.4f p95 %.4f" % (n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k),
              flush=True)
json.dump(res, open(f"{OUT}/body3.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
