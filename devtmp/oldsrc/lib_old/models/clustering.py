"""Equal-size spherical k-means of the output-embedding matrix, and FlashHead containment checks.

Objective (FlashHead paper): mean cosine of each embedding row to its cluster's normalised mean,
with every cluster holding exactly b = V / c tokens. Each iteration assigns under that capacity by
proposal rounds (tokens propose to their most similar centroid that still has room; an over-full
cluster keeps its most similar proposers; the rest move on to their next choice), then re-centres.
All steps are batched torch ops, so the same code clusters 151,936 x 9,496 on a GPU.
"""
from __future__ import annotations

import torch

from ..progress import steps


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def centroids_of(xn: torch.Tensor, assign: torch.Tensor, c: int) -> torch.Tensor:
    """Normalised cluster means (c,d) of unit rows xn (n,d)."""
    sums = torch.zeros(c, xn.shape[1], device=xn.device, dtype=xn.dtype).index_add_(0, assign, xn)
    return unit(sums)


def objective(x: torch.Tensor, assign: torch.Tensor, c: int) -> float:
    """Mean cosine of each row to its cluster's normalised mean."""
    xn = unit(x.float())
    return (xn * centroids_of(xn, assign, c)[assign]).sum(-1).mean().item()


def top_candidates(xn: torch.Tensor, cents: torch.Tensor, m: int, chunk: int = 16384):
    """The m most similar centroids of every row: (sims (n,m), ids (n,m)), best first."""
    sims, ids = [], []
    for i in range(0, xn.shape[0], chunk):
        s, j = (xn[i:i + chunk] @ cents.T).topk(min(m, cents.shape[0]), dim=1)
        sims.append(s)
        ids.append(j)
    return torch.cat(sims), torch.cat(ids)


def propose_rounds(sims: torch.Tensor, cand: torch.Tensor, free: torch.Tensor, assign: torch.Tensor,
                   rows: torch.Tensor) -> None:
    """Capacity-constrained greedy assignment of `rows` using their candidate lists (in place).

    Each round every unassigned row proposes to its best candidate with free room; each cluster
    accepts its most similar proposers up to its free room. Stops when no proposal is accepted.
    """
    while rows.numel():
        open_ = free[cand[rows]] > 0                                   # (r,m)
        has = open_.any(1)
        rows = rows[has]
        if not rows.numel():
            return
        first = open_[has].float().argmax(1)                           # best open candidate
        cl = cand[rows, first]
        s = sims[rows, first]
        order = torch.argsort(-s, stable=True)
        order = order[torch.argsort(cl[order], stable=True)]           # by cluster, most similar first
        cl_sorted = cl[order]
        counts = torch.bincount(cl_sorted, minlength=free.numel())
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(order.numel(), device=rows.device) - starts[cl_sorted]
        ok = rank < free[cl_sorted]
        won = order[ok]
        assign[rows[won]] = cl[won]
        free -= torch.bincount(cl[won], minlength=free.numel())
        rows = rows[assign[rows] < 0]


def balanced_assign(xn: torch.Tensor, cents: torch.Tensor, size: int, m: int) -> torch.Tensor:
    """Assign unit rows to centroids with exactly `size` rows per centroid."""
    n, c = xn.shape[0], cents.shape[0]
    assign = torch.full((n,), -1, dtype=torch.long, device=xn.device)
    free = torch.full((c,), size, dtype=torch.long, device=xn.device)
    sims, cand = top_candidates(xn, cents, m)
    propose_rounds(sims, cand, free, assign, torch.arange(n, device=xn.device))
    left = (assign < 0).nonzero().squeeze(1)
    if left.numel():                                                   # rows whose m candidates all filled up
        open_ids = (free > 0).nonzero().squeeze(1)
        s, j = top_candidates(xn[left], cents[open_ids], open_ids.numel())
        sub = torch.full((left.numel(),), -1, dtype=torch.long, device=xn.device)
        sub_free = free[open_ids].clone()
        propose_rounds(s, j, sub_free, sub, torch.arange(left.numel(), device=xn.device))
        assign[left] = open_ids[sub]
    return assign


def init_centroids(xn: torch.Tensor, c: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return xn[torch.randperm(xn.shape[0], generator=g)[:c].to(xn.device)].clone()


def spherical_kmeans(x: torch.Tensor, c: int, iters: int, seed: int = 0, equal: bool = True,
                     candidates: int = 32, progress: bool = True) -> torch.Tensor:
    """Cluster rows of x (n,d) into c spherical clusters; equal=True forces exactly n/c rows each.

    Returns assignments (n,) int64 on x's device.
    """
    n = x.shape[0]
    if equal and n % c:
        raise ValueError(f"equal-size clustering needs c to divide the row count: {n} rows, c={c}")
    xn = unit(x.float())
    cents = init_centroids(xn, c, seed)
    rounds = range(iters)
    for _ in steps(rounds, "equal-size k-means" if equal else "k-means", "iterations") if progress else rounds:
        if equal:
            assign = balanced_assign(xn, cents, n // c, candidates)
        else:
            assign = top_candidates(xn, cents, 1)[1].squeeze(1)
        new = centroids_of(xn, assign, c)
        empty = torch.bincount(assign, minlength=c) == 0
        cents = torch.where(empty[:, None], cents, new)                # keep a centroid that lost all rows
    return assign


@torch.no_grad()
def containment(hidden: torch.Tensor, W: torch.Tensor, cents: torch.Tensor, assign: torch.Tensor,
                probes: int, top_k: int = 1, chunk: int = 4096) -> float:
    """Fraction of the dense head's top-k tokens that lie in FlashHead's top-`probes` clusters."""
    hits, total = 0, 0
    for i in range(0, hidden.shape[0], chunk):
        h = hidden[i:i + chunk].to(W)
        best = (h @ W.T).topk(top_k, dim=1).indices                     # (n,k) dense top-k tokens
        chosen = (h @ cents.to(W).T).topk(probes, dim=1).indices       # (n,p) probed clusters
        inside = (assign[best][:, :, None] == chosen[:, None, :]).any(-1)
        hits += inside.sum().item()
        total += inside.numel()
    return hits / total
