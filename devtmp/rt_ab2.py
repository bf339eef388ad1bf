"""Device (thirty-seventh session, issue 26): the mma W4A16 kernel with two row tiles a block past 8 rows (the
working tree's lib/models/w4a16_mma.cu: the weights read once for 9-16 rows) against HEAD's (devtmp/w4cu3/head.cu,
one row tile a block); second call: also the two-tile launch at 4 warps for every shape (rt_w4). Kernel: the 32B decode shapes at 1, 2, 4, 8, 16 rows, fp16, outputs compared bitwise
(also 20 rows and bf16 at one shape), p50 of graphed calls over weight copies past L2, interleaved. Step: h100awq's
target loaded twice, graphs captured with each build, 1 and K + 1 tokens interleaved at the prompt's end and at 300
positions, tokens compared. Writes $OUT/rt_ab2.json."""
import json, math, os, sys, time
sys.path.insert(0, ".")
import torch
from pathlib import Path
from lib import bench
from lib.models import w4a16 as W, w4a16_mma as MM
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
OUT, dev, t0 = os.environ.get("OUT", "/tmp"), torch.device("cuda"), time.time()
LIBS = {}
for label, src in (("head", Path("devtmp/w4cu3/head.cu")), ("rt", MM.SOURCE)):
    MM.SOURCE = src
    MM._library.cache_clear()
    LIBS[label] = MM._library()
ORIGINAL = MM._library
LIBS["rt_w4"] = LIBS["rt"]
WARPS = MM.warps_for


def use(label):
    MM._library = lambda: LIBS[label]
    MM.warps_for = (lambda N: 4) if label == "rt_w4" else WARPS


SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
print(res, flush=True)
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
    ws = []
    for _ in range(copies):
        p = W.pack_awq(*awq)
        ws.append(MM.pack(W.codes(p), p.groups))
        del p
    out = res["shapes"][name] = {"floor_us": kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3}
    extra = []
    for rows, dt in [(r, torch.float16) for r in (8, 9, 12, 16)] + extra:
        x = torch.randn(rows, K, device=dev, dtype=dt)
        ys = {}
        for label in LIBS:
            use(label)
            ys[label] = MM.mma_matmul(x, ws[0])
        out[f"{rows}/{dt}/equal"] = bool(torch.equal(ys["head"], ys["rt"]))
        out[f"{rows}/{dt}/w4_rel"] = float((ys["rt_w4"].float() - ys["rt"].float()).norm() / ys["rt"].float().norm())
        if dt != torch.float16 or rows == 20:
            print(name, rows, dt, "equal", out[f"{rows}/{dt}/equal"], flush=True)
            continue
        graphs = {}
        for label in LIBS:
            use(label)
            fn = lambda x=x: [MM.mma_matmul(x, ws[i % copies]) for i in range(CALLS)]
            fn()
            g, _ = bench.capture(fn)
            graphs[label] = g.replay
        for label, ms in bench.interleaved(graphs, 3, 30, dev).items():
            out[f"{label}/{rows}"] = 1000 * bench.stats([m / CALLS for m in ms])["p50_ms"]
        print(name, rows, "floor %.1f" % out["floor_us"], {l: round(out[f"{l}/{rows}"], 2) for l in graphs},
              "equal", out[f"{rows}/{dt}/equal"], flush=True)
    del ws, graphs
    torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/rt_ab2.json", "w"), indent=1)
MM._library = ORIGINAL
