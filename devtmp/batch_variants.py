"""The batched FlashHead's launch settings on one GPU (h100 shapes): p50 of the graphed call at B = 1, 8, 64 for
segment sizes and TOPK on/off: python3 devtmp/batch_variants.py"""
import itertools, torch, triton
from lib import bench, modes
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.study import microbench as step
from lib.engine import flash_kernels as F, heads
print("triton", triton.__version__, "topk:", F.TOPK, flush=True)
P = step.setup("h100")
ensure_flash_checkpoint(P)
fh = engines.build_drafts(P, (modes.FLASH,))[modes.FLASH].head.head
W = fh.weight; dev = W.device
c2t = heads.extended_c2t(fh); cents = fh.centroids.contiguous()
g = torch.Generator(device=dev).manual_seed(0)
for B in (1, 8, 64):
    h = (W[torch.randint(0, W.shape[0], (B,), device=dev, generator=g)] * 3).contiguous()
    want = heads.exact_fp32(fh, h)
    fns = {"dense": lambda: (h @ W.T).argmax(-1)}
    for seg, topk, R in itertools.product((256, 512, 1024), (True, False), (16, 32)):
        if topk and not hasattr(triton.language, "topk"):
            continue
        F.SEGMENT, F.TOPK = seg, topk
        assert torch.equal(F.flash_batch_triton(h, W, cents, c2t, fh.n_probes, R=R), want)
        fns[f"seg{seg}_topk{int(topk)}_R{R}"] = bench.capture(lambda s=seg, t=topk, r=R: (
            setattr(F, "SEGMENT", s), setattr(F, "TOPK", t), F.flash_batch_triton(h, W, cents, c2t, fh.n_probes, R=r))[-1])[0].replay
    raw = bench.interleaved(fns, 5, 40, dev)
    print(B, {k: round(bench.stats(v)["p50_ms"] * 1000, 1) for k, v in raw.items()}, "us p50", flush=True)
F.SEGMENT, F.TOPK = 1024, hasattr(triton.language, "topk")
for B in (1, 64):
    h = (W[torch.randint(0, W.shape[0], (B,), device=dev, generator=g)] * 3).contiguous()
    bd = bench.breakdown(bench.capture(lambda: F.flash_batch_triton(h, W, cents, c2t, fh.n_probes))[0].replay, dev)
    print(B, [(r["kernel"][:30], round(r["us"], 1)) for r in bd["kernels"]], flush=True)
