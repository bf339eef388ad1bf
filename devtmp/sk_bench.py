"""Device (issue 26, twentieth session): stream-K W4A16 (devtmp/w4a16_sk.py) against the library kernel at the 32B
decode shapes, 1 and 8 rows: CUDA-graph replays of CALLS chained calls over weight copies (as the int4 table),
interleaved, per-call mean/p50; each variant checked (relative error against the dequantised weight, a row alone
equal to the same row in the 8-row call). Writes $OUT/sk_bench.json."""
import json, math, os, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from lib import bench
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, kernel_bytes
import w4a16_sk as S
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
CALLS, ITERS = 20, 40
VARIANTS = {"lib": None, "r80": 80, "r88": 88, "r96": 96, "skeq": "lib grid", "skeq88": "lib grid", "sk5r88": dict(per_sm=5, num_stages=3, maxnreg=88), "sk5r88s4": dict(per_sm=5, num_stages=4, maxnreg=88), "sk7s4": dict(per_sm=7, num_stages=4), "sk7s3": dict(per_sm=7, num_stages=3),
            "sk4s6": dict(per_sm=4, num_stages=6, maxnreg=128), "sk4s7": dict(per_sm=4, num_stages=7, maxnreg=128)}
pick = os.environ.get("VARIANTS")
if pick:
    VARIANTS = {k: v for k, v in VARIANTS.items() if k == "lib" or k in pick.split(",")}


def fn_of(label, x, w):
    if label.startswith("r"):                             # the library kernel, another register cap
        return lambda: W.w4a16_matmul(x, w, W.Tiles(maxnreg=int(label[1:])))
    if label.startswith("skeq"):                          # lib's decomposition: programs = lib's grid
        sms = 160 if x.shape[1] == 5120 and w.groups.shape[1] == 51200 else 128
        reg = int(label[4:] or 72)
        return lambda: S.w4a16_sk(x, w, per_sm=5, num_stages=3, sms=sms, maxnreg=reg)
    return (lambda: W.w4a16_matmul(x, w)) if VARIANTS[label] is None else (lambda: S.w4a16_sk(x, w, **VARIANTS[label]))


res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
    packs = [W.pack_awq(*random_awq(K, N, dev)) for _ in range(copies)]
    exact = None
    floor = kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3
    for rows in (1, 8):
        x = torch.randn(rows, K, device=dev, dtype=torch.float16)
        if exact is None:
            ref = W.dequantize(packs[0])
        exact = x.float() @ ref
        out = res["shapes"][f"{name}_{rows}"] = {"floor_us": floor}
        fns = {}
        for label in VARIANTS:
            y = fn_of(label, x, packs[0])()
            err = ((y.float() - exact).abs().max() / exact.abs().max()).item()
            alone = fn_of(label, x[rows - 1:].clone(), packs[0])()
            out[label] = {"rel_err": err, "row_alone_equal": bool(torch.equal(alone[0], y[rows - 1]))}
            g, _ = bench.capture(lambda label=label: [fn_of(label, x, packs[i % copies])() for i in range(CALLS)])
            fns[label] = g.replay
        times = bench.interleaved(fns, 5, ITERS, dev)
        for label, ms in times.items():
            st = bench.stats([m / CALLS for m in ms])
            out[label].update(mean_us=st["mean_ms"] * 1e3, p50_us=st["p50_ms"] * 1e3, p95_us=st["p95_ms"] * 1e3)
        print(name, rows, "floor %.2f" % floor, " | ".join(f"{l} {o['mean_us']:.2f} (p50 {o['p50_us']:.2f}) err {o['rel_err']:.1e} inv {o['row_alone_equal']}"
                                                      for l, o in out.items() if l != "floor_us"), flush=True)
json.dump(res, open(os.path.join(OUT, "sk_bench.json"), "w"), indent=1)
