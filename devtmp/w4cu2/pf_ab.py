"""Device (thirty-sixth session): the library's mma W4A16 kernel against the same with the weights of a group PF
groups ahead asked into L2 (prefetch.global.L2), and with the other warp count, at the 32B decode shapes, 1 and 8
rows, fp16; p50 of graphed calls over weight copies past L2, interleaved. Writes $OUT/pf_ab.json."""
import ctypes, json, math, os, sys
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.models import w4a16 as W, w4a16_mma as MM
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
so = ctypes.CDLL("devtmp/w4cu2/w4a16.so")
so.w4a16_mma_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_void_p, ctypes.c_int]
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}


def var(x, w, pf, warps):
    y = torch.empty(x.shape[0], w.groups.shape[1], dtype=x.dtype, device=dev)
    rc = so.w4a16_mma_launch(x.data_ptr(), w.words.data_ptr(), w.groups.data_ptr(), None, y.data_ptr(), x.shape[0],
                             w.groups.shape[1], x.shape[1], x.stride(0), warps, 0, 1,
                             torch.cuda.current_stream().cuda_stream, pf)
    assert rc == 0, rc
    return y


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
    wd = MM.warps_for(N)
    for rows in (1, 8):
        x = torch.randn(rows, K, device=dev, dtype=torch.float16)
        y0 = MM.mma_matmul(x, ws[0])
        fns = {"lib": lambda x=x: [MM.mma_matmul(x, ws[i % copies]) for i in range(CALLS)]}
        for pf, warps in ((0, 12 - wd), (1, wd), (2, wd)):
            label = f"pf{pf}_w{warps}"
            out[f"{label}/equal"] = bool(torch.equal(var(x, ws[0], pf, warps), y0)) if warps == wd else None
            fns[label] = lambda x=x, pf=pf, warps=warps: [var(x, ws[i % copies], pf, warps) for i in range(CALLS)]
        graphs = {}
        for label, fn in fns.items():
            fn()
            g, _ = bench.capture(fn)
            graphs[label] = g.replay
        for label, ms in bench.interleaved(graphs, 3, 30, dev).items():
            out[f"{label}/{rows}"] = 1000 * bench.stats([m / CALLS for m in ms])["p50_ms"]
        print(name, rows, "floor %.1f" % out["floor_us"], {l: round(out[f"{l}/{rows}"], 1) for l in graphs},
              {k: v for k, v in out.items() if k.endswith("equal")}, flush=True)
    del ws, graphs, fns
    torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/pf_ab.json", "w"), indent=1)
