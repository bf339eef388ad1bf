"""Device (thirty-sixth session, issue 26): devtmp/w4cu/w4a16.cu (mma.sync, weights straight into registers) against
lib/models/w4a16.py's Triton kernel at the 32B decode shapes, 1 and 8 rows, fp16 (and bf16 for one shape); each
checked against the dequantised reference and for row invariance (row r of an 8-row call = the row alone);
interleaved graphed calls over copies of the weights (past L2). Writes $OUT/mma_ab.json."""
import json, math, os, sys
sys.path.insert(0, "."); sys.path.insert(0, "devtmp/w4cu")
import torch
from lib import bench
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
import w4mma
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
VARIANTS = [(1, 8), (2, 8), (2, 4), (4, 8), (1, 4), (4, 4)]
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
print(res, flush=True)
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
    packs = [W.pack_awq(*awq) for _ in range(copies)]
    mma = [w4mma.pack(p) for p in packs]
    ref_w = W.dequantize(packs[0])
    out = res["shapes"][name] = {"floor_us": kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3}
    for rows in (1, 8):
        x = torch.randn(rows, K, device=dev, dtype=torch.float16)
        ref = x.float() @ ref_w
        fns = {"triton": (lambda x=x: [W.w4a16_matmul(x, packs[i % copies]) for i in range(CALLS)])}
        y = W.w4a16_matmul(x, packs[0]).float()
        out[f"triton/{rows}/rel_err"] = float((y - ref).norm() / ref.norm())
        for tn, warps in VARIANTS:
            if N % (16 * tn):
                continue
            label = f"mma_tn{tn}_w{warps}"
            y = w4mma.matmul(x, mma[0], tn, warps)
            out[f"{label}/{rows}/rel_err"] = float((y.float() - ref).norm() / ref.norm())
            if rows == 8:
                out[f"{label}/row_invariant"] = all(torch.equal(w4mma.matmul(x[r:r + 1], mma[0], tn, warps)[0], y[r])
                                                    for r in (0, 5, 7))
            fns[label] = (lambda x=x, tn=tn, warps=warps: [w4mma.matmul(x, mma[i % copies], tn, warps)
                                                            for i in range(CALLS)])
        graphs = {}
        for label, fn in fns.items():
            fn()
            g, _ = bench.capture(fn)
            graphs[label] = g.replay
        for label, ms in bench.interleaved(graphs, 3, 30, dev).items():
            st = bench.stats([m / CALLS for m in ms])
            out[f"{label}/{rows}"] = {"p50_us": 1000 * st["p50_ms"], "mean_us": 1000 * st["mean_ms"],
                                      "p95_us": 1000 * st["p95_ms"]}
        print(name, rows, "floor %.1f" % out["floor_us"], {l: round(out[f"{l}/{rows}"]["p50_us"], 1) for l in graphs},
              {k: ("%.1e" % v if isinstance(v, float) else v) for k, v in out.items() if k.endswith(("rel_err", "invariant")) and f"/{rows}/" in k or k.endswith("invariant")},
              flush=True)
    json.dump(res, open(f"{OUT}/mma_ab.json", "w"), indent=1)
    if name == "qkv":                                   # bf16 once
        xb = torch.randn(8, K, device=dev, dtype=torch.bfloat16)
        pb = W.pack_awq(awq[0], awq[1], awq[2].to(torch.bfloat16))
        rb = xb.float() @ W.dequantize(pb)
        yb = w4mma.matmul(xb, w4mma.pack(pb), 2, 8)
        out["bf16_rel_err"] = float((yb.float() - rb).norm() / rb.norm())
        print("bf16 rel err %.1e" % out["bf16_rel_err"], flush=True)
    del packs, mma, fns, graphs
    torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/mma_ab.json", "w"), indent=1)
