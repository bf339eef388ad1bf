"""Device (thirty-seventh session, issue 26): two leads for the mma W4A16 kernel, against the library's launch
(lib/models/w4a16_mma.cu at HEAD) at the 32B decode shapes, 1 / 4 / 8 rows, fp16, p50 of graphed calls over weight
copies past L2, interleaved.
  split: devtmp/w4cu3/split.cu, a cluster of S blocks a column tile splitting K, block 0 adding the others' sums
    through distributed shared memory in warp order (S x warps as one block's warps: bitwise the library's launch
    at S x warps warps). o and down have 320 column tiles for 132 SMs (2 or 3 blocks an SM).
  norm: devtmp/w4cu3/norm.cu, the RMSNorm before q/k/v and gate/up inside the kernel (x times the norm weight per
    K, the rows' sums of squares by a second mma, the output scaled by rsqrt(mean + eps)) against the Triton norm
    kernel followed by the library's kernel.
Writes $OUT/split_ab.json."""
import ctypes, json, math, os, sys
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.models import w4a16 as W, w4a16_mma as MM
from lib.engine.layer_kernels import rms_norm
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
V = ctypes.c_void_p
split_so = ctypes.CDLL("devtmp/w4cu3/split.so")
split_so.w4a16_mma_launch.argtypes = [V] * 5 + [ctypes.c_int] * 7 + [V, ctypes.c_int]
norm_so = ctypes.CDLL("devtmp/w4cu3/norm.so")
norm_so.w4a16_mma_launch.argtypes = [V] * 5 + [ctypes.c_int] * 7 + [V, V, ctypes.c_float]
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
EPS = 1e-6
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
print(res, flush=True)


def launch(so, x, w, *extra, warps=None):
    N = w.groups.shape[1]
    y = torch.empty(x.shape[0], N, dtype=x.dtype, device=dev)
    rc = so.w4a16_mma_launch(x.data_ptr(), w.words.data_ptr(), w.groups.data_ptr(), None, y.data_ptr(), x.shape[0],
                             N, x.shape[1], x.stride(0), warps or MM.warps_for(N), 0, 1,
                             torch.cuda.current_stream().cuda_stream, *extra)
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
    ref_w = MM.dequantize(ws[0]).float() if hasattr(MM, "dequantize") else None
    out = res["shapes"][name] = {"floor_us": kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3}
    wd = MM.warps_for(N)
    nw = (1 + 0.1 * torch.randn(K, device=dev)).half()
    for rows in (1, 4, 8):
        x = torch.randn(rows, K, device=dev, dtype=torch.float16)
        y0 = MM.mma_matmul(x, ws[0])
        fns = {"lib": lambda x=x: [MM.mma_matmul(x, ws[i % copies]) for i in range(CALLS)]}
        for S, warps in ((2, 4), (2, 8), (4, 4), (1, wd)):
            label = f"split{S}_w{warps}"
            y = launch(split_so, x, ws[0], S, warps=warps)
            out[f"{label}/{rows}/equal"] = bool(torch.equal(y, y0))
            out[f"{label}/{rows}/rel_diff"] = float((y.float() - y0.float()).norm() / y0.float().norm())
            fns[label] = lambda x=x, S=S, warps=warps: [launch(split_so, x, ws[i % copies], S, warps=warps)
                                                        for i in range(CALLS)]
        if name in ("qkv", "gate_up"):
            y = launch(norm_so, x, ws[0], nw.data_ptr(), EPS)
            xf = x.float()
            h = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).half().float() * nw.float()).half()
            ysep = MM.mma_matmul(h, ws[0])
            if ref_w is not None:
                ref = h.float() @ ref_w
                out[f"norm/{rows}/rel_err"] = float((y.float() - ref).norm() / ref.norm())
                out[f"sep/{rows}/rel_err"] = float((ysep.float() - ref).norm() / ref.norm())
            out[f"norm/{rows}/rel_diff_sep"] = float((y.float() - ysep.float()).norm() / ysep.float().norm())
            fns["norm"] = lambda x=x: [launch(norm_so, x, ws[i % copies], nw.data_ptr(), EPS) for i in range(CALLS)]
            fns["sep"] = lambda x=x: [MM.mma_matmul(rms_norm(x, nw, EPS)[0], ws[i % copies]) for i in range(CALLS)]
        graphs = {}
        for label, fn in fns.items():
            fn()
            g, _ = bench.capture(fn)
            graphs[label] = g.replay
        for label, ms in bench.interleaved(graphs, 3, 30, dev).items():
            out[f"{label}/{rows}"] = 1000 * bench.stats([m / CALLS for m in ms])["p50_ms"]
        print(name, rows, "floor %.1f" % out["floor_us"], {l: round(out[f"{l}/{rows}"], 2) for l in graphs},
              {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items() if k.count("/") == 2
               and f"/{rows}/" in k}, flush=True)
    del ws, graphs, fns
    torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/split_ab.json", "w"), indent=1)
