"""Device (thirty-second session): the fp16 draft's attention 2x the bf16 one's at long caches: is it the kernel?
The h100 dense draft built in both dtypes (in the order given), one layer's attention kernel alone (64 launches a
call, eager, interleaved), and the K-token block, at a cache sized for 32,768 positions."""
import sys, time
sys.path.insert(0, ".")
from dataclasses import replace
import torch
from lib import bench, modes
from lib.study import common, microbench as M
from lib.models import build

P = common.setup("h100")
order = sys.argv[1:] or ["float16", "bfloat16"]
pos, k = 32768, P.decode.k
at = replace(P, decode=replace(P.decode, max_prompt_tokens=pos))
drafts = {dt: build.build_drafts(replace(at, dtype=dt), [modes.DENSE])[modes.DENSE] for dt in order}
x = torch.zeros((1, 1), dtype=torch.long, device="cuda")
start = torch.tensor(pos, device="cuda")
attn, block = {}, {}
for dt, d in drafts.items():
    r = d.runner
    print(dt, r.cache.k.dtype, r.cache.k.data_ptr() % (1 << 21), r.cache.k.is_contiguous(), flush=True)
    attn[dt] = lambda r=r: [r.decode._attention(r.layers[0].self_attn, r.cache.layer(0), start, 0) for _ in range(64)]
    block[dt] = M.instance_block(r, r.decode, d.head.head, x, pos, k)
for name, fns, per in (("attention x64", attn, 64), ("block/token", block, k)):
    raw = bench.interleaved(fns, 10, 40, x.device)
    print(name, "  ".join(f"{dt} mean {bench.stats(ms)['mean_ms'] / per:.4f} p50 {bench.stats(ms)['p50_ms'] / per:.4f}"
                          for dt, ms in raw.items()), flush=True)
