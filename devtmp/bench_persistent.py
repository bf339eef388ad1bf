"""Device-only: the fused draft step, chained kernels vs the persistent kernel at several grids (h100 profile's
0.6B-shaped synthetic draft, bf16), bitwise equality to the chained step, graphed CUDA-event timings (interleaved).
Writes $OUT/persistent.json. Usage: python3 devtmp/bench_persistent.py [per_sm,warps ...]"""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.engine.runner import Runner, Acceleration, capture
from lib.engine import decode

out = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
grids = [tuple(map(int, a.split(","))) for a in sys.argv[1:]]          # per_sm,warps,slots,poll,sleep,split,maxnreg
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
L, pos = 340, 300
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, r.decode.checked, r.decode.compiled, flush=True)
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
r.prefill(prompt)
x, st = prompt[:, -1:], torch.tensor(pos, device=dev)
variants = {"chained": decode.FusedDecode(r, persistent=False), "chained_S16": decode.FusedDecode(r, persistent=False, split=16)}
for per_sm, warps, slots, poll, sleep, split, maxnreg in grids:
    t0 = time.time()
    v = decode.FusedDecode(r, warps=warps, per_sm=per_sm, sync=(slots, poll, sleep), split=split, maxnreg=maxnreg or None)
    name = f"persistent_{per_sm}x{warps}w_s{slots}p{poll}z{sleep}_S{split}_r{maxnreg}"
    variants[name] = v
    print(name, v.layout, v.compiled, "compile+grid s", round(time.time() - t0, 1), flush=True)
ref = {32: variants["chained"](x, st).clone(), 16: variants["chained_S16"](x, st).clone()}
res = {"device": bench.device_name(dev), "variants": {}}
for name, v in variants.items():
    t0 = time.time()
    got = v(x, st)
    torch.cuda.synchronize()
    res["variants"][name] = {"layout": v.layout, "compiled": v.compiled, "equal_to_chained": bool(torch.equal(got, ref[v.split])),
                             "first_call_s": time.time() - t0}
    print(name, "equal", torch.equal(got, ref[v.split]), "first call s", round(time.time() - t0, 2), flush=True)
body = sum(p.numel() * p.element_size() for layer in r.layers for p in layer.parameters())
bw = bench.copy_bandwidth(dev)
res.update(bandwidth_GBps=bw / 1e9, body_bytes=body, floor_ms=1000 * body / bw)
graphs = {}
for name, v in variants.items():
    g, _ = capture(lambda v=v: v(x, st))
    graphs[name] = g
raw = bench.interleaved({k: (lambda g=g: g.replay()) for k, g in graphs.items()}, 30, 300, dev)
for k, ms in raw.items():
    res["variants"][k]["step"] = bench.stats(ms)
    print(k, "p50 %.4f ms mean %.4f p95 %.4f" % (res["variants"][k]["step"]["p50_ms"], res["variants"][k]["step"]["mean_ms"],
          res["variants"][k]["step"]["p95_ms"]), "floor %.4f" % res["floor_ms"], flush=True)
json.dump(res, open(f"{out}/persistent.json", "w"), indent=1)
