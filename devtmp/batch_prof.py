"""Where the batched Triton FlashHead's time goes (h100 shapes, one GPU): torch profiler per kind at B = 1 and 64,
and variants of its first half timed alone (graphed): python3 devtmp/batch_prof.py"""
import torch, pandas as pd
from lib import bench, modes
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.study import microbench as step
from lib.engine import flash_kernels as F
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 90)
P = step.setup("h100")
ensure_flash_checkpoint(P)
fh = engines.build_drafts(P, (modes.FLASH,))[modes.FLASH].head.head
W = fh.weight; dev = W.device
cf = fh.centroids.float().contiguous(); cb = fh.centroids.contiguous()
g = torch.Generator(device=dev).manual_seed(0)
for B in (1, 64):
    h = W[torch.randint(0, W.shape[0], (B,), device=dev, generator=g)].contiguous() * 3
    fh.batched(h)
    fns = {"batched": lambda: fh.batched(h),
           "gemm_fp32": lambda: h.float() @ cf.T,
           "gemm_bf16": lambda: h @ cb.T,
           "topk_fp32": lambda: (h.float() @ cf.T).topk(fh.n_probes, dim=-1, sorted=False),
           "dense": lambda: (h @ W.T).argmax(-1)}
    graphs = {k: bench.capture(f)[0].replay for k, f in fns.items()}
    raw = bench.interleaved(graphs, 5, 50, dev)
    print(B, {k: round(bench.stats(v)["p50_ms"] * 1000, 1) for k, v in raw.items()}, "us p50", flush=True)
    bd = bench.breakdown(graphs["batched"], dev)
    print(pd.DataFrame(bd["kernels"]).head(10).to_string(), flush=True)
