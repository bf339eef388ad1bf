"""Device (issue 26; seventh session: onedot, mma2, timed in the eighth; eighth session: pair, carried, prepared):
lib/models/w4a16.py's kernel against variants at the 32B decode shapes, 8 rows, default tiles, interleaved in one
process (p50 of graphed cycles over copies of the weights); each variant checked against the library's output.
VARIANTS=pair,carried (default) picks them: devtmp/w4a16_v2.py (two K-blocks an iteration; the scale on the weights
with the accumulator carried through the dot).
Writes $OUT/w4a16_variants.json. Usage: python3 devtmp/w4a16_variants.py [K N ...] (default: the four shapes)."""
import json, math, os, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from lib import bench
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, int4_bytes, CALLS
import w4a16_v2 as V
import w4a16_v3 as V3
import w4a16_old as OLD
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
ITERS = 30
if os.environ.get("DRYRUN"):            # TRITON_INTERPRET=1 DRYRUN=1 on a CPU: the script's logic on one tiny shape
    dev, SHAPES, ITERS = torch.device("cpu"), {"tiny": (256, 128)}, 1
    bench.capture = lambda fn: (type("Eager", (), {"replay": staticmethod(fn)})(), fn())


T64 = W.Tiles()
DEV_NOREG = bool(os.environ.get("DRYRUN"))           # the interpreter takes no maxnreg
R72 = W.Tiles(maxnreg=72)
ALL = {"lib": (W._w4a16_kernel, T64), "old": (OLD._w4a16_kernel, T64), "zsword": (V3._w4a16_kernel_zsword, T64), "zsword72": (V3._w4a16_kernel_zsword, R72), "lib72": (W._w4a16_kernel, R72), "pair": (V._w4a16_kernel_pair, T64), "carried": (V._w4a16_kernel_carried, T64)}
KERNELS = {k: ALL[k] for k in ["lib"] + os.environ.get("VARIANTS", "old,zsword,zsword72,lib72").split(",")}
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    x = torch.randn(8, K, device=dev, dtype=torch.float16)
    copies = max(1, min(CALLS, math.ceil(256e6 / int4_bytes(K, N))))
    packs = [W.pack_awq(*awq) for _ in range(copies)]
    fns = {}
    out = res["shapes"][name] = {"floor_us": int4_bytes(K, N) / res["copy_GBps"] / 1e3}
    for label, (kernel, tiles) in KERNELS.items():
        W._w4a16_kernel = kernel
        if DEV_NOREG and tiles.maxnreg:
            tiles = T64
        use = [V3.pack_zs(p) for p in packs] if label.startswith("zsword") else packs
        y = W.w4a16_matmul(x, use[0], tiles).float()
        if label == "lib":
            ref = y
        out[label] = {"rel_diff_to_lib": float((y - ref).norm() / ref.norm())}
        g, _ = bench.capture(lambda: [W.w4a16_matmul(x, use[i % copies], tiles) for i in range(CALLS)])
        fns[label] = g.replay
    W._w4a16_kernel = KERNELS["lib"][0]
    for label, ms in bench.interleaved(fns, 1 if ITERS == 1 else 3, ITERS, dev).items():
        st = bench.stats([m / CALLS for m in ms])
        out[label].update(p50_us=1000 * st["p50_ms"], mean_us=1000 * st["mean_ms"], p95_us=1000 * st["p95_ms"])
    print(name, {k: (round(v["p50_us"], 1), "%.1e" % v["rel_diff_to_lib"]) if isinstance(v, dict) else round(v, 1)
                 for k, v in out.items()}, flush=True)
    json.dump(res, open(f"{OUT}/w4a16_variants.json", "w"), indent=1)
    del packs, fns, use
    torch.cuda.empty_cache()
