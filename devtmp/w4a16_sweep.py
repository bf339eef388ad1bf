"""Device (issue 26): lib/models/w4a16.py's launch settings per 32B decode shape on this card, 8 rows (the padded
target's calls): block_n x warps x stages x split-K, each exact against the default's output to fp32 rounding;
p50 of a graphed cycle over copies of the weights (L2 cold). Writes $OUT/w4a16_sweep.json."""
import json, math, os, sys, time
import torch
sys.path.insert(0, ".")
from lib import bench
from lib.models import w4a16
from lib.study.int4_kernels import random_awq, int4_bytes, graphed, CALLS
OUT, dev, t0 = os.environ.get("OUT", "/tmp"), torch.device("cuda"), time.time()
SHAPES = {"down": (25600, 5120), "o": (8192, 5120), "qkv": (5120, 10240), "gate_up": (5120, 51200)}
bw = bench.copy_bandwidth(dev)
res = {"device": bench.device_name(dev), "copy_GBps": bw / 1e9 if bw > 1e6 else bw, "shapes": {}}
print(res, flush=True)
limit = float(sys.argv[1]) if len(sys.argv) > 1 else 400
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    x = torch.randn(8, K, device=dev, dtype=torch.float16)
    packed = w4a16.pack_awq(*awq)
    ref = w4a16.w4a16_matmul(x, packed).float()
    nbytes = int4_bytes(K, N)
    copies = max(1, min(CALLS, math.ceil(256e6 / nbytes)))
    rows = res["shapes"][name] = {"K": K, "N": N, "bytes": nbytes, "default_split": w4a16.split_plan(K, N, w4a16.Tiles())[0], "us": {}}
    blocks = K // 128
    for bn in (64, 128):
        for warps in (4, 8):
            for stages in (3, 4):
                for split in [None] + sorted({1, 2, 4, 8, 16} - ({1} if N // bn < 132 else set())):
                    if time.time() - t0 > limit:
                        break
                    t = w4a16.Tiles(bn, split, warps, stages)
                    try:
                        y = w4a16.w4a16_matmul(x, packed, t).float()
                    except Exception as e:            # out of shared memory / registers
                        rows["us"][f"{bn}/{warps}/{stages}/{split}"] = str(e)[:80]; continue
                    err = float((y - ref).norm() / ref.norm())
                    packs = [w4a16.pack_awq(*awq) for _ in range(copies)]
                    calls = [lambda p=p: w4a16.w4a16_matmul(x, p, t) for p in packs]
                    g, _ = __import__("lib.engine.runner", fromlist=["capture"]).capture(lambda: [calls[i % copies]() for i in range(CALLS)])
                    ms = bench.stats([m / CALLS for m in bench.time_calls(g.replay, 3, 15, dev)])["p50_ms"]
                    rows["us"][f"{bn}/{warps}/{stages}/{split}"] = [1000 * ms, err]
                    del packs, calls, g
    ok = {k: v for k, v in rows["us"].items() if isinstance(v, list)}
    best = sorted(ok.items(), key=lambda kv: kv[1][0])[:5]
    floor = nbytes / (res["copy_GBps"] * 1e9) * 1e6
    print(name, "floor %.1f us" % floor, "default", ["%.1f" % ok[k][0] for k in ok if k.startswith("64/4/3/None")],
          "best", [(k, "%.1f" % v[0], "%.0f%%" % (100 * floor / v[0]), "%.1e" % v[1]) for k, v in best], round(time.time() - t0), flush=True)
    json.dump(res, open(f"{OUT}/w4a16_sweep.json", "w"), indent=1)
    torch.cuda.empty_cache()
