"""FlashHead's greedy step for one hidden state in Triton (GPU, or CPU under TRITON_INTERPRET=1).

Launch 1: G programs score the c centroids, R each, and file their int64 keys (kernels._key) in a histogram of
the keys' top 12 bits (atomic counts; the old count is the key's slot in a per-bin slab of S). Launch 2, which
waits for it (programmatic dependent launch on Hopper): p + 1 programs; each reads the whole histogram and makes
the same plan (the bin holding the p-th score; the clusters above it are all probed, and the best p - #above of
that bin's slab row, which it sorts), then program i takes the i-th probe (programs p.. the special tokens' rows)
and scores its b tokens; the last to finish writes the token. On a slab overflow (a bin from there up holding more
than S) the first program to arrive selects the p probes (radix select over all keys) while the others wait.
No single program makes the plan for the rest: that serial tail (a scan of the histogram, its stores and loads)
cost ~6 us an H100 step (issue 25's note). The tie rule and the scratch are kernels.py's.

For a batch of n hidden states (flash_batch_triton, notebook 02's batch study): four launches, each row's centroid
keys, the best p of each segment of centroids, each row's top p, then a program per (row, probe); no scratch kept
between calls.
"""
from dataclasses import dataclass

import torch, triton, triton.language as tl

from .kernels import (NBINS, _MIN64, _dot_rows, _finish, _index, _key, _launch_next, _running_counts, _wait,
                      launches, scratch)

_SHIFT = tl.constexpr(20)       # the centroid histogram bins scores by their top 12 bits (sign, exponent,
_NBINS = tl.constexpr(NBINS)    # 3 mantissa bits): a bin spans 1/8 of an octave
# the control words (scratch "ctl", each on its own 128-byte line so that atomics on one do not queue behind
# another's): token programs done; on overflow, the ticket that picks the selecting program and its flag
_TOKENS_DONE, _TICKET, _READY = tl.constexpr(0), tl.constexpr(32), tl.constexpr(64)


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
def _flash_scores(h_ptr, c_ptr, keys_ptr, hist_ptr, slab_ptr, C, D: tl.constexpr, R: tl.constexpr,
                  BLOCK_D: tl.constexpr, S: tl.constexpr, PDL: tl.constexpr):
    """Launch 1. Program g scores centroids g*R..g*R+R-1 (its first tile read before the PDL wait) and files
    their keys: counted in the histogram, stored in the slab when their bin has room, and in keys_ptr."""
    _launch_next(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < C
    k = _key(_dot_rows(h_ptr, c_ptr, rows, ok, R, D, BLOCK_D, PDL), rows, ok)
    b = _bin(k)
    slot = tl.atomic_add(hist_ptr + b, 1, mask=ok, sem="relaxed")   # count it; the old count is its slot
    tl.store(slab_ptr + b.to(tl.int64) * S + slot, k, mask=ok & (slot < S))
    tl.store(keys_ptr + rows, k, mask=ok)


@triton.jit
def _flash_tokens(h_ptr, w_ptr, c2t_ptr, keys_ptr, hist_ptr, slab_ptr, plan_ptr, cand_ptr, probes_ptr, best_ptr,
                  ctl_ptr, out_ptr, C, P, X, D: tl.constexpr, B: tl.constexpr, BP: tl.constexpr,
                  BLOCK_D: tl.constexpr, S: tl.constexpr, TF: tl.constexpr, T: tl.constexpr, PDL: tl.constexpr):
    """Launch 2. Program i of P + X reads the histogram (the same plan in every program), finds the i-th probe
    (i < P) or a row of special tokens (i >= P: row C + i - P of c2t, X such rows; -1 = none) and scores their tokens;
    the last to finish writes the token and clears the histogram for the next call. The next kernel may launch now."""
    _launch_next(PDL)
    i = tl.program_id(0)
    _wait(PDL)                                                # every score of launch 1 is filed
    bins = tl.arange(0, _NBINS)
    cnt = tl.load(hist_ptr + bins, cache_modifier=".cg")
    above = C - tl.cumsum(cnt, 0)                             # clusters in bins above each bin
    top = tl.sum((above + cnt >= P).to(tl.int32), 0) - 1      # the bin holding the P-th largest score
    n_up = tl.sum(tl.where(bins == top, above, 0), 0)         # clusters above it: all probed
    m = tl.sum(tl.where(bins == top, cnt, 0), 0)              # clusters in it: the best P - n_up probed
    full = tl.max(tl.where(bins >= top, cnt, 0), 0) > S       # some were not filed in the slab
    if i == P:
        k = tl.arange(0, 4)
        tl.store(plan_ptr + k, tl.where(k == 0, top, tl.where(k == 1, n_up, tl.where(k == 2, m, full.to(tl.int32)))))
    if full:
        cluster = _selected(i, keys_ptr, cand_ptr, probes_ptr, ctl_ptr, C, P, top, TF, T)
    elif i < n_up:                                            # in a bin above top: find the bin and the slot
        b = _NBINS - tl.sum((above <= i).to(tl.int32), 0)     # the lowest bin with <= i clusters above it
        slot = i - tl.sum(tl.where(bins == b, above, 0), 0)
        cluster = _index(tl.load(slab_ptr + b.to(tl.int64) * S + slot, cache_modifier=".cg"))
    elif i < P:                                               # in bin top: the (i - n_up)-th best there
        row = slab_ptr + top.to(tl.int64) * S
        if m <= 32:                                           # the usual case: a short sort
            cluster = _index(_ranked(row, m, i - n_up, 32))
        else:
            cluster = _index(_ranked(row, m, i - n_up, S))
    else:
        cluster = C + i - P                                   # a row of the special tokens
    jb = tl.arange(0, BP)
    toks = tl.load(c2t_ptr + cluster.to(tl.int64) * B + jb, mask=jb < B, other=-1).to(tl.int32)
    ok = toks >= 0
    if _finish(_key(_dot_rows(h_ptr, w_ptr, toks, ok, BP, D, BLOCK_D), toks, ok), best_ptr, ctl_ptr + _TOKENS_DONE,
               out_ptr, P + X):
        tl.store(hist_ptr + bins, tl.zeros_like(cnt))         # every program has read it
        tl.store(ctl_ptr + _TICKET, 0)
        tl.store(ctl_ptr + _READY, 0)


@triton.jit
def _ranked(row_ptr, m, j, N: tl.constexpr):
    """The j-th largest (from 0) of the m <= N keys at row_ptr."""
    r = tl.arange(0, N)
    keys = tl.sort(tl.load(row_ptr + r, mask=r < m, other=_MIN64, cache_modifier=".cg"), descending=True)
    return tl.sum(tl.where(r == j, keys, 0), 0)


@triton.jit
def _selected(i, keys_ptr, cand_ptr, probes_ptr, ctl_ptr, C, P, top, TF: tl.constexpr, T: tl.constexpr):
    """The overflow path: the first program to arrive selects the P probes into probes_ptr (radix select over all
    keys) while the others wait for it (it is running, so the wait ends); then each takes probes_ptr[i]."""
    if tl.atomic_add(ctl_ptr + _TICKET, 1) == 0:
        _select_all(keys_ptr, cand_ptr, probes_ptr, C, P, top, TF, T)
        tl.debug_barrier()                                    # the probes are stored before they are announced
        tl.atomic_xchg(ctl_ptr + _READY, 1)                   # release
    ready = tl.atomic_add(ctl_ptr + _READY, 0, sem="acquire")
    while ready == 0:
        ready = tl.atomic_add(ctl_ptr + _READY, 0, sem="acquire")
    return tl.where(i < P, tl.load(probes_ptr + i, mask=i < P, other=0, cache_modifier=".cg"), C + i - P)


MAX_TILE = 1 << 20              # Triton's largest block (elements)


def check_flash_config(C: int, B: int, n_probes: int, c2t_rows: int, t: "FlashTuning") -> None:
    """The host-side check of a Triton FlashHead call: ValueError naming what is out of range. Tiles TF and T
    (the compaction and radix-select scans) are powers of two up to MAX_TILE; their running counts are exact for
    any of them (int64 sums, kernels._running_counts)."""
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(f"flash_greedy_triton: {msg}")
    need(1 <= n_probes <= C, f"n_probes must be in 1..{C} (the clusters), got {n_probes}")
    need(c2t_rows > C, f"c2t_ext needs more than {C} rows (the clusters, then the special tokens'), got {c2t_rows}")
    need(B >= 1, "clusters must hold at least one token")
    for name in ("S", "TF", "T"):
        v = getattr(t, name)
        need(v >= 1 and v & (v - 1) == 0, f"{name} must be a power of two, got {v}")
    need(max(t.TF, t.T) <= MAX_TILE, f"tiles TF and T hold at most {MAX_TILE} elements, got TF={t.TF}, T={t.T}")


@dataclass(frozen=True)
class FlashTuning:
    """Launch settings: R centroids per program and BLOCK_D their dot products' tile (launch 1, `warps` warps);
    BLOCK_D2 and warps2 for launch 2; S slab slots per bin (a power of 2; the fast path needs the P-th score's bin
    and those above it to hold <= S clusters); TF and T the overflow path's scan tiles; pdl: programmatic
    dependent launch where the GPU has it (launches())."""
    R: int = 16
    BLOCK_D: int = 1024
    BLOCK_D2: int = 1024
    warps: int = 8
    warps2: int = 16            # launch 2: every program scans the 4,096 bins (H100, K=6 block: 4 warps 25.1 us
    S: int = 256                # a step, 8 warps 20.5, 16 warps 19.3; devtmp/bench_flash3.py in the experiment record)
    TF: int = 4096
    T: int = 1024
    pdl: bool = True


def flash_greedy_triton(h, W, cents, c2t_ext, n_probes, **tuning):
    """h (1,d) -> token (1,) int64 on the device: FlashHead greedy in two Triton launches.

    W (V,d), cents (c,d) and h contiguous, same dtype; c2t_ext (c+x,b) int64: row k the tokens of cluster k, rows
    c.. the special tokens (x >= 1 rows; -1 pads); any 1 <= n_probes <= c. tuning: FlashTuning's fields.
    What the call leaves in scratch(h.device, c, S): plan = (bin of the p-th score, #clusters above it, #in it,
    overflow) and, on overflow, probes[:n_probes] (the selected clusters, in no particular order)."""
    C, D = cents.shape
    B, t = c2t_ext.shape[1], FlashTuning(**tuning)
    check_flash_config(C, B, n_probes, c2t_ext.shape[0], t)
    s = scratch(h.device, C, t.S)
    pdl, opts = launches(h.device, t.warps, t.pdl)
    _flash_scores[(triton.cdiv(C, t.R),)](h, cents, s["keys"], s["hist"], s["slab"], C, D, t.R,
                                          min(t.BLOCK_D, triton.next_power_of_2(D)), t.S, pdl, **opts)
    out = torch.empty(1, dtype=torch.int64, device=h.device)
    pdl, opts = launches(h.device, t.warps2, t.pdl)
    X = c2t_ext.shape[0] - C
    _flash_tokens[(n_probes + X,)](h, W, c2t_ext, s["keys"], s["hist"], s["slab"], s["plan"], s["cand"], s["probes"],
                                   s["best"], s["ctl"], out, C, n_probes, X, D, B, triton.next_power_of_2(B),
                                   min(t.BLOCK_D2, triton.next_power_of_2(D)), t.S,
                                   min(t.TF, triton.next_power_of_2(C)), min(t.T, triton.next_power_of_2(C)), pdl,
                                   **opts)
    return out


@triton.jit
def _batch_centroid_keys(h_ptr, c_ptr, keys_ptr, n, C, D: tl.constexpr, R: tl.constexpr, NB: tl.constexpr,
                         BK: tl.constexpr, PREC: tl.constexpr):
    """Batched launch 1. Program g scores centroids g*R..g*R+R-1 against the n rows, NB rows a tensor-core dot
    (fp32 sums), and writes each row's keys of them (kernels._key) to keys (n, C). Its centroids come from memory
    once, then from L2 for the next block of rows."""
    cents = tl.program_id(0) * R + tl.arange(0, R)
    ok, k = cents < C, tl.arange(0, BK)
    for r0 in range(0, n, NB):
        rows = r0 + tl.arange(0, NB)
        acc = tl.zeros((R, NB), dtype=tl.float32)
        for d0 in range(0, D, BK):
            dk = d0 + k
            w = tl.load(c_ptr + cents.to(tl.int64)[:, None] * D + dk[None, :], mask=ok[:, None] & (dk < D)[None, :],
                        other=0.0)
            x = tl.load(h_ptr + rows[:, None] * D + dk[None, :], mask=(rows < n)[:, None] & (dk < D)[None, :],
                        other=0.0)
            acc += tl.dot(w, tl.trans(x), input_precision=PREC)
        live = ok[:, None] & (rows < n)[None, :]
        tl.store(keys_ptr + rows[None, :] * C + cents[:, None], _key(acc, cents[:, None], live), mask=live)


@triton.jit
def _batch_segment_top(keys_ptr, cand_ptr, C, SEG: tl.constexpr, KEEP: tl.constexpr, TOPK: tl.constexpr):
    """Batched launch 2. Program (r, s) keeps the best KEEP (>= p) of row r's keys of centroids s*SEG..s*SEG+SEG-1:
    the row's top p lie among its segments' kept keys."""
    r, s = tl.program_id(0), tl.program_id(1)
    j = s * SEG + tl.arange(0, SEG)
    x = tl.load(keys_ptr + r.to(tl.int64) * C + j, mask=j < C, other=_MIN64)
    at = cand_ptr + (r * tl.num_programs(1) + s) * KEEP
    if TOPK:                                                  # Triton's partial sort, where it has one
        tl.store(at + tl.arange(0, KEEP), tl.topk(x, KEEP))
    else:
        t = tl.arange(0, SEG)
        tl.store(at + t, tl.sort(x, descending=True), mask=t < KEEP)


@triton.jit
def _batch_probes(cand_ptr, probes_ptr, best_ptr, count_ptr, M, P, MP: tl.constexpr):
    """Batched launch 3. Program r sorts row r's M kept keys and stores its top P clusters, best first; and sets
    row r's best key and count of finished token programs for launch 4."""
    r = tl.program_id(0)
    m = tl.arange(0, MP)
    kept = tl.sort(tl.load(cand_ptr + r.to(tl.int64) * M + m, mask=m < M, other=_MIN64), descending=True)
    tl.store(probes_ptr + r * P + m, _index(kept), mask=m < P)
    tl.store(best_ptr + r, _MIN64)
    tl.store(count_ptr + r, 0)


@triton.jit
def _flash_batch_tokens(h_ptr, w_ptr, c2t_ptr, probes_ptr, best_ptr, count_ptr, out_ptr, C, P, X,
                        D: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, BLOCK_D: tl.constexpr):
    """Batched launch 4. Program (r, i) of (n, P + X) scores the b tokens of row r's i-th probe (i >= P: row C + i - P
    of c2t, special tokens; -1 = none) against hidden state r and folds their best key into best[r]; the row's last
    program to finish writes its token. A cluster several rows probe is read from memory once, then from L2."""
    r, i = tl.program_id(0), tl.program_id(1)
    cluster = tl.where(i < P, tl.load(probes_ptr + r * P + i, mask=i < P, other=0), C + i - P)
    jb = tl.arange(0, BP)
    toks = tl.load(c2t_ptr + cluster.to(tl.int64) * B + jb, mask=jb < B, other=-1).to(tl.int32)
    ok = toks >= 0
    key = _key(_dot_rows(h_ptr + r.to(tl.int64) * D, w_ptr, toks, ok, BP, D, BLOCK_D), toks, ok)
    _finish(key, best_ptr + r, count_ptr + r, out_ptr + r, P + X)


TOPK = hasattr(tl, "topk")      # Triton's partial sort (newer Triton); else a whole sort
SEGMENT = 1024 if TOPK else 512  # centroids a batched segment program keeps the best p of
# One H200, c = 9,496, p = 16, graphed p50 at 1 / 8 / 64 rows (devtmp/batch_variants.py, three torch ops after the
# launches then): segments of 1,024 with topk 28.2 / 28.6 / 64.7 us, of 512 28.1 / 29.2 / 63.3, of 256 34.3 / 36.0 /
# 71.5; a whole sort 33.3 / 33.6 / 87.0 (1,024), 28.4 / 30.2 / 72.2 (512); R = 16 centroids a program 2-10 % slower.
# NB rows a dot (devtmp/keys_variants.py, 2026-11-28): NB 16 / 32 / 64 at 32 rows 41.0 / 34.2 / 39.0 us, at 64 rows
# 62.6 / 53.2 / 51.6 (the keys 22.0 -> 12.7 us); up to 16 rows NB 16 (64: +7 us). Hence NB's default, 0.


@dataclass(frozen=True)
class BatchTuning:
    """The batched launches' settings: R centroids a program and NB rows a tensor-core dot (powers of two >= 16;
    NB 0: the batch's rows rounded up to one, 16 to 64), BK the dot's depth tile; block_d the token scoring's tile."""
    R: int = 32
    NB: int = 0
    BK: int = 256
    block_d: int = 1024


def flash_batch_triton(h, W, cents, c2t_ext, n_probes, **tuning):
    """h (n,d) -> tokens (n,) int64: FlashHead greedy for n hidden states at once, in four launches (and nothing
    else) with no host synchronisation (graph-capturable): every row's centroid keys (fp32 scores on the tensor cores,
    each centroid tile read from memory once), the best p of each segment of SEGMENT centroids, each row's top p of
    those, then n x (p + 1) programs that each score one probe's tokens, the row's last writing its token. Ties as
    flash_greedy_triton's (probes: the smaller cluster id; tokens: the smaller id). W (V,d), cents (c,d) and h
    contiguous, same dtype; c2t_ext as there; tuning: BatchTuning's fields."""
    n, D = h.shape
    C, B = cents.shape[0], c2t_ext.shape[1]
    check_flash_config(C, B, n_probes, c2t_ext.shape[0], FlashTuning())
    t = BatchTuning(**tuning)
    nb = t.NB or min(64, max(16, triton.next_power_of_2(n)))
    if min(t.R, nb) < 16 or t.R & (t.R - 1) or nb & (nb - 1):
        raise ValueError(f"flash_batch_triton: R and NB must be powers of two >= 16 (tensor-core tiles), got {t.R}, {nb}")
    seg = min(SEGMENT, max(16, triton.next_power_of_2(C)))
    nseg, keep = triton.cdiv(C, seg), min(max(triton.next_power_of_2(n_probes), 16), seg)   # sorts of >= 16
    keys = torch.empty(n, C, dtype=torch.int64, device=h.device)
    cand = torch.empty(n, nseg * keep, dtype=torch.int64, device=h.device)
    probes = torch.empty(n, n_probes, dtype=torch.int32, device=h.device)
    best, count = torch.empty(n, dtype=torch.int64, device=h.device), torch.empty(n, dtype=torch.int32, device=h.device)
    out = torch.empty(n, dtype=torch.int64, device=h.device)
    prec = "ieee" if h.dtype == torch.float32 else "tf32"     # fp32 inputs: no TF32 rounding
    _batch_centroid_keys[(triton.cdiv(C, t.R),)](h, cents, keys, n, C, D, t.R, nb,
                                                 max(16, min(t.BK, triton.next_power_of_2(D))), prec, num_warps=4)
    _batch_segment_top[(n, nseg)](keys, cand, C, seg, keep, TOPK, num_warps=8)
    _batch_probes[(n,)](cand, probes, best, count, nseg * keep, n_probes, triton.next_power_of_2(nseg * keep),
                        num_warps=4)
    X = c2t_ext.shape[0] - C
    _flash_batch_tokens[(n, n_probes + X)](h, W, c2t_ext, probes, best, count, out, C, n_probes, X, D, B,
                                            triton.next_power_of_2(B), min(t.block_d, triton.next_power_of_2(D)),
                                            num_warps=4)
    return out
