"""Notebook 02's batch study: the draft's heads past one hidden state (batched serving, which the thesis and the
FlashHead paper leave to future work). B sequences' draft states share a head's weight reads: the dense head reads
the whole vocabulary once whatever B, FlashHead the centroids and then the token rows of the union of the clusters
its B rows probe. How fast that union grows is a property of the hidden states, so it is measured on the draft's
own states along the greedy trajectories of the profile's prompts (real text where the weights are real; on the
synthetic profiles the states, and so the union, are artificial), over random batches of those states, beside what
rows that each probe p uniform random clusters independently would touch. Both heads' batched paths (the dense
head: one GEMM and an argmax; FlashHead.batched: on a GPU its batched Triton kernel, on a CPU union_select, one GEMM
over the union) are timed at each B on the first batch drawn, and the bytes each must read are given beside them:
their ratio bounds what FlashHead can gain over the dense head where both are bound by reading weights. On a GPU
each call is a CUDA-graph replay (bench.cuda_graphs) where the batched Triton kernel runs (head_kernel: triton).
Writes head_batches.json."""
from __future__ import annotations

import torch

from .. import bench, modes
from ..config import Profile
from ..engine.heads import DenseHead
from ..progress import steps
from ..results import save_json
from .common import trajectory_states

DRAWS = 32                      # random batches of states a batch size's union share is averaged over


def head_batch_study(profile: Profile, drafts: dict) -> dict:
    """The union of probed clusters, both heads' batched times and their bytes at each of bench.head_batches
    (those no larger than the number of trajectory states); `drafts`: step_drafts(profile)[0]."""
    fh, W = drafts[modes.FLASH].head.head, drafts[modes.DENSE].head.head.weight
    H, _ = trajectory_states(profile, fh)
    g = torch.Generator().manual_seed(profile.seed)
    sizes = [B for B in profile.bench.head_batches if B <= H.shape[0]]
    rows = [batch_row(profile, fh, DenseHead(W, "torch"), H, B, g) for B in steps(sizes, "head batches", "sizes")]
    c, b = fh.c2t.shape
    result = {"device": bench.device_name(W.device), "synthetic": profile.models.source == "synthetic",
              "n_states": int(H.shape[0]), "n_probes": fh.n_probes, "n_clusters": c, "cluster_size": b,
              "n_special": int(fh.special.numel()), "vocab": int(W.shape[0]), "hidden": int(W.shape[1]),
              "dtype": str(W.dtype).removeprefix("torch."), "draws": DRAWS, "flash_path": fh.batched_ran,
              "skipped": sorted(set(profile.bench.head_batches) - set(sizes)), "rows": rows}
    if W.is_cuda:                                                 # each timed call's floor: its bytes at the
        bw = bench.copy_bandwidth(W.device)                       # measured copy bandwidth (FlashHead's: the union
        result["copy_GBps"] = bw / 1e9                            # of the batch it was timed on)
        for r in rows:
            r.update(dense_floor_ms=1000 * r["dense_bytes"] / bw, flash_floor_ms=1000 * r["timed_flash_bytes"] / bw)
    save_json(profile, "head_batches.json", result)
    return result


def batch_row(profile: Profile, fh, dense: DenseHead, H: torch.Tensor, B: int, g: torch.Generator) -> dict:
    """One batch size: the union's share of the clusters over DRAWS random batches of B distinct states, and both
    heads timed (interleaved) on the first of them."""
    draws = [torch.randperm(H.shape[0], generator=g)[:B].to(H.device) for _ in range(DRAWS)]
    shares = torch.tensor([float(fh.probed(H[i]).any(0).float().mean()) for i in draws])
    h, bq = H[draws[0]].contiguous(), profile.bench
    fns = {"dense": lambda: dense(h), "flash": lambda: fh.batched(h)}
    if h.is_cuda and bq.cuda_graphs and fh.batched_ran == "triton":             # GPU time, not launch time
        with bench.on(h.device):
            fns = {name: bench.capture(fn)[0].replay for name, fn in fns.items()}
    raw = bench.interleaved(fns, max(2, bq.warmup // 2), max(10, bq.iters // 5), H.device)
    times = {name: bench.stats(ms) for name, ms in raw.items()}
    c, b = fh.c2t.shape
    share = float(shares.mean())
    size, d = fh.weight.element_size(), fh.weight.shape[1]
    dense_bytes = fh.weight.shape[0] * d * size
    flash_bytes = lambda s: (c + s * c * b + fh.special.numel()) * d * size    # centroids, then the union's rows
    return {"batch": B, "union_share": share, "union_share_p5": float(shares.quantile(0.05)),
            "timed_union_share": float(shares[0]), "timed_flash_bytes": flash_bytes(float(shares[0])),
            "union_share_p95": float(shares.quantile(0.95)), "uniform_share": 1 - (1 - fh.n_probes / c) ** B,
            "dense": times["dense"], "flash": times["flash"],
            "speedup": times["dense"]["mean_ms"] / times["flash"]["mean_ms"],
            "dense_bytes": dense_bytes, "flash_bytes": flash_bytes(share),
            "bytes_ratio": dense_bytes / flash_bytes(share)}
