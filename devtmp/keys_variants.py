"""The batched FlashHead's centroid keys (launch 1) split over programs along the rows, and NB rows a dot, on one GPU
(h100 shapes): p50 of the graphed whole call at B = 1..64 for each variant, each checked equal to exact_fp32; then
the kernels of the default and the best at B = 64. python3 devtmp/keys_variants.py"""
import itertools, torch, triton
from lib import bench, modes
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.study import microbench as step
from lib.engine import flash_kernels as F, heads
print("triton", triton.__version__, "topk:", F.TOPK, torch.cuda.get_device_name(), flush=True)
P = step.setup("h100")
ensure_flash_checkpoint(P)
fh = engines.build_drafts(P, (modes.FLASH,))[modes.FLASH].head.head
W = fh.weight; dev = W.device
c2t = heads.extended_c2t(fh); cents = fh.centroids.contiguous()
g = torch.Generator(device=dev).manual_seed(0)
VARIANTS = {f"NB{nb}_rows{rp}_R{r}": dict(NB=nb, row_programs=rp, R=r)
            for nb, rp, r in itertools.product((16, 32, 64), (1, 0), (32, 64)) if not (rp == 0 and nb == 64 and r == 64)}
best = {}
for B in (1, 8, 16, 32, 64):
    h = (W[torch.randint(0, W.shape[0], (B,), device=dev, generator=g)] * 3).contiguous()
    want = heads.exact_fp32(fh, h)
    fns = {"dense": lambda: (h @ W.T).argmax(-1)}
    for name, kw in VARIANTS.items():
        assert torch.equal(F.flash_batch_triton(h, W, cents, c2t, fh.n_probes, **kw), want), (B, name)
        fns[name] = bench.capture(lambda kw=kw: F.flash_batch_triton(h, W, cents, c2t, fh.n_probes, **kw))[0].replay
    raw = bench.interleaved(fns, 5, 40, dev)
    p50 = {k: round(bench.stats(v)["p50_ms"] * 1000, 1) for k, v in raw.items()}
    best[B] = min((v, k) for k, v in p50.items() if k != "dense")
    print(B, p50, "us p50; best", best[B], flush=True)
for B in (8, 64):
    h = (W[torch.randint(0, W.shape[0], (B,), device=dev, generator=g)] * 3).contiguous()
    for name in ("NB16_rows1_R32", best[64][1]):
        kw = VARIANTS[name]
        bd = bench.breakdown(bench.capture(lambda: F.flash_batch_triton(h, W, cents, c2t, fh.n_probes, **kw))[0].replay, dev)
        print(B, name, [(r["kernel"][:28], round(r["us"], 1)) for r in bd["kernels"]], flush=True)
