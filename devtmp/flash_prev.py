"""FlashHead's greedy step for one hidden state in Triton (GPU, or CPU under TRITON_INTERPRET=1).

Scoring: G programs score the c centroids, R each; each files its scores' int64 keys (kernels._key) in a
histogram of their top 12 bits (atomic counts; the old count is the key's slot in a per-bin slab of S) and
raises the highest bin seen. The plan: the last scoring program to finish reads the histogram down from that
bin, a window of bins at a time, to the bin holding the p-th score; the clusters above it are all probed, and it
sorts that bin's slab row so that its best p - #above come first. On a slab overflow (a bin from there up holding
more than S) it selects the p probes itself (radix select over all keys). Tokens: p + 1 workers; worker i takes
the i-th probe (worker p the special tokens), scores its b tokens, and the last to finish writes the token.

One launch (CUDA, p below the SM count): the workers are the last p + 1 scoring programs to finish, and all but
the plan's maker spin on a flag it raises. At most p programs spin, fewer than the SMs, so a scoring program still
waiting for an SM always gets one. Two launches (the interpreter, which runs programs one after another, or a
large p): the workers are a second grid, which waits for the first (programmatic dependent launch on Hopper).
The tie rule and the scratch are kernels.py's.
"""
from dataclasses import dataclass

import torch, triton, triton.language as tl

from lib.engine.kernels import NBINS, _MIN64, _dot_rows, _finish, _key, _launch_next, _running_counts, _wait, launches, scratch

_SHIFT = tl.constexpr(20)       # the centroid histogram bins scores by their top 12 bits (sign, exponent,
_NBINS = tl.constexpr(NBINS)    # 3 mantissa bits): a bin spans 1/8 of an octave
# the control words (scratch "ctl"): scoring programs done, workers done, plan ready (one launch), the highest bin
_DONE, _TOKENS_DONE, _READY, _HIGH = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3)


@triton.jit
def _bin(k):
    return ((k >> 52) + 2048).to(tl.int32)                   # the key's top 12 bits, in order


@triton.jit
def _radix_pass(cand_ptr, m, need, thr, above, KNOWN: tl.constexpr, LO: tl.constexpr, T: tl.constexpr):
    """One pass of a radix select over the m candidate keys (u << 32 | id, int64) at cand_ptr: key bits
    KNOWN.. of the need-th largest are thr's, and `above` keys are larger than that prefix; fix bits LO.."""
    hist = tl.zeros((256,), dtype=tl.int32)
    for t in tl.range(0, m, T):
        j = t + tl.arange(0, T)
        u = (tl.load(cand_ptr + j, mask=j < m, other=0, cache_modifier=".cg") >> 32).to(tl.uint32)
        match = (j < m) & ((u >> KNOWN) == (thr >> KNOWN))
        hist += tl.histogram(tl.where(match, (u >> LO) & 255, 0).to(tl.int32), 256)   # bin 0: also the rest
    bins = tl.arange(0, 256)
    ge = above + tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys >= each digit (exact for bins >= 1)
    digit = tl.sum(((ge >= need) & (bins >= 1)).to(tl.int32), 0)
    return thr | (digit.to(tl.uint32) << LO), above + tl.sum(tl.where(bins > digit, hist, 0), 0)


@triton.jit
def _select(cand_ptr, m, need, thr, out_ptr, T: tl.constexpr):
    """Store at out_ptr[0:need] the ids of the `need` largest of m candidate keys (u << 32 | id, ids
    ascending) that share thr's top 12 bits; equal keys: the smaller ids."""
    thr, above = _radix_pass(cand_ptr, m, need, thr, 0, 20, 12, T)
    thr, above = _radix_pass(cand_ptr, m, need, thr, above, 12, 4, T)
    thr, above = _radix_pass(cand_ptr, m, need, thr, above, 4, 0, T)   # thr: the need-th largest key
    n_gt = above * 0
    n_eq = above * 0
    for t in tl.range(0, m, T):
        j = t + tl.arange(0, T)
        k = tl.load(cand_ptr + j, mask=j < m, other=0, cache_modifier=".cg")
        u = (k >> 32).to(tl.uint32)
        gt = (j < m) & (u > thr)
        eq = (j < m) & (u == thr)
        c_gt, c_eq = _running_counts(gt, eq)
        r_eq = n_eq + c_eq - 1
        pos = tl.where(gt, n_gt + c_gt - 1, above + r_eq)             # larger keys first, then equal ones
        tl.store(out_ptr + pos, k.to(tl.int32), mask=gt | (eq & (r_eq < need - above)))
        n_gt += tl.sum(gt.to(tl.int32), 0)
        n_eq += tl.sum(eq.to(tl.int32), 0)


@triton.jit
def _select_all(keys_ptr, cand_ptr, probes_ptr, C, P, top, TF: tl.constexpr, T: tl.constexpr):
    """The overflow path: probes_ptr[0:P] = ids of the clusters in bins above `top`, then the best of bin top."""
    n_up = top * 0
    n_top = top * 0
    for t in tl.range(0, C, TF):                              # compact: ids above, candidates of bin top
        i = t + tl.arange(0, TF)
        ki = tl.load(keys_ptr + i, mask=i < C, other=_MIN64, cache_modifier=".cg")
        bi = tl.where(i < C, _bin(ki), -1)
        c_up, c_top = _running_counts(bi > top, bi == top)
        tl.store(probes_ptr + n_up + c_up - 1, i, mask=bi > top)
        u = (ki >> 32).to(tl.int32) ^ -2147483648               # unsigned order of the score
        tl.store(cand_ptr + n_top + c_top - 1, (u.to(tl.uint32).to(tl.int64) << 32) | i, mask=bi == top)
        n_up += tl.sum((bi > top).to(tl.int32), 0)
        n_top += tl.sum((bi == top).to(tl.int32), 0)
    tl.debug_barrier()                                        # candidates written before they are read
    _select(cand_ptr, n_top, P - n_up, top.to(tl.uint32) << _SHIFT, probes_ptr + n_up, T)


@triton.jit
def _plan(ctl_ptr, keys_ptr, hist_ptr, slab_ptr, above_ptr, plan_ptr, cand_ptr, probes_ptr, C, P,
          S: tl.constexpr, TF: tl.constexpr, T: tl.constexpr, WIN: tl.constexpr):
    """By the last scoring program: above_ptr[b] = #clusters in bins above b (for the bins read), plan = (bin of
    the P-th score, #clusters above it, #in it, overflow, highest bin), and that bin's slab row sorted, best first;
    on overflow the P probe ids in probes_ptr instead."""
    tl.store(ctl_ptr + _DONE, 0)
    hi = tl.atomic_xchg(ctl_ptr + _HIGH, 0)
    j = tl.arange(0, WIN)
    n_up = hi * 0                                             # clusters in the bins read so far
    top = n_up - 1
    m = n_up
    most = n_up                                               # the fullest bin from top up
    for w in tl.range(0, _NBINS // WIN):                      # windows of bins, down from the highest
        if top < 0:
            bins = hi - (w + 1) * WIN + 1 + j
            cnt = tl.load(hist_ptr + bins, mask=bins >= 0, other=0, cache_modifier=".cg")
            above = n_up + tl.sum(cnt, 0) - tl.cumsum(cnt, 0)
            tl.store(above_ptr + bins, above, mask=bins >= 0)
            top = tl.max(tl.where((above + cnt >= P) & (bins >= 0), bins, -1), 0)   # -1: not in this window
            most = tl.maximum(most, tl.max(tl.where(bins >= top, cnt, 0), 0))
            m = tl.sum(tl.where(bins == top, cnt, 0), 0)
            n_up = tl.where(top >= 0, tl.sum(tl.where(bins == top, above, 0), 0), n_up + tl.sum(cnt, 0))
    full = most > S                                           # some were not filed: select here
    k = tl.arange(0, 8)
    tl.store(plan_ptr + k, tl.where(k == 0, top, tl.where(k == 1, n_up, tl.where(k == 2, m, tl.where(
        k == 3, full.to(tl.int32), hi)))), mask=k < 5)
    if full:
        _select_all(keys_ptr, cand_ptr, probes_ptr, C, P, top, TF, T)
    else:
        jj = tl.arange(0, S)
        row = slab_ptr + top.to(tl.int64) * S + jj
        tl.store(row, tl.sort(tl.load(row, mask=jj < m, other=_MIN64, cache_modifier=".cg"), descending=True),
                 mask=jj < m)


@triton.jit
def _score_probe(i, h_ptr, w_ptr, c2t_ptr, slab_ptr, above_ptr, plan_ptr, probes_ptr, best_ptr, ctl_ptr, out_ptr,
                 C, P, D: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr):
    """Worker i of P + 1 scores the tokens of the i-th probe (i < P) or the special tokens (i = P, row C of c2t;
    -1 = none). True in the last to finish, which wrote the token."""
    top = tl.load(plan_ptr, cache_modifier=".cg")
    n_up = tl.load(plan_ptr + 1, cache_modifier=".cg")
    full = tl.load(plan_ptr + 3, cache_modifier=".cg") != 0
    hi = tl.load(plan_ptr + 4, cache_modifier=".cg")
    up = i < n_up                                             # in a bin above top: find the bin and the slot
    bins = tl.arange(0, _NBINS)
    above = tl.load(above_ptr + bins, mask=tl.where(up, (bins >= top) & (bins <= hi), False), other=0,
                    cache_modifier=".cg")
    above = tl.where(bins < top, C, above)                    # none above hi; bins below top are not read
    b = _NBINS - tl.sum((above <= i).to(tl.int32), 0)         # the lowest bin with <= i clusters above it
    slot = tl.where(up, i - tl.sum(tl.where(bins == b, above, 0), 0), i - n_up)   # in bin top: sorted, best first
    k = tl.load(slab_ptr + tl.where(up, b, top).to(tl.int64) * S + slot, mask=(i < P) & ~full, other=0,
                cache_modifier=".cg")
    cluster = 0x7FFFFFFF - (k & 0x7FFFFFFF)
    cluster = tl.where(full, tl.load(probes_ptr + i, mask=full & (i < P), other=0), cluster)
    row = c2t_ptr + tl.where(i == P, C, cluster).to(tl.int64) * B
    jb = tl.arange(0, BP)
    toks = tl.load(row + jb, mask=jb < B, other=-1).to(tl.int32)
    ok = toks >= 0
    return _finish(_key(_dot_rows(h_ptr, w_ptr, toks, ok, BP, D, BLOCK_D), toks, ok), best_ptr,
                   ctl_ptr + _TOKENS_DONE, out_ptr, P + 1)


@triton.jit
def _flash_head(h_ptr, c_ptr, w_ptr, c2t_ptr, keys_ptr, hist_ptr, slab_ptr, above_ptr, plan_ptr, cand_ptr, probes_ptr,
                best_ptr, ctl_ptr, out_ptr, C, P, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr,
                S: tl.constexpr, TF: tl.constexpr, T: tl.constexpr, WIN: tl.constexpr, B: tl.constexpr,
                BP: tl.constexpr, BLOCK_D2: tl.constexpr, ONE: tl.constexpr, PDL: tl.constexpr):
    """Program g scores centroids g*R..g*R+R-1 (its first tile read before the PDL wait); the last to finish
    makes the plan. ONE: the last P + 1 to finish are then the token workers."""
    _launch_next(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < C
    k = _key(_dot_rows(h_ptr, c_ptr, rows, ok, R, D, BLOCK_D, PDL), rows, ok)
    b = _bin(k)
    slot = tl.atomic_add(hist_ptr + b, 1, mask=ok, sem="relaxed")   # count it; the old count is its slot
    tl.store(slab_ptr + b.to(tl.int64) * S + slot, k, mask=ok & (slot < S))
    tl.store(keys_ptr + rows, k, mask=ok)
    tl.atomic_max(ctl_ptr + _HIGH, tl.max(tl.where(ok, b, 0), 0), sem="relaxed")
    tl.debug_barrier()                                        # all stores and adds land before the count
    G = tl.num_programs(0)
    n = tl.atomic_add(ctl_ptr + _DONE, 1)                     # acq_rel: the last sees every program's keys
    if n == G - 1:
        _plan(ctl_ptr, keys_ptr, hist_ptr, slab_ptr, above_ptr, plan_ptr, cand_ptr, probes_ptr, C, P, S, TF, T, WIN)
        tl.debug_barrier()                                    # the plan is stored before it is announced
        if ONE:
            tl.atomic_xchg(ctl_ptr + _READY, 1)               # release
        bins = tl.arange(0, _NBINS)
        tl.store(hist_ptr + bins, tl.zeros_like(bins))        # clean for the next call
    if ONE:
        i = n - (G - 1 - P)
        if i >= 0:
            ready = tl.atomic_add(ctl_ptr + _READY, 0, sem="acquire")
            while ready == 0:
                ready = tl.atomic_add(ctl_ptr + _READY, 0, sem="acquire")
            if _score_probe(i, h_ptr, w_ptr, c2t_ptr, slab_ptr, above_ptr, plan_ptr, probes_ptr, best_ptr, ctl_ptr,
                            out_ptr, C, P, D, B, BP, BLOCK_D2, S):
                tl.store(ctl_ptr + _READY, 0)                 # every worker has seen the flag


@triton.jit
def _flash_tokens(h_ptr, w_ptr, c2t_ptr, slab_ptr, above_ptr, plan_ptr, probes_ptr, best_ptr, ctl_ptr, out_ptr, C, P,
                  D: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr,
                  PDL: tl.constexpr):
    """The token workers as a second launch: program i is worker i."""
    _wait(PDL)                                                # the plan of the first launch
    _score_probe(tl.program_id(0), h_ptr, w_ptr, c2t_ptr, slab_ptr, above_ptr, plan_ptr, probes_ptr, best_ptr, ctl_ptr,
                 out_ptr, C, P, D, B, BP, BLOCK_D, S)


MAX_TILE = 1 << 20              # Triton's largest block (elements)


def check_flash_config(C: int, B: int, n_probes: int, c2t_rows: int, t: "FlashTuning") -> None:
    """The host-side check of a Triton FlashHead call: ValueError naming what is out of range. Tiles TF and T
    (the compaction and radix-select scans) are powers of two up to MAX_TILE; their running counts are exact for
    any of them (int64 sums, kernels._running_counts)."""
    S, TF, T, WIN = t.S, t.TF, t.T, t.WIN
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(f"flash_greedy_triton: {msg}")
    need(1 <= n_probes <= C, f"n_probes must be in 1..{C} (the clusters), got {n_probes}")
    need(c2t_rows == C + 1, f"c2t_ext needs {C + 1} rows (the clusters and the special tokens), got {c2t_rows}")
    need(B >= 1, "clusters must hold at least one token")
    for name, v in (("S", S), ("TF", TF), ("T", T)):
        need(v >= 1 and v & (v - 1) == 0, f"{name} must be a power of two, got {v}")
    need(WIN >= 1 and WIN & (WIN - 1) == 0 and WIN <= NBINS, f"WIN must be a power of two up to {NBINS}, got {WIN}")
    need(max(TF, T) <= MAX_TILE, f"tiles TF and T hold at most {MAX_TILE} elements, got TF={TF}, T={T}")


@dataclass(frozen=True)
class FlashTuning:
    """Launch settings: R centroids per program and BLOCK_D their dot products' tile (`warps` warps); BLOCK_D2 the
    token workers' tile (warps2 in a second launch); S slab slots per bin (a power of 2; the fast path needs the
    P-th score's bin and those above it to hold <= S clusters); WIN bins read at a time for the plan; TF and T the
    overflow path's scan tiles; one_launch where it may (launch_count); pdl where the GPU has it (launches())."""
    R: int = 16
    BLOCK_D: int = 1024
    BLOCK_D2: int = 1024
    warps: int = 8
    warps2: int = 4
    S: int = 256
    WIN: int = 256
    TF: int = 4096
    T: int = 1024
    one_launch: bool = True
    pdl: bool = True


def launch_count(device: torch.device, C: int, n_probes: int, t: FlashTuning) -> int:
    """1 where the token workers may spin inside the scoring launch (CUDA; fewer than the SMs, and as many scoring
    programs as workers), else 2."""
    fits = device.type == "cuda" and n_probes + 1 <= triton.cdiv(C, t.R) and \
        n_probes < torch.cuda.get_device_properties(device).multi_processor_count
    return 1 if t.one_launch and fits else 2


def flash_greedy_triton(h, W, cents, c2t_ext, n_probes, **tuning):
    """h (1,d) -> token (1,) int64 on the device: FlashHead greedy in one Triton launch, or two (launch_count).

    W (V,d), cents (c,d) and h contiguous, same dtype; c2t_ext (c+1,b) int64: row k the tokens of
    cluster k, row c the special tokens (-1 pads); any 1 <= n_probes <= c. tuning: FlashTuning's fields."""
    C, D = cents.shape
    B, t = c2t_ext.shape[1], FlashTuning(**tuning)
    check_flash_config(C, B, n_probes, c2t_ext.shape[0], t)
    out = torch.empty(1, dtype=torch.int64, device=h.device)
    s, one = _launch(h, cents, n_probes, t, (W, c2t_ext, out))
    if not one:
        pdl, opts = launches(h.device, t.warps2, t.pdl)
        _flash_tokens[(n_probes + 1,)](h, W, c2t_ext, s["slab"], s["above"], s["plan"], s["probes"], s["best"],
                                       s["ctl"], out, C, n_probes, D, B, triton.next_power_of_2(B),
                                       min(t.BLOCK_D2, triton.next_power_of_2(D)), t.S, pdl, **opts)
    return out


def flash_probes_triton(h, cents, n_probes, **tuning) -> dict:
    """The scoring launch alone: the scratch it leaves for the token workers, plan (top bin, #clusters above it,
    #in it, overflow, highest bin) and, on overflow, probes[:n_probes] (the selected clusters, in no particular
    order). tuning: FlashTuning's fields."""
    t = FlashTuning(**tuning)
    check_flash_config(cents.shape[0], 1, n_probes, cents.shape[0] + 1, t)
    return _launch(h, cents, n_probes, t, None)[0]


def _launch(h, cents, n_probes, t: FlashTuning, tokens) -> tuple[dict, bool]:
    """The scoring launch; with tokens = (W, c2t_ext, out) its workers too where it may (launch_count). Returns the
    scratch and whether the workers ran."""
    C, D = cents.shape
    W, c2t_ext, out = tokens or (cents, cents, None)
    one = tokens is not None and launch_count(h.device, C, n_probes, t) == 1
    B = 1 if tokens is None else c2t_ext.shape[1]
    s = scratch(h.device, C, t.S)
    pdl, opts = launches(h.device, t.warps, t.pdl)
    bd = min(t.BLOCK_D, triton.next_power_of_2(D))
    _flash_head[(triton.cdiv(C, t.R),)](
        h, cents, W, c2t_ext, s["keys"], s["hist"], s["slab"], s["above"], s["plan"], s["cand"], s["probes"], s["best"],
        s["ctl"], s["best"] if out is None else out, C, n_probes, D, t.R, bd, t.S, min(t.TF, triton.next_power_of_2(C)),
        min(t.T, triton.next_power_of_2(C)), t.WIN, B, triton.next_power_of_2(B),
        min(t.BLOCK_D2, triton.next_power_of_2(D)), one, pdl, **opts)
    return s, one
