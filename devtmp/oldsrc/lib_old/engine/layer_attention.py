"""Attention of a runner's multi-token calls on a GPU (layer_kernels.py's TritonLayer.attend): n query rows over the
static KV cache, each row attending its own and earlier positions, in place of SDPA over the whole cache with a mask.

Program (h, t, s) takes the G query heads that share KV head h, for R query rows t*R.., over the cache positions of
split s (S positions from s*S) up to the rows' last position: scores of the (R*G, hd) query tile against BL
positions at a time on the tensor cores (each row masked at its own position), an online softmax in fp32, then
(max, sum, weighted V) stored per row and query head (a padding row, at position -1, reads nothing and gets zeros).
A row whose positions all lie in the first split (position < S: most of the study's) is written by that split's
program at once, acc / l, bitwise what combining one split gives, with no partials or combination (twenty-fourth
session: on one H200, h100awq's target step at position 38, 8.35-8.38 -> 8.01-8.05 ms for one token). The other
rows' splits are combined in split order:
- in a short cache (up to LONG splits; the e2e runs' 342 positions) by the last of a row's programs to finish (a
  counter), each program taking one row (R = 1);
- in a long cache by a kernel of their own, a program a row and query head, each attention program taking R = ROWS
  rows, so that the K/V tiles are read once for a verify call's rows, not once a row, and far fewer programs are
  launched past the rows' positions. Thirty-first session, one H200, the h100 target (devtmp/rows_ab.py and
  long_ab.py, interleaved, tokens equal): in a cache for 8,192 positions, one token 20.82 -> 19.27 ms and a verify of
  7 23.82 -> 19.49 at position 8,192 (the attention alone, 64 calls: 5.94 -> 1.47 ms), 19.11 -> 18.24 at position
  64; in a cache of 1,178 positions 18.94 -> 18.38 for a verify at 1,020 but 17.87 -> 18.04 for one token at 64 (the
  64-row query tile's latency and the extra launch), hence short caches keep a program a row.

Batch invariance: splits and blocks are fixed positions, every reduction runs in a fixed order, a block past a row's
position leaves its (max, sum, weighted V) bitwise as they were (its weights are exactly 0 and its rescale exactly
1), and a row's scores are its own rows of the tile's products, whatever the other rows hold: a row's output is
bitwise the same at any row index and in a call of any length (the launch depends on the cache's length only).
Blocks past the rows' last position are not read, so the cost follows the positions in use.

Launch settings: on one H100 (8 rows at the 32B target's heads, 342 cache positions; devtmp sweep of split 64-256,
block 32-128, 2-8 warps, recorded in the README) splits of 256 in blocks of 128 with 4 warps were fastest, 9.5 us a
call in a graph against 13.4 for splits of 128 in blocks of 64 and 19.9 for SDPA. On Hopper it is a programmatic
dependent launch: it waits for the kernel before at its top and lets the next launch after its loop.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..bench import on
from .kernels import COMBINE_CHUNK, _combine_splits, _launch_next, _wait, counters, launches

SPLIT = 256                     # cache positions an attention program takes
BLOCK = 128                     # positions a step of its loop scores
LONG = 4                        # a cache of more splits is long: ROWS query rows a program, _combine_rows after it
ROWS = 8                        # (a short one: a program a row, its last program combining; see above)
WARPS = 4
COMBINE_WARPS = 4
DIRECT = True                   # a row within the first split written by its program (no combination)


@triton.jit
def _layer_attention(q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, ml_ptr, count_ptr, out_ptr, scale, sq_h, sq_n,
                     sk_h, N, HQ: tl.constexpr, G: tl.constexpr, R: tl.constexpr, M: tl.constexpr,
                     HD: tl.constexpr, S: tl.constexpr, BL: tl.constexpr, NS: tl.constexpr, CH: tl.constexpr,
                     PREC: tl.constexpr, PDL: tl.constexpr, DIRECT: tl.constexpr, LAST: tl.constexpr):
    _wait(PDL)                                                   # q and the cache written by the kernel before
    h, t, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i, d = tl.arange(0, M), tl.arange(0, HD)                     # M >= 16 tile rows for the dot: R*G real ones
    rows, heads = t * R + i // G, h * G + i % G
    real = (i < R * G) & (rows < N)
    pos = tl.load(pos_ptr + rows, mask=real, other=-1)           # -1: a padding row or none
    last = tl.max(pos, 0)                                        # the same for the (h, t)'s every split
    out_at = out_ptr + (rows * HQ + heads)[:, None] * HD + d[None, :]
    if s == 0:                                                   # padding rows (runner.py) attend nothing:
        tl.store(out_at, tl.zeros((M, HD), out_ptr.dtype.element_ty), mask=(real & (pos < 0))[:, None])
    q = tl.load(q_ptr + heads[:, None] * sq_h + rows[:, None] * sq_n + d[None, :], mask=(pos >= 0)[:, None],
                other=0.0)
    k_at, v_at = k_ptr + h.to(tl.int64) * sk_h, v_ptr + h.to(tl.int64) * sk_h
    m = tl.full((M,), -float("inf"), tl.float32)
    l = tl.zeros((M,), tl.float32)
    acc = tl.zeros((M, HD), tl.float32)
    for b in range(s * S, tl.minimum(s * S + S, last + 1), BL):  # blocks of positions some row may see
        p = b + tl.arange(0, BL)
        kt = tl.load(k_at + p[:, None] * HD + d[None, :], mask=(p <= last)[:, None], other=0.0)
        vt = tl.load(v_at + p[:, None] * HD + d[None, :], mask=(p <= last)[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(kt), input_precision=PREC) * scale
        sc = tl.where(p[None, :] <= pos[:, None], sc, -float("inf"))
        top = tl.maximum(m, tl.max(sc, 1))                       # -inf only for a row that sees nothing yet
        base = tl.where(top == -float("inf"), 0.0, top)          # (its weights and rescale then 0, not NaN)
        e = tl.exp(sc - base[:, None])
        keep = tl.exp(m - base)                                  # 0 before a row's first block
        l = l * keep + tl.sum(e, 1)
        acc = acc * keep[:, None] + tl.dot(e.to(vt.dtype), vt, input_precision=PREC)
        m = top
    _launch_next(PDL)                                            # our scores done: the o-projection may launch
    combined = pos >= 0                                          # the rows whose splits are combined
    if DIRECT:                                                   # split 0 holds every position such a row sees:
        if s == 0:                                               # its output is acc / l, what the combination
            o = acc / tl.where(l > 0, l, 1.0)[:, None]           # of one split gives bitwise (l 0: no row)
            tl.store(out_at, o.to(out_ptr.dtype.element_ty), mask=(combined & (pos < S))[:, None])
        if last < S:                                             # no row to combine: no partials, no count
            return
        combined = pos >= S
    at = (rows * HQ + heads) * NS + s                            # (row, head, split): a split past pos stores
    tl.store(ml_ptr + at * 2, m, mask=combined)                  # max -inf, sum 0, weighted V 0
    tl.store(ml_ptr + at * 2 + 1, l, mask=combined)
    tl.store(part_ptr + at[:, None] * HD + d[None, :], acc, mask=combined[:, None])
    if not LAST:                                                 # _combine_rows combines them
        return
    tl.debug_barrier()                                           # partials stored before we count ourselves
    tile = t * tl.num_programs(0) + h
    if tl.atomic_add(count_ptr + tile, 1) == NS - 1:             # acq_rel: the last sees every partial
        tl.store(count_ptr + tile, 0)                            # ready for the next call
        for j in tl.static_range(R * G):                         # each combined row's query heads, in turn
            row = t * R + j // G
            at_j = tl.load(pos_ptr + row, mask=row < N, other=-1)
            if at_j >= S * DIRECT:                               # (0 where every row is combined)
                o = _combine_splits(ml_ptr, part_ptr, (row * HQ + h * G + j % G) * NS, at_j // S + 1, d, CH)
                tl.store(out_ptr + (row * HQ + h * G + j % G) * HD + d, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _combine_rows(pos_ptr, part_ptr, ml_ptr, out_ptr, HQ: tl.constexpr, HD: tl.constexpr, S: tl.constexpr,
                  NS: tl.constexpr, CH: tl.constexpr, FIRST: tl.constexpr, PDL: tl.constexpr):
    """Program (r, a): row r's query head a combined from its splits' partials, where the row's position is at
    least FIRST (S: the rows before are written directly; 0: every row but padding)."""
    _launch_next(PDL)
    _wait(PDL)                                                   # every split's partials stored
    r, a = tl.program_id(0), tl.program_id(1)
    pos = tl.load(pos_ptr + r)
    if pos >= FIRST:
        d = tl.arange(0, HD)
        o = _combine_splits(ml_ptr, part_ptr, (r * HQ + a) * NS, pos // S + 1, d, CH)
        tl.store(out_ptr + (r * HQ + a) * HD + d, o.to(out_ptr.dtype.element_ty))


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                     split: int = SPLIT, block: int = BLOCK, direct: bool = DIRECT) -> torch.Tensor:
    """q (1, HQ, n, hd) of queries at positions pos (n,) over caches (1, Hkv, L, hd), each query attending its own
    and earlier positions (at -1: a padding row, attending nothing, its output zeros) -> (1, n, HQ, hd) in q's dtype
    (the layout the o-projection reads). direct=False combines every row's splits (the tests' reference for the
    direct rows). LONG and ROWS are read at the call."""
    _, HQ, n, HD = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    if HQ % Hkv or HD & (HD - 1) or split % block or k_cache.shape != v_cache.shape:
        raise ValueError(f"cached_attention: {HQ} query heads over {Hkv} KV heads, head_dim {HD} (a power of two), "
                         f"split {split} (a multiple of {block}), caches {tuple(k_cache.shape)} {tuple(v_cache.shape)}")
    if k_cache.stride()[1:] != (L * HD, HD, 1) or v_cache.stride() != k_cache.stride():
        raise ValueError("cached_attention: the caches must be contiguous per KV head")
    q = q if q.stride(-1) == 1 else q.contiguous()
    G, ns = HQ // Hkv, triton.cdiv(L, split)
    long = ns > LONG
    R, ch = (ROWS if long else 1), min(triton.next_power_of_2(ns), COMBINE_CHUNK)   # ch: splits combined at once
    out = torch.empty(1, n, HQ, HD, dtype=q.dtype, device=q.device)
    part = torch.empty(n, HQ, ns, HD, dtype=torch.float32, device=q.device)
    ml = torch.empty(n, HQ, ns, 2, dtype=torch.float32, device=q.device)
    count = counters(q.device, n * Hkv, "attention")
    pdl, opts = launches(q.device, WARPS)
    with on(q.device):                                           # Triton launches on the current device
        _layer_attention[(Hkv, triton.cdiv(n, R), ns)](
            q, k_cache, v_cache, pos, part, ml, count, out, HD ** -0.5, q.stride(1), q.stride(2), L * HD, n, HQ, G,
            R, max(16, triton.next_power_of_2(R * G)), HD, split, block, ns, ch,
            "ieee" if q.dtype == torch.float32 else "tf32", pdl, direct, not long, **opts)
        if long:
            pdl, opts = launches(q.device, COMBINE_WARPS)
            _combine_rows[(n, HQ)](pos, part, ml, out, HQ, HD, split, ns, ch, split if direct else 0, pdl, **opts)
    return out


@torch.library.custom_op("study::cached_attention", mutates_args=())
def _cached_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         pos: torch.Tensor) -> torch.Tensor:
    return cached_attention(q, k_cache, v_cache, pos)


@_cached_attention_op.register_fake
def _(q, k_cache, v_cache, pos):
    return q.new_empty(1, q.shape[2], q.shape[1], q.shape[3])
