"""Device-only (issue 25, fourth pass, second call): attention programs of one query head (heads=1) and 2 warps, the
residual and norm weights read earlier, against the kernels of 70f6632 ('old'); the no-weights ablation of each.
Runner.chain, k=6, position 300, h100 draft; exposed breakdown of the best. Writes $OUT/body2.json."""
import importlib, json, os, subprocess, sys, time
import torch
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "devtmp"))
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode, kernels as K, flash_kernels as F, heads as HD
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()


def variant(name, src, subs=()):
    src = src.replace("from .kernels import", "from lib.engine.kernels import")
    for a, b in subs:
        assert a in src, (name, a)
        src = src.replace(a, b)
    open(f"devtmp/_decode_{name}.py", "w").write(src)
    return importlib.import_module(f"_decode_{name}")


NOWEIGHTS = [("mask=ok, other=0.0)", "mask=ok & (rows < 0)[:, None], other=0.0)")]
new_src = open("lib/engine/decode.py").read()
old_src = open("devtmp/decode_70f6632.py").read()
old, old_nw, new_nw = variant("old", old_src), variant("old_nw", old_src, NOWEIGHTS), variant("new_nw", new_src, NOWEIGHTS)
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
head = HD.FlashHead(W, cents, assign, 16, kernel="triton")
c2t_ext = torch.cat([head.c2t, torch.full((1, 16), -1, device=dev)]).contiguous()
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, r.decode.checked, flush=True)
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
x = prompt[:, -1:]
const = x.view(1).clone()
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "block": {}, "equal": {}, "breakdown": {}, "checked": {}}
bodies = {"old": old.FusedDecode(r), "new": decode.FusedDecode(r), "new_h1": decode.FusedDecode(r, heads=1),
          "new_w2": decode.FusedDecode(r, attention_warps=2), "new_h1_w2": decode.FusedDecode(r, heads=1, attention_warps=2),
          "new_h1_s32w2": decode.FusedDecode(r, heads=1, split=32, attention_warps=2),
          "old_noweights": old_nw.FusedDecode(r), "new_noweights": new_nw.FusedDecode(r),
          "new_h1_noweights": new_nw.FusedDecode(r, heads=1)}
for n in ("new", "new_h1", "new_h1_w2"):
    res["checked"][n] = (decode.check(r, bodies[n]) or "ok", bodies[n].checked)
heads = {"none": lambda h: const,
         "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "flash": lambda h: F.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16)}
r.prefill(prompt)
st = torch.tensor(pos, device=dev)
outs = {n: b(x, st).clone() for n, b in bodies.items()}
res["equal"] = {n: bool(torch.equal(outs[n], outs["old"])) for n in outs}
print("equal to old", res["equal"], res["checked"], flush=True)
fns = {}
r.prefill(prompt)
for bname, v in bodies.items():
    r.decode = v
    for hname, h in heads.items():
        if bname not in ("old", "new", "new_h1") and hname != "none":
            continue
        pick = lambda hh, h=h: h(hh)
        r.warm_chain(pick, 1, k)
        fns[f"{bname}/{hname}"] = (lambda pick=pick: r.chain(pick, x, pos, k))
print("graphs", round(time.time() - t0, 1), flush=True)
raw = bench.interleaved(fns, 20, 200, dev)
for n, ms in raw.items():
    res["block"][n] = bench.stats(ms)
for n, v in res["block"].items():
    b = res["block"][n.split("/")[0] + "/none"]["p50_ms"]
    print("%-24s per token p50 %.4f mean %.4f p95 %.4f head adds %.1f us" % (
        n, v["p50_ms"] / k, v["mean_ms"] / k, v["p95_ms"] / k, 1000 * (v["p50_ms"] - b) / k), flush=True)
for bname in ("old", "new", "new_h1"):
    r.decode = bodies[bname]
    for hname in ("dense", "flash"):
        pick = lambda hh, h=heads[hname]: h(hh)
        bd = bench.breakdown(lambda: r.chain(pick, x, pos, k), dev, iters=10)
        res["breakdown"][f"{bname}/{hname}"] = bd
        print(bname, hname, "kernel us/block %.0f exposed %.0f" % (bd["total_us"], bd["exposed_us"]),
              {kk: round(vv / k, 1) for kk, vv in bd["exposed_by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/body2.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
