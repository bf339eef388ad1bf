"""Device (issue 26, sixteenth session): each 32B projection shape, 8 rows, graphed (bench CALLS calls a replay over
4 weight copies), plain W4A16 calls against the split-norm variants: o and down with the residual, plain vs
beginning the norm (RMS_OUT); q/k/v and gate/up plain vs finishing it (RMS_IN). Interleaved. $OUT/fold_shapes.json"""
import json, os, sys
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.models.w4a16 import pack_awq, w4a16_matmul, w4a16_matmul_norm, DEFAULT_TILES
from lib.study.int4_kernels import random_awq, CALLS
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
M = 8
fns = {}
for name, (K, N) in SHAPES.items():
    ws = [pack_awq(*random_awq(K, N, dev)) for _ in range(4)]
    x = torch.randn(M, K, device=dev, dtype=torch.float16)
    if name in ("o", "down"):
        res, gamma = torch.randn(M, N, device=dev, dtype=torch.float16), torch.rand(N, device=dev).half() + 0.5
        plain = lambda ws=ws, x=x, res=res: [w4a16_matmul(x, ws[i % 4], residual=res) for i in range(CALLS)]
        fold = lambda ws=ws, x=x, res=res, g=gamma: [w4a16_matmul_norm(x, ws[i % 4], res, g) for i in range(CALLS)]
    else:
        sq = torch.rand(M, 80, device=dev) * 10
        plain = lambda ws=ws, x=x: [w4a16_matmul(x, ws[i % 4]) for i in range(CALLS)]
        fold = lambda ws=ws, x=x, sq=sq: [w4a16_matmul(x, ws[i % 4], rms=(sq, 1e-6)) for i in range(CALLS)]
    for v, f in (("plain", plain), ("fold", fold)):
        g, _ = bench.capture(f)
        fns[f"{name}_{v}"] = g.replay
raw = bench.interleaved(fns, 5, 40, dev)
res = {"device": bench.device_name(dev), "rows": M, "calls_a_replay": CALLS,
       "us_a_call": {n: {k: v * 1000 / CALLS for k, v in bench.stats(ms).items() if k.endswith("_ms")} for n, ms in raw.items()}}
for n, s in res["us_a_call"].items():
    print("%-14s p50 %.2f us mean %.2f p95 %.2f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
json.dump(res, open(f"{OUT}/fold_shapes.json", "w"), indent=1)
