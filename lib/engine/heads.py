"""Greedy LM heads: the dense head and FlashHead (cluster-first retrieval), both token-on-device.

Kernel paths. kernel="triton" (the profile's bench.head_kernel, the default) on a CUDA weight runs the Triton
kernels of lib/engine/kernels.py (dense) and flash_kernels.py for one hidden state, checked at construction against
an fp32 selection on probe hidden states; a head that cannot have them (Triton not importable, a disagreement, an
exception) raises KernelUnavailable with one line naming the reason: there is no fallback.
kernel="torch", and any head on a CPU, runs torch ops (on a CPU that is the path, not a fallback: head_kernel
applies to CUDA only). Every head says which path it really runs: `kernel_ran`, "triton" or "torch" (`__call__` on
more than one hidden state takes the torch path; FlashHead.batched runs the batched Triton kernel on a GPU and says so
in `batched_ran`; the engine's draft step is one hidden state)."""
from __future__ import annotations

import torch

from ..bench import NO_CLOCK, capture, on


def cluster_to_token(assign: torch.Tensor, c: int) -> torch.Tensor:
    """Dense (c,b) map of cluster -> token ids; refuses unequal clusters."""
    counts = torch.bincount(assign, minlength=c)
    if counts.numel() != c or (counts != counts[0]).any():
        raise ValueError(f"clusters are not of equal size: sizes range {counts.min().item()}..{counts.max().item()} "
                         f"over {c} clusters")
    return torch.argsort(assign, stable=True).view(c, -1)


class DenseHead:
    """argmax over the full vocabulary: W (V,d). kernel "triton" on CUDA: one fused GEMV + argmax launch
    for a single hidden state (lib/engine/kernels.py; ties to the smallest id on fp32 logits), checked at construction
    against the fp32 argmax on probe hidden states (KernelUnavailable when it cannot run or disagrees)."""

    def __init__(self, weight: torch.Tensor, kernel: str = "torch"):
        self.weight, self.kernel = weight, kernel
        self.fused = require_triton(dense_triton(weight), "DenseHead", weight) if wants_triton(kernel, weight) else None

    @property
    def kernel_ran(self) -> str:
        """The path that picks the token of one hidden state: "triton" or "torch"."""
        return "triton" if self.fused is not None else "torch"

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

    def bytes_read(self, n_probes: int | None = None) -> int:
        """Bytes one state's greedy call must read at n_probes (default: its own): centroids, probed token rows and
        the special tokens' rows (scored at every call)."""
        p = self.n_probes if n_probes is None else n_probes
        rows = p * self.c2t.shape[1] + self.special.numel()
        return (self.centroids.numel() + rows * self.weight.shape[1]) * self.weight.element_size()

    def set_probes(self, n_probes: int) -> None:
        """Probe count and what depends on it. Two-stage top-p: split the c scores into R rows, top-p
        per row, then top-p of the R*p survivors (exact, and faster than one top-p over c on a GPU)."""
        c = self.centroids.shape[0]
        if not 1 <= n_probes <= c:
            raise ValueError(f"FlashHead: n_probes must be in 1..{c} (the number of clusters), got {n_probes}")
        self.n_probes = n_probes
        self.rows = max([r for r in range(1, 9) if c % r == 0 and c // r >= n_probes], default=1)
        self.fused = fused_kernel(self) if wants_triton(self.kernel, self.weight) else None
        self.batch_fn = None                                                    # made on first use (batched)

    @property
    def kernel_ran(self) -> str:
        """The path that picks the token of one hidden state: "triton" or "torch"."""
        return "triton" if self.fused is not None else "torch"

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
        """The same selection in plain torch ops (any device, any batch); ties to the smallest id, as the dense head."""
        cand = self.candidates(h).sort(dim=1).values                            # (n,m); argmax ties: the smallest id
        logits = torch.einsum("nmd,nd->nm", self.weight[cand], h)              # (n,m)
        return cand.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)

    def probed(self, h: torch.Tensor) -> torch.Tensor:
        """(n,c) bool: the clusters each of the hidden states h (n,d) probes."""
        hit = torch.zeros(h.shape[0], self.n_clusters, dtype=torch.bool, device=h.device)
        return hit.scatter_(1, self.probes(h), True)

    def union_select(self, h: torch.Tensor) -> torch.Tensor:
        """h (n,d) -> token ids (n,): each row's FlashHead choice, ties to the smaller id, for a batch of rows
        scored by one GEMM over the union of the clusters they probe (each probed cluster's token rows are read
        once, however many rows probe it; a row's logits outside its own clusters are masked)."""
        probed = self.probed(h)                                                 # (n,c)
        union = probed.any(0).nonzero().squeeze(1)                              # (u,) clusters any row probes
        b = self.c2t.shape[1]
        tokens = torch.cat([self.c2t[union].flatten(), self.special])           # (u*b + s,)
        keep = torch.cat([probed[:, union].repeat_interleave(b, 1),             # a row scores its own clusters
                          probed.new_ones(h.shape[0], self.special.numel())], 1)   # and every special token
        tokens, order = tokens.sort()                                           # argmax ties: the smallest id
        logits = (h @ self.weight[tokens].T).masked_fill(~keep[:, order], float("-inf"))
        return tokens[logits.argmax(-1)]

    def batched(self, h: torch.Tensor) -> torch.Tensor:
        """h (n,d) -> token ids (n,) for a batch of hidden states: with kernel "triton" on CUDA the batched Triton
        path (flash_kernels.flash_batch_triton; checked on first use against exact_fp32, KernelUnavailable if it
        disagrees), else union_select. `batched_ran` says which."""
        if not wants_triton(self.kernel, self.weight):
            return self.union_select(h)
        if self.batch_fn is None:
            self.batch_fn = require_triton(flash_batch(self), f"FlashHead ({self.n_probes} probes, batched)", self.weight)
        return self.batch_fn(h)

    @property
    def batched_ran(self) -> str:
        """The path that picks the tokens of a batch (batched): "triton" or "torch"."""
        return "triton" if wants_triton(self.kernel, self.weight) else "torch"

    def with_probes(self, n_probes: int, kernel: str | None = None) -> "FlashHead":
        """The same head with another probe count (and kernel path)."""
        other = object.__new__(FlashHead)
        other.__dict__.update(self.__dict__)
        other.kernel = kernel or self.kernel
        other.set_probes(n_probes)
        return other


class KernelUnavailable(RuntimeError):
    """A head asked for the Triton path on CUDA (bench.head_kernel: triton) cannot have it; the message is one
    line naming the head, the device and the reason."""


KERNELS = ("torch", "triton")


def wants_triton(kernel: str, weight: torch.Tensor) -> bool:
    """Whether a head with this kernel setting runs the Triton path: "triton" on a CUDA weight. CPUs run torch
    ops whatever the setting (the profile's head_kernel applies to CUDA devices only)."""
    if kernel not in KERNELS:
        raise ValueError(f"head kernel must be one of {KERNELS}, got {kernel!r}")
    return kernel == "triton" and weight.is_cuda


def triton_kernels():
    """The Triton heads' modules (kernels, flash_kernels; ImportError where Triton is absent)."""
    from . import flash_kernels, kernels
    return kernels, flash_kernels


def require_triton(decision: tuple, head: str, weight: torch.Tensor):
    """The Triton path of a (fn, reason) decision (flash_triton, dense_triton), or KernelUnavailable naming the
    reason in one line."""
    fn, reason = decision
    if fn is None:
        raise KernelUnavailable(f"{head} on {weight.device}: bench.head_kernel is triton but {reason}; "
                                "set bench.head_kernel: torch to run the torch heads")
    return fn


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def probe_states(W: torch.Tensor, n: int = 8) -> torch.Tensor:
    """n embedding-like hidden states (rows of W, chosen by a fixed seed) to check a Triton head on."""
    g = torch.Generator(device=W.device).manual_seed(0)
    return W[torch.randint(0, W.shape[0], (n,), device=W.device, generator=g)]


def checked(fn, probe: torch.Tensor, want: torch.Tensor) -> tuple:
    """(fn, "") if fn picks the reference token `want` for each probe hidden state, else (None, why)."""
    want = want.tolist()
    try:
        got = [fn(x[None]).item() for x in probe]
    except Exception as e:                                                      # noqa: BLE001 - reported as the reason
        return None, f"the Triton kernel failed ({one_line(e)})"
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
    if bad:
        return None, (f"the Triton kernel disagrees with the fp32 reference on {len(bad)} of {len(want)} probe hidden "
                      f"states (first: token {got[bad[0]]}, reference {want[bad[0]]})")
    return fn, ""


def flash_call(head: FlashHead, kernel: str) -> tuple:
    """(fn, "") where fn calls flash_kernels.<kernel> on the head's tensors (hidden states -> tokens), or (None,
    reason) when Triton is not importable."""
    try:
        _, F = triton_kernels()
    except ImportError as e:
        return None, f"Triton is not importable ({one_line(e)})"
    run, c2t_ext = getattr(F, kernel), extended_c2t(head)
    W, cents, p = head.weight.contiguous(), head.centroids.contiguous(), head.n_probes
    return (lambda h: on_device(W, run, h.contiguous(), W, cents, c2t_ext, p)), ""


def flash_triton(head: FlashHead) -> tuple:
    """The Triton FlashHead for one hidden state and the reason it cannot be used: (fn, "") when flash_call can
    make it and the kernel picks exact_fp32's token on probe hidden states; (None, reason) otherwise."""
    fn, reason = flash_call(head, "flash_greedy_triton")
    if fn is None:
        return None, reason
    probe = probe_states(head.weight)
    return checked(fn, probe, exact_fp32(head, probe))


def flash_batch(head: FlashHead) -> tuple:
    """The batched Triton FlashHead (flash_kernels.flash_batch_triton) and the reason it cannot be used, as
    flash_triton: checked against exact_fp32 on a batch of probe hidden states."""
    fn, reason = flash_call(head, "flash_batch_triton")
    if fn is None:
        return None, reason
    probe = probe_states(head.weight, 16)
    try:
        got = fn(probe)
    except Exception as e:                                                      # noqa: BLE001 - reported as the reason
        return None, f"the batched Triton kernel failed ({one_line(e)})"
    want = exact_fp32(head, probe)
    if not torch.equal(got, want):
        bad = int((got != want).sum())
        return None, f"the batched Triton kernel disagrees with the fp32 reference on {bad} of {len(want)} probe hidden states"
    return fn, ""


def extended_c2t(head: FlashHead) -> torch.Tensor:
    """c2t with the special tokens' rows below it (b a row, -1 padding the last; one row of -1 where there are
    none): the Triton kernels score them as clusters c, c + 1, ... on every call."""
    b, s = head.c2t.shape[1], head.special.numel()
    special = torch.full((max(1, -(-s // b)) * b,), -1, dtype=head.c2t.dtype, device=head.c2t.device)
    special[:s] = head.special
    return torch.cat([head.c2t, special.view(-1, b)]).contiguous()


def dense_triton(weight: torch.Tensor) -> tuple:
    """The Triton dense head for one hidden state and the reason it cannot be used: (fn, "") when Triton imports
    and the kernel picks the fp32 argmax (ties: the smallest id) on probe hidden states; (None, reason) otherwise."""
    try:
        K, _ = triton_kernels()
    except ImportError as e:
        return None, f"Triton is not importable ({one_line(e)})"
    W = weight.contiguous()
    fn = lambda h: on_device(W, K.dense_greedy_triton, h.contiguous(), W)
    probe = probe_states(W)
    logits = torch.cat([probe.float() @ w.float().T for w in W.split(1 << 14)], dim=1)   # fp32, a slice at a time
    return checked(fn, probe, logits.argmax(-1))                               # argmax: the first maximum


def fused_kernel(head: FlashHead):
    """The Triton path of `head` for one hidden state (flash_triton), or KernelUnavailable with the reason."""
    return require_triton(flash_triton(head), f"FlashHead ({head.n_probes} probes)", head.weight)


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

    @property
    def kernel_ran(self) -> str:
        """The head's kernel path ("triton" or "torch")."""
        return self.head.kernel_ran

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
