"""Greedy LM heads: the dense head and FlashHead (cluster-first retrieval), both token-on-device."""
from __future__ import annotations

import warnings

import torch

from .bench import NO_CLOCK
from .clustering import cluster_to_token
from .runner import capture, on


class DenseHead:
    """argmax over the full vocabulary: W (V,d). kernel "triton" on CUDA: one fused GEMV + argmax launch
    for a single hidden state (lib/kernels.py; ties to the smallest id on fp32 logits)."""

    def __init__(self, weight: torch.Tensor, kernel: str = "torch"):
        self.weight, self.kernel = weight, kernel
        self.fused = None
        if kernel == "triton" and weight.is_cuda:
            from .kernels import dense_greedy_triton
            W = weight.contiguous()
            self.fused = lambda h: on_device(W, dense_greedy_triton, h.contiguous(), W)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h (n,d) -> token ids (n,), kept on the device (no host sync)."""
        if self.fused is not None and h.shape[0] == 1:
            return self.fused(h)
        return (h @ self.weight.T).argmax(-1)


class FlashHead:
    """FlashHead greedy: score c centroids, probe the top p, score their p*b tokens exactly, argmax.

    weight (V,d) output embeddings, centroids (c,d), assignments (V,) with equal cluster sizes,
    special_ids: tokens scored on every step.
    """

    def __init__(self, weight: torch.Tensor, centroids: torch.Tensor, assignments: torch.Tensor,
                 n_probes: int, special_ids: list[int] = (), kernel: str = "torch"):
        c = centroids.shape[0]
        self.weight = weight
        self.centroids = centroids.to(weight)                                   # (c,d)
        self.c2t = cluster_to_token(assignments.to(weight.device), c)           # (c,b)
        self.special = torch.tensor(sorted(special_ids), dtype=torch.long, device=weight.device)
        self.kernel = kernel                                                    # "torch" or "triton" (CUDA)
        self.set_probes(n_probes)

    def set_probes(self, n_probes: int) -> None:
        """Probe count and what depends on it. Two-stage top-p: split the c scores into R rows, top-p
        per row, then top-p of the R*p survivors (exact, and faster than one top-p over c on a GPU)."""
        c = self.centroids.shape[0]
        if not 1 <= n_probes <= c:
            raise ValueError(f"FlashHead: n_probes must be in 1..{c} (the number of clusters), got {n_probes}")
        self.n_probes = n_probes
        self.rows = max([r for r in range(1, 9) if c % r == 0 and c // r >= n_probes], default=1)
        self.fused = fused_kernel(self) if self.kernel == "triton" and self.weight.is_cuda else None

    def probes(self, h: torch.Tensor) -> torch.Tensor:
        """The top-p clusters (n,p) for hidden states h (n,d)."""
        scores = h @ self.centroids.T                                           # (n,c)
        if self.rows == 1:
            return scores.topk(self.n_probes, dim=-1, sorted=False).indices
        n, c, R = scores.shape[0], scores.shape[1], self.rows
        v, i = scores.view(n, R, c // R).topk(self.n_probes, dim=-1, sorted=False)   # (n,R,p)
        i = i + (torch.arange(R, device=h.device) * (c // R))[:, None]
        j = v.flatten(1).topk(self.n_probes, dim=-1, sorted=False).indices      # (n,p)
        return i.flatten(1).gather(1, j)

    @property
    def n_clusters(self) -> int:
        return self.c2t.shape[0]

    def candidates(self, h: torch.Tensor, probes: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (n, p*b + s) that FlashHead scores for hidden states h (n,d) (for the given probe
        clusters (n,p), if any)."""
        cand = self.c2t[self.probes(h) if probes is None else probes].flatten(1)   # (n,p*b)
        return torch.cat([cand, self.special.expand(h.shape[0], -1)], dim=1)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h (n,d) -> token ids (n,), kept on the device (no host sync)."""
        if self.fused is not None and h.shape[0] == 1:
            return self.fused(h)
        return self.reference(h)

    def reference(self, h: torch.Tensor) -> torch.Tensor:
        """The same selection in plain torch ops (any device, any batch)."""
        cand = self.candidates(h)                                               # (n,m)
        logits = torch.einsum("nmd,nd->nm", self.weight[cand], h)              # (n,m)
        return cand.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)

    def with_probes(self, n_probes: int, kernel: str | None = None) -> "FlashHead":
        """The same head with another probe count (and kernel path)."""
        other = object.__new__(FlashHead)
        other.__dict__.update(self.__dict__)
        other.kernel = kernel or self.kernel
        other.set_probes(n_probes)
        return other


def fused_kernel(head: FlashHead):
    """The Triton path for one hidden state, if Triton is present and it agrees with the fp32 selection
    (exact_fp32) on test inputs; otherwise None, with a warning (the torch path is used)."""
    try:
        from .kernels import flash_greedy_triton
    except ImportError:
        warnings.warn("FlashHead: Triton is not importable; the torch path runs")
        return None
    c, b = head.c2t.shape
    p = head.n_probes
    if head.special.numel() > b:                                               # one row holds the special tokens
        warnings.warn(f"FlashHead: {head.special.numel()} special tokens do not fit one cluster row ({b}); the torch path runs")
        return None
    special = head.special.repeat(b)[:b] if head.special.numel() else torch.full_like(head.c2t[0], -1)
    c2t_ext = torch.cat([head.c2t, special[None]]).contiguous()                 # row c: the special tokens (-1: none)
    W, cents = head.weight.contiguous(), head.centroids.contiguous()
    fn = lambda h: on_device(W, flash_greedy_triton, h.contiguous(), W, cents, c2t_ext, p)
    g = torch.Generator(device=W.device).manual_seed(0)
    probe = W[torch.randint(0, W.shape[0], (8,), device=W.device, generator=g)]   # embedding-like queries
    try:
        want = exact_fp32(head, probe).tolist()
        agree = all(fn(x[None]).item() == w for x, w in zip(probe, want))
    except Exception as e:                                                      # noqa: BLE001 - fall back to torch
        warnings.warn(f"FlashHead: the Triton path failed ({type(e).__name__}: {e}); the torch path runs")
        return None
    if not agree:
        warnings.warn("FlashHead: the Triton path disagreed with the fp32 selection; the torch path runs")
    return fn if agree else None


def on_device(W: torch.Tensor, kernel, *args):
    """Run a Triton head on W's GPU (Triton launches on the current device: a draft on a second GPU needs this)."""
    with on(W.device):
        return kernel(*args)


def exact_fp32(head: FlashHead, h: torch.Tensor) -> torch.Tensor:
    """FlashHead's selection on fp32 scores and logits, as the Triton kernels make it (the torch path rounds
    both to the weights' dtype, so in bf16 it may break near-ties differently)."""
    h = h.float()
    probes = (h @ head.centroids.float().T).topk(head.n_probes, dim=-1).indices   # (n,p) on fp32 scores
    cand = head.candidates(h, probes).sort(dim=1).values                         # argmax ties: the smallest id
    logits = torch.einsum("nmd,nd->nm", head.weight[cand].float(), h)
    return cand.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)


class GraphedHead:
    """A greedy head for one hidden state (1,d) -> token (1,): captured in a CUDA graph on CUDA (graphs=True),
    called directly otherwise. Each call is recorded on `clock` as the span call_draft_head."""

    def __init__(self, head, graphs: bool = False, clock=NO_CLOCK):
        self.head, self.clock, self.graph = head, clock, None
        W = head.weight
        if graphs and W.is_cuda:
            self.h = torch.zeros(1, W.shape[1], device=W.device, dtype=W.dtype)
            with on(W.device):
                self.graph, self.out = capture(lambda: head(self.h))

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        dev = self.head.weight.device
        with self.clock.span("call_draft_head", dev):
            if self.graph is None:
                return self.head(h)
            with on(dev):
                self.h.copy_(h)
                self.graph.replay()
            return self.out
