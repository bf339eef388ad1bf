"""Device (issue 26, twelfth session): the target's layer attention (lib/engine/layer_kernels.cached_attention) at
the 32B heads (64 query heads, 8 KV heads, head_dim 128, fp16), cache of 334 positions (h100awq's), for 1 and 7 rows
at positions 40 and 300: splits x blocks x warps, each a CUDA graph of 16 calls, p50 of 30 replays per call.
The split must not depend on the row count (batch invariance), so one setting serves decode and verify."""
import itertools, json, os, statistics, sys
sys.path.insert(0, ".")
import torch
from lib.engine.layer_kernels import cached_attention
OUT = os.environ.get("OUT", "/tmp")
dev, dt = torch.device("cuda"), torch.float16
HQ, HKV, HD, L = 64, 8, 128, 334
g = torch.Generator(device=dev).manual_seed(0)
kc = torch.randn(1, HKV, L, HD, device=dev, dtype=dt, generator=g)
vc = torch.randn(1, HKV, L, HD, device=dev, dtype=dt, generator=g)
def time_cfg(n, p0, split, block, warps):
    q = torch.randn(1, HQ, n, HD, device=dev, dtype=dt, generator=g)
    pos = torch.arange(p0, p0 + n, device=dev)
    f = lambda: cached_attention(q, kc, vc, pos, split, block, warps)
    ref = f(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        for _ in range(16):
            out = f()
    ts = []
    for i in range(35):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); gr.replay(); b.record(); b.synchronize()
        if i >= 5:
            ts.append(a.elapsed_time(b) * 1000 / 16)
    return statistics.median(ts), ref
rows = []
base = {}
for split, block, warps in itertools.product((64, 128, 256), (32, 64, 128), (2, 4)):
    if block > split:
        continue
    r = {"split": split, "block": block, "warps": warps}
    for n, p0 in ((1, 40), (1, 300), (7, 40), (7, 300)):
        us, out = time_cfg(n, p0, split, block, warps)
        key = (n, p0)
        if key not in base:
            base[key] = out
        r[f"n{n}_p{p0}"] = round(us, 2)
        r[f"n{n}_p{p0}_maxdiff"] = float((out.float() - base[key].float()).abs().max())
    rows.append(r)
    print(r, flush=True)
json.dump(rows, open(f"{OUT}/attn_sweep.json", "w"), indent=1)
