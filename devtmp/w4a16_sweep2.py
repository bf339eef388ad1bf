"""Device (issue 26, eighth session): the one-dot W4A16 kernel's launch settings per 32B decode shape, 8 rows:
block_n x warps x stages x split-K, each exact against the default's output; all configurations of a shape
interleaved (p50 of graphed cycles over copies of the weights, L2 cold). Writes $OUT/w4a16_sweep2.json."""
import json, math, os, sys, time
import torch
sys.path.insert(0, ".")
from lib import bench
from lib.models import w4a16
from lib.study.int4_kernels import random_awq, int4_bytes, CALLS
OUT, dev, t0 = os.environ.get("OUT", "/tmp"), torch.device("cuda"), time.time()
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
bw = bench.copy_bandwidth(dev)
res = {"device": bench.device_name(dev), "copy_GBps": bw / 1e9, "shapes": {}}
print(res, flush=True)
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    x = torch.randn(8, K, device=dev, dtype=torch.float16)
    packed = w4a16.pack_awq(*awq)
    ref = w4a16.w4a16_matmul(x, packed).float()
    nbytes = int4_bytes(K, N)
    copies = max(1, min(CALLS, math.ceil(256e6 / nbytes)))
    packs = [w4a16.pack_awq(*awq) for _ in range(copies)]
    d = w4a16.split_plan(K, N, w4a16.Tiles())[0]
    out = res["shapes"][name] = {"floor_us": nbytes / bw * 1e6, "default_split": d, "us": {}}
    fns = {}
    for bn, warps, stages, split in [(64, 4, 3, None), (64, 4, 2, None), (64, 4, 4, None), (64, 4, 3, max(1, d // 2)),
                                     (64, 4, 3, min(16, 2 * d)), (128, 4, 3, None), (128, 8, 3, None),
                                     (128, 4, 2, None), (64, 4, 3, 1 if N >= 8192 else d)]:
        t = w4a16.Tiles(bn, split, warps, stages)
        key = f"{bn}/{warps}/{stages}/{split}"
        if key in fns:
            continue
        try:
            err = float((w4a16.w4a16_matmul(x, packed, t).float() - ref).norm() / ref.norm())
            g, _ = bench.capture(lambda t=t: [w4a16.w4a16_matmul(x, packs[i % copies], t) for i in range(CALLS)])
        except Exception as e:
            out["us"][key] = str(e)[:80]; continue
        fns[key], out["us"][key] = g.replay, {"rel_err": err}
    for key, ms in bench.interleaved(fns, 3, 20, dev).items():
        st = bench.stats([m / CALLS for m in ms])
        out["us"][key].update(p50=1000 * st["p50_ms"], p95=1000 * st["p95_ms"])
    print(name, "floor %.1f" % out["floor_us"], {k: (round(v["p50"], 1), "%.0e" % v["rel_err"]) for k, v in out["us"].items() if isinstance(v, dict)},
          round(time.time() - t0), flush=True)
    json.dump(res, open(f"{OUT}/w4a16_sweep2.json", "w"), indent=1)
    del packs, fns
    torch.cuda.empty_cache()
