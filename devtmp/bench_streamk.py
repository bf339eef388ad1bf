"""Device-only: lib.models.w4a16 (split-K grid) against the stream-K variant (devtmp/w4a16_streamk.py) at the
Qwen3-32B decode shapes, 1 and 8 rows; 20 graphed calls over weight copies (>= 256 MB, so from HBM), the variants'
graphs replayed in alternating order. Prints µs a call (p50) and % of the copy bandwidth; writes $OUT/streamk.json.
Run from the repository root: python3 devtmp/bench_streamk.py"""
import json, math, os, sys
from pathlib import Path
import torch
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from lib.models.w4a16 import PackedInt4, pack_awq, dequantize, w4a16_matmul
import w4a16_streamk as SK

DEV, CALLS, REPS = torch.device("cuda"), 20, 30
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
SMS = torch.cuda.get_device_properties(DEV).multi_processor_count


def graph(fns):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for i in range(CALLS):
            fns[i % len(fns)]()
    return g


def time_graphs(graphs):
    ts = {k: [] for k in graphs}
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    for r in range(REPS):
        for k in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graphs[k].replay(); b.record(); b.synchronize()
            ts[k].append(a.elapsed_time(b) / CALLS * 1e3)
    return {k: sorted(v)[len(v) // 2] for k, v in ts.items()}


n = 2**30
a, b = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
copy_us = time_graphs({"c": graph([lambda: b.copy_(a)])})["c"]
bw = 2 * n / copy_us / 1e3                                                   # GB/s
del a, b
print(torch.cuda.get_device_name(DEV), "SMs", SMS, "copy GB/s %.0f" % bw, flush=True)
variants = {"splitk": lambda x, w: w4a16_matmul(x, w)}
for occ, mr in ((10, 48), (8, 64), (5, None)):
    variants[f"streamk_{occ}x{mr}"] = lambda x, w, occ=occ, mr=mr: SK.w4a16_streamk(x, w, programs=SMS * occ, maxnreg=mr)
res = {"device": torch.cuda.get_device_name(DEV), "copy_GBps": bw, "rows": []}
for name, (K, N) in SHAPES.items():
    qw = torch.randint(-2**31, 2**31, (K, N // 8), dtype=torch.int32, device=DEV)
    qz = torch.randint(-2**31, 2**31, (K // 128, N // 8), dtype=torch.int32, device=DEV)
    sc = (torch.rand(K // 128, N, device=DEV) * 0.01 + 0.002).half()
    w = pack_awq(qw, qz, sc); del qw, qz
    nbytes = w.words.numel() * 4 + w.zeros.numel() + w.scales.numel() * 2
    ws = [w] + [PackedInt4(*(t.clone() for t in w)) for _ in range(min(CALLS, math.ceil(256e6 / nbytes)) - 1)]
    ref_w = dequantize(w)
    for M in (1, 8):
        x = torch.randn(M, K, device=DEV, dtype=torch.float16)
        ref = x.float() @ ref_w
        errs = {k: float((f(x, w).float() - ref).norm() / ref.norm()) for k, f in variants.items()}
        inv = {k: bool(torch.equal(f(x, w)[:1], f(x[:1], w))) for k, f in variants.items()}
        t = time_graphs({k: graph([lambda v=v, f=f: f(x, v) for v in ws]) for k, f in variants.items()})
        floor = nbytes / bw / 1e3
        row = {"shape": name, "M": M, "floor_us": floor, "p50_us": t, "rel_err": errs, "row0_invariant": inv}
        res["rows"].append(row)
        print(name, M, "floor %.1f" % floor, " ".join(f"{k} {v:.1f} ({100 * floor / v:.0f}%)" for k, v in t.items()),
              "max err %.1e" % max(errs.values()), "inv", all(inv.values()), flush=True)
    del ws, w, ref_w
    torch.cuda.empty_cache()
Path(os.environ.get("OUT", "/tmp"), "streamk.json").write_text(json.dumps(res, indent=1))
