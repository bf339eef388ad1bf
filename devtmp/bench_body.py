"""Device-only (issue 25, fourth pass): the fused body waiting on done counters (decode.COUNTERS) against waiting on
grids, with ablations that bound what is left: no weight reads (the dependency chain alone) and no waits (weight
streaming alone). Runner.chain, k=6, position 300, h100 draft. Also the critical-path (exposed) breakdown of one
step. Writes $OUT/body.json."""
import importlib, json, os, re, sys, time
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


def variant(name, subs):
    """decode.py with text substitutions, as its own module (devtmp/_decode_<name>.py)."""
    src = open("lib/engine/decode.py").read().replace("from .kernels import", "from lib.engine.kernels import")
    for a, b in subs:
        assert a in src, (name, a)
        src = src.replace(a, b)
    open(f"devtmp/_decode_{name}.py", "w").write(src)
    sys.path.insert(0, "devtmp")
    return importlib.import_module(f"_decode_{name}")


NOWEIGHTS = [("mask=ok, other=0.0)", "mask=ok & (rows < 0)[:, None], other=0.0)")]
NOWAIT = [("    if FLAGS and prev_n > 0:\n", "    if False:\n"), ("    else:\n        _wait(PDL)\n", "    else:\n        pass\n")]
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
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "block": {}, "checks": {}, "equal": {}, "breakdown": {}}
bodies = {"counters": decode.FusedDecode(r), "grid": decode.FusedDecode(r, counters=False),
          "noweights": variant("noweights", NOWEIGHTS).FusedDecode(r),
          "nowait": variant("nowait", NOWAIT).FusedDecode(r),
          "grid_noweights": variant("noweights", NOWEIGHTS).FusedDecode(r, counters=False)}
heads = {"none": lambda h: const,
         "dense": lambda h: K.dense_greedy_triton(h.contiguous(), W),
         "flash": lambda h: F.flash_greedy_triton(h.contiguous(), W, cents, c2t_ext, 16)}
r.prefill(prompt)
st = torch.tensor(pos, device=dev)
outs = {n: b(x, st).clone() for n, b in bodies.items()}
res["equal"] = {n: bool(torch.equal(outs[n], outs["grid"])) for n in outs}
res["checks"]["counters"] = decode.check(r, bodies["counters"]) or "ok"
res["checked"] = bodies["counters"].checked
print("equal to grid", res["equal"], "check", res["checks"], flush=True)
fns = {}
r.prefill(prompt)
for bname, v in bodies.items():
    r.decode = v
    for hname, h in heads.items():
        if bname not in ("counters", "grid") and hname != "none":
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
for bname in ("counters", "grid"):
    r.decode = bodies[bname]
    for hname in ("dense", "flash"):
        pick = lambda hh, h=heads[hname]: h(hh)
        bd = bench.breakdown(lambda: r.chain(pick, x, pos, k), dev, iters=10)
        res["breakdown"][f"{bname}/{hname}"] = bd
        print(bname, hname, "kernel us/block %.0f exposed %.0f" % (bd["total_us"], bd["exposed_us"]),
              {kk: round(vv / k, 1) for kk, vv in bd["exposed_by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/body.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
