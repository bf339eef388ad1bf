"""Triton kernels for greedy decoding of one hidden state (GPU, or CPU under TRITON_INTERPRET=1).

FlashHead in two launches. (1) G programs score the c centroids; each files its scores' int64 keys in
a histogram of their top 12 bits (atomic counts; the old count is the key's slot in a per-bin slab).
The last program to finish reads the histogram: the bin holding the p-th score, the clusters above it
(all probed) and the m in it (probed if their rank there is < p - #above); on a slab overflow it does
the exact selection itself (radix select). (2) p + S + 1 programs: program i finds the i-th cluster in
score order from the histogram and the slab; the p that are probed score their b tokens, one more the
special tokens, the rest leave; the last of these p + 1 to finish writes the token. The dense head is
one launch of that last pattern. No sort anywhere: compile time is a few seconds for any p.

Tie rule (both heads): scores and logits are fp32 dot products of the bf16/fp32 inputs, accumulated in
fp32 (-0.0 counts as +0.0; NaN is not handled). Probes are the p clusters with the largest scores, ties
to the smaller cluster id; the token is the candidate with the largest logit, ties to the smaller token
id (torch.argmax over the vocabulary). Where fp32 sums are exact (e.g. small integers) this is exact; on
real data two summation orders can differ in the last bit, so only near-ties (gap ~1e-7 relative) can
disagree with a torch reference. A (value, index) pair travels as one int64 key whose order is that rule.

The kernels keep counters and a histogram between calls and leave them as they found them, so calls
are CUDA-graph capturable; call each head once before capturing (that allocates the scratch).
One stream at a time per device. On Hopper each launch is a programmatic dependent launch: the first weight
tile is read before the wait for the hidden state, while the kernel before (e.g. decode.py's final norm) runs.
"""
from dataclasses import dataclass

import torch, triton, triton.language as tl

_MIN64 = tl.constexpr(-2 ** 63)
_SHIFT = tl.constexpr(20)       # the centroid histogram bins scores by their top 12 bits (sign, exponent,
_NBINS = tl.constexpr(4096)     # 3 mantissa bits): a bin spans 1/8 of an octave


@triton.jit
def _ordered(v):
    """int32 whose signed order is the order of the float32 values v (-0.0 mapped to +0.0)."""
    b = tl.where(v == 0, 0.0, v).to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)                       # negative floats: flip magnitude bits


@triton.jit
def _key(v, idx, ok):
    """int64 keys of (value, index): larger value first, then smaller index; MIN where not ok."""
    k = (_ordered(v).to(tl.int64) << 32) | (0x7FFFFFFF - idx).to(tl.int64)
    return tl.where(ok, k, _MIN64)


@triton.jit
def _launch_next(PDL: tl.constexpr):
    """Let the next kernel launch now (programmatic dependent launch, Hopper): before its wait (_wait) that
    kernel reads only what was written before this one began (weights, older cache positions)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _wait(PDL: tl.constexpr):
    """Wait for the previous kernel to finish (it waited for its own previous one): its writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _dot_rows(h_ptr, w_ptr, rows, ok, N: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
              PDL: tl.constexpr = False):
    """fp32 dot products (N,) of h with rows `rows` of the (., D) matrix at w_ptr (masked by ok). The first
    tile of weights is loaded before the wait for h (PDL: while the kernel before still runs)."""
    acc = tl.zeros((N,), dtype=tl.float32)
    base = w_ptr + rows.to(tl.int64)[:, None] * D
    offs = tl.arange(0, BLOCK_D)
    w = tl.load(base + offs[None, :], mask=ok[:, None] & (offs < D)[None, :], other=0.0)
    _wait(PDL)
    for d0 in tl.range(0, D, BLOCK_D):
        offs = d0 + tl.arange(0, BLOCK_D)
        hv = tl.load(h_ptr + offs, mask=offs < D, other=0.0).to(tl.float32)
        acc += tl.sum(w.to(tl.float32) * hv[None, :], axis=1)
        offs += BLOCK_D                                       # the next tile (all masked after the last)
        w = tl.load(base + offs[None, :], mask=ok[:, None] & (offs < D)[None, :], other=0.0)
    return acc


@triton.jit
def _running_counts(a, b):
    """Inclusive running counts (int32) of the booleans a and b along a tile, in one scan of int64 sums (each
    count in its own 32 bits: exact for any tile; 16-bit halves of an int32 overflowed at 32,768)."""
    cs = tl.cumsum((a.to(tl.int64) << 32) + b.to(tl.int64), 0)
    hi = cs >> 32
    return hi.to(tl.int32), (cs - (hi << 32)).to(tl.int32)


@triton.jit
def _finish(key, best_ptr, count_ptr, out_ptr, n):
    """Fold this program's best key into *best_ptr; the last of the n programs to arrive writes the
    token and resets best and the counter for the next call."""
    tl.atomic_max(best_ptr, tl.max(key, axis=0))
    tl.debug_barrier()                                        # the max lands before we count ourselves done
    if tl.atomic_add(count_ptr, 1) == n - 1:                  # acq_rel: sees every other program's max
        best = tl.atomic_xchg(best_ptr, _MIN64)
        tl.store(count_ptr, 0)
        tl.store(out_ptr, 0x7FFFFFFF - (best & 0x7FFFFFFF))


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
def _flash_probes(h_ptr, c_ptr, keys_ptr, hist_ptr, slab_ptr, above_ptr, plan_ptr, cand_ptr, probes_ptr,
                  count_ptr, C, P, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr, S: tl.constexpr,
                  TF: tl.constexpr, T: tl.constexpr, PDL: tl.constexpr):
    """Program g scores centroids g*R..g*R+R-1 and files each key under its histogram bin (top 12 bits of
    the score) in a slab of S slots per bin. The last program to finish stores, for the token kernel,
    above_ptr[b] = #clusters in bins above b and plan = (bin of the P-th score, #clusters above it, #in it,
    overflow); on overflow (a bin from that one up holds > S) it selects the top-P ids into probes_ptr.
    PDL: the centroids stream in while the kernel before (the body's last) still runs."""
    _launch_next(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < C
    k = _key(_dot_rows(h_ptr, c_ptr, rows, ok, R, D, BLOCK_D, PDL), rows, ok)
    b = ((k >> 52) + 2048).to(tl.int32)                      # the score's top 12 bits, in order
    slot = tl.atomic_add(hist_ptr + b, 1, mask=ok, sem="relaxed")   # count it; the old count is its slot
    tl.store(slab_ptr + b.to(tl.int64) * S + slot, k, mask=ok & (slot < S))
    tl.store(keys_ptr + rows, k, mask=ok)
    tl.debug_barrier()                                        # all stores and adds land before the count
    if tl.atomic_add(count_ptr, 1) == tl.num_programs(0) - 1:
        tl.store(count_ptr, 0)
        bins = tl.arange(0, _NBINS)
        hist = tl.load(hist_ptr + bins, cache_modifier=".cg")
        tl.store(hist_ptr + bins, tl.zeros_like(hist))        # clean for the next call
        above = C - tl.cumsum(hist, 0)                        # clusters in bins above each bin
        tl.store(above_ptr + bins, above)
        top = tl.sum((above + hist >= P).to(tl.int32), 0) - 1   # the bin holding the P-th largest score
        n_up = tl.sum(tl.where(bins == top, above, 0), 0)     # clusters surely in (< P)
        m = tl.sum(tl.where(bins == top, hist, 0), 0)         # clusters to choose from
        full = tl.max(tl.where(bins >= top, hist, 0), 0) > S  # some were not filed: select here
        j = tl.arange(0, 4)
        tl.store(plan_ptr + j, tl.where(j == 0, top, tl.where(j == 1, n_up, tl.where(j == 2, m, full.to(tl.int32)))))
        if full:
            n_up = n_up * 0
            n_top = n_up * 0
            for t in tl.range(0, C, TF):                      # compact: ids above, candidates of bin top
                i = t + tl.arange(0, TF)
                ki = tl.load(keys_ptr + i, mask=i < C, other=_MIN64, cache_modifier=".cg")
                bi = tl.where(i < C, ((ki >> 52) + 2048).to(tl.int32), -1)
                c_up, c_top = _running_counts(bi > top, bi == top)
                tl.store(probes_ptr + n_up + c_up - 1, i, mask=bi > top)
                u = (ki >> 32).to(tl.int32) ^ -2147483648       # unsigned order of the score
                tl.store(cand_ptr + n_top + c_top - 1, (u.to(tl.uint32).to(tl.int64) << 32) | i,
                         mask=bi == top)
                n_up += tl.sum((bi > top).to(tl.int32), 0)
                n_top += tl.sum((bi == top).to(tl.int32), 0)
            tl.debug_barrier()                                # candidates written before they are read
            _select(cand_ptr, n_top, P - n_up, top.to(tl.uint32) << _SHIFT, probes_ptr + n_up, T)


@triton.jit
def _flash_tokens(h_ptr, w_ptr, c2t_ptr, slab_ptr, above_ptr, plan_ptr, probes_ptr, best_ptr, count_ptr,
                  out_ptr, C, P, D: tl.constexpr, B: tl.constexpr, BP: tl.constexpr, BLOCK_D: tl.constexpr,
                  S: tl.constexpr, PDL: tl.constexpr):
    """Program i scores the tokens of the i-th cluster in score order if it is one of the top P (the
    others leave), the last program the special tokens (row C of c2t, -1 = none); the last of these
    P + 1 to finish writes the token."""
    i = tl.program_id(0)
    _wait(PDL)                                                # the plan of launch 1
    top = tl.load(plan_ptr, cache_modifier=".cg")
    n_up = tl.load(plan_ptr + 1, cache_modifier=".cg")
    m = tl.load(plan_ptr + 2, cache_modifier=".cg")
    full = tl.load(plan_ptr + 3, cache_modifier=".cg") != 0
    up = i < n_up                                             # in a bin above top: taken; find bin, slot
    bins = tl.arange(0, _NBINS)
    above = tl.load(above_ptr + bins, mask=tl.where(up, bins < _NBINS, False), other=0, cache_modifier=".cg")
    b = _NBINS - tl.sum((above <= i).to(tl.int32), 0)         # the lowest bin with <= i clusters above it
    slot = i - tl.sum(tl.where(bins == b, above, 0), 0)
    k_up = tl.load(slab_ptr + b.to(tl.int64) * S + slot, mask=up, other=_MIN64, cache_modifier=".cg")
    cand = (i >= n_up) & (i < n_up + m)                       # in bin top: taken if ranked < P - n_up there
    j = tl.arange(0, S)
    row = tl.load(slab_ptr + top.to(tl.int64) * S + j, mask=tl.where(cand, j < m, False), other=_MIN64,
                  cache_modifier=".cg")
    k_c = tl.sum(tl.where(j == i - n_up, row, 0), 0)
    take = up | (cand & (tl.sum((row > k_c).to(tl.int32), 0) < P - n_up))
    cluster = 0x7FFFFFFF - (tl.where(up, k_up, k_c) & 0x7FFFFFFF)
    listed = tl.load(probes_ptr + i, mask=tl.where(full, i < P, False), other=0)   # selected by kernel 1
    cluster = tl.where(full, listed, cluster)
    take = tl.where(full, i < P, take)
    last = i == tl.num_programs(0) - 1
    if take | last:                                           # P programs take a cluster, one the specials
        row_ptr = c2t_ptr + tl.where(last, C, cluster).to(tl.int64) * B
        jb = tl.arange(0, BP)
        toks = tl.load(row_ptr + jb, mask=jb < B, other=-1).to(tl.int32)
        ok = toks >= 0
        _finish(_key(_dot_rows(h_ptr, w_ptr, toks, ok, BP, D, BLOCK_D), toks, ok), best_ptr, count_ptr, out_ptr,
                P + 1)


@triton.jit
def _dense_argmax(h_ptr, w_ptr, best_ptr, count_ptr, out_ptr, V, D: tl.constexpr, R: tl.constexpr,
                  BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program g scores rows g*R..g*R+R-1 of W; the last program to finish writes the argmax."""
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < V
    _finish(_key(_dot_rows(h_ptr, w_ptr, rows, ok, R, D, BLOCK_D, PDL), rows, ok), best_ptr, count_ptr, out_ptr,
            tl.num_programs(0))


_SCRATCH = {}


def _scratch(device, C, S=1):
    """Per-device state the kernels restore after each call, and per-size scratch; never reallocated
    (a captured graph keeps the addresses)."""
    key = (str(device), C, S)
    if key not in _SCRATCH:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("call flash_greedy_triton / dense_greedy_triton once before graph capture")
        z = lambda n, dt=torch.int32: torch.zeros(n, dtype=dt, device=device)
        _SCRATCH[key] = dict(count=z(2), best=torch.full((1,), -2 ** 63, dtype=torch.int64, device=device),
                             hist=z(_NBINS.value), above=z(_NBINS.value), plan=z(4), keys=z(max(C, 1), torch.int64),
                             slab=z(_NBINS.value * S, torch.int64), probes=z(max(C, 1)), cand=z(max(C, 1), torch.int64))
    return _SCRATCH[key]


MAX_TILE = 1 << 20              # Triton's largest block (elements)


def check_flash_config(C: int, B: int, n_probes: int, c2t_rows: int, S: int, TF: int, T: int) -> None:
    """The host-side check of a Triton FlashHead call: ValueError naming what is out of range. Tiles TF and T
    (the compaction and radix-select scans) are powers of two up to MAX_TILE; their running counts are exact for
    any of them (int64 sums, _running_counts)."""
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ValueError(f"flash_greedy_triton: {msg}")
    need(1 <= n_probes <= C, f"n_probes must be in 1..{C} (the clusters), got {n_probes}")
    need(c2t_rows == C + 1, f"c2t_ext needs {C + 1} rows (the clusters and the special tokens), got {c2t_rows}")
    need(B >= 1, "clusters must hold at least one token")
    for name, v in (("S", S), ("TF", TF), ("T", T)):
        need(v >= 1 and v & (v - 1) == 0, f"{name} must be a power of two, got {v}")
    need(max(TF, T) <= MAX_TILE, f"tiles TF and T hold at most {MAX_TILE} elements, got TF={TF}, T={T}")


@dataclass(frozen=True)
class FlashTuning:
    """Launch settings of the FlashHead kernels: R centroids per program and BLOCK_D their dot products' tile
    (launch 1, `warps` warps); BLOCK_D2 and warps2 for launch 2; S slab slots per bin (a power of 2; the fast
    path needs the P-th score's bin and those above it to hold <= S clusters); TF and T the compaction and
    radix-select scan tiles; pdl: programmatic dependent launch where the GPU has it (launches())."""
    R: int = 16
    BLOCK_D: int = 1024
    BLOCK_D2: int = 1024
    warps: int = 8
    warps2: int = 4
    S: int = 256
    TF: int = 4096
    T: int = 1024
    pdl: bool = True


def has_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA on Hopper or later (not Triton's CPU interpreter)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def launches(device: torch.device, warps: int, pdl: bool = True) -> tuple[bool, dict]:
    """(PDL on?, Triton launch options) for a kernel of `warps` warps on `device`."""
    on = pdl and has_pdl(device)
    return on, dict(num_warps=warps, launch_pdl=True) if on else dict(num_warps=warps)


def flash_greedy_triton(h, W, cents, c2t_ext, n_probes, **tuning):
    """h (1,d) -> token (1,) int64 on the device: FlashHead greedy in two Triton launches.

    W (V,d), cents (c,d) and h contiguous, same dtype; c2t_ext (c+1,b) int64: row k the tokens of
    cluster k, row c the special tokens (-1 pads); any 1 <= n_probes <= c. tuning: FlashTuning's fields."""
    C, D = cents.shape
    B, t = c2t_ext.shape[1], FlashTuning(**tuning)
    check_flash_config(C, B, n_probes, c2t_ext.shape[0], t.S, t.TF, t.T)
    s = _launch_probes(h, cents, n_probes, t)
    out = torch.empty(1, dtype=torch.int64, device=h.device)
    bd = min(t.BLOCK_D, triton.next_power_of_2(D))
    pdl, opts = launches(h.device, t.warps2, t.pdl)
    _flash_tokens[(n_probes + t.S + 1,)](h, W, c2t_ext, s["slab"], s["above"], s["plan"], s["probes"], s["best"],
                                         s["count"][1:], out, C, n_probes, D, B, triton.next_power_of_2(B),
                                         min(t.BLOCK_D2, bd), t.S, pdl, **opts)
    return out


def flash_probes_triton(h, cents, n_probes, **tuning) -> dict:
    """FlashHead's first launch alone (the centroid scores and the probe plan): the scratch it leaves for the
    second, plan (top bin, #clusters above it, #in it, overflow) and, on overflow, probes[:n_probes] (the
    selected clusters, in no particular order). tuning: FlashTuning's fields."""
    t = FlashTuning(**tuning)
    check_flash_config(cents.shape[0], 1, n_probes, cents.shape[0] + 1, t.S, t.TF, t.T)
    return _launch_probes(h, cents, n_probes, t)


def _launch_probes(h, cents, n_probes, t: FlashTuning) -> dict:
    C, D = cents.shape
    s = _scratch(h.device, C, t.S)
    pdl, opts = launches(h.device, t.warps, t.pdl)
    _flash_probes[(triton.cdiv(C, t.R),)](h, cents, s["keys"], s["hist"], s["slab"], s["above"], s["plan"], s["cand"],
                                          s["probes"], s["count"], C, n_probes, D, t.R,
                                          min(t.BLOCK_D, triton.next_power_of_2(D)), t.S,
                                          min(t.TF, triton.next_power_of_2(C)), min(t.T, triton.next_power_of_2(C)),
                                          pdl, **opts)
    return s


def dense_greedy_triton(h, W, R=16, BLOCK_D=1024, warps=4, pdl=True):
    """h (1,d) -> argmax_v h.W[v] as (1,) int64 on the device, ties to the smallest v: one launch (its first
    weights read while the kernel before runs, where the GPU has programmatic dependent launch)."""
    V, D = W.shape
    s = _scratch(h.device, 0)
    out = torch.empty(1, dtype=torch.int64, device=h.device)
    pdl, opts = launches(h.device, warps, pdl)
    _dense_argmax[(triton.cdiv(V, R),)](h, W, s["best"], s["count"], out, V, D, R,
                                        min(BLOCK_D, triton.next_power_of_2(D)), pdl, **opts)
    return out
