"""The fused decode step's attention (decode.py): for one token, q/k RMS norms (Qwen3), RoPE, the K/V cache write
and split-KV single-query attention over fixed splits of S positions, at most P programs a query head, each folding
its splits in split order; the last program of a query head to finish combines the programs' partials.
"""
import triton
import triton.language as tl

from lib.engine.kernels import _combine_splits, _launch_next, _qkv_heads, _wait


@triton.jit
def _decode_attention(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, part_ptr, ml_ptr,
                      count_ptr, out_ptr, eps, scale, HQ: tl.constexpr, G: tl.constexpr, HD: tl.constexpr,
                      S: tl.constexpr, P, CH: tl.constexpr, L, NORM: tl.constexpr, PDL: tl.constexpr,
                      ROW: tl.constexpr, FOLD: tl.constexpr, WIDE: tl.constexpr = False):
    """Program (a, s): query head a (of KV head h = a // G), splits s, s + P, s + 2P, ... of S positions of the
    L-position cache up to the new position's. Older positions come from the cache, the new one from this step's k, v
    (which h's first query head's program owning it caches). Each split's (max, sum, weighted V) is folded into the
    program's running ones in split order, FOLD further splits' tiles loaded at once; the last of the P programs of a
    to finish combines the live ones' in program order (up to P splits: one split a program, a one-level
    combination, no fold). P does not depend on L past PROGRAMS splits, so neither does a position's output. ROW 1:
    the second token of a two-token step, one position on, whose previous position the launch before this one (ROW
    0) cached: its tile is read after the wait."""
    _launch_next(PDL)
    a, s, h = tl.program_id(0), tl.program_id(1), tl.program_id(0) // G
    d = tl.arange(0, HD)
    rot = (d + HD // 2) % HD
    pos = tl.load(pos_ptr) + ROW                                  # the step's position, set before it began
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    qn, qn_rot = tl.load(qn_ptr + d), tl.load(qn_ptr + rot)       # weights: read before the wait too
    kn, kn_rot = tl.load(kn_ptr + d), tl.load(kn_ptr + rot)
    kc, vc = kc_ptr + h.to(tl.int64) * L * HD, vc_ptr + h.to(tl.int64) * L * HD
    p = s * S + tl.arange(0, S)
    if ROW == 0:                                                  # cached by earlier steps: read before the wait
        kt, vt = _cache_tile(kc, vc, p, pos, d, HD)
    _wait(PDL)                                                    # q, k, v of this step
    if ROW == 1:
        kt, vt = _cache_tile(kc, vc, p, pos, d, HD)
    if s * S <= pos:                                              # programs past the new position: nothing to do
        k, v, q = _qkv_heads(qkv_ptr, (HQ + h) * HD, (HQ + HQ // G + h) * HD, a * HD, kn, kn_rot, qn, qn_rot,
                             cos, sin, eps, HD, NORM)
        if (a % G == 0) & ((pos // S) % P == s):                  # the new position is ours: cache it
            tl.store(kc + pos * HD + d, k)
            tl.store(vc + pos * HD + d, v)
        qf, vf = q.to(tl.float32), v.to(tl.float32)
        sn = tl.sum(k.to(tl.float32) * qf, 0) * scale            # the new position apart from the cached tile
        m, l, acc = _split(kt, vt, s * S, pos, sn, qf, vf, scale, S)   # up to P splits: the program's only one
        for b in range(s * S + P * S, pos + 1, FOLD * P * S):   # more: the further ones, FOLD tiles loaded at once
            k1, v1 = _cache_tile(kc, vc, b + tl.arange(0, S), pos, d, HD)
            if FOLD == 2:
                k2, v2 = _cache_tile(kc, vc, b + P * S + tl.arange(0, S), pos, d, HD)   # (none past pos)
            m, l, acc = _fold(m, l, acc, k1, v1, b, pos, sn, qf, vf, scale, S)
            if FOLD == 2:
                m, l, acc = _fold(m, l, acc, k2, v2, b + P * S, pos, sn, qf, vf, scale, S)
        tl.store(ml_ptr + (a * P + s) * 2, m)
        tl.store(ml_ptr + (a * P + s) * 2 + 1, l)
        tl.store(part_ptr + (a * P + s) * HD + d, acc)
    tl.debug_barrier()                                            # partials stored before we count ourselves
    if tl.atomic_add(count_ptr + a, 1) == P - 1:                  # acq_rel: the last sees every partial
        tl.store(count_ptr + a, 0)
        o = _combine_splits(ml_ptr, part_ptr, a * P, tl.minimum(pos // S + 1, P), d, CH)
        tl.store(out_ptr + a * HD + d, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _split(kt, vt, b, pos, sn, qf, vf, scale, S: tl.constexpr):
    """One split's (max, sum, weighted V) over positions b..b+S-1 up to pos: the cached tile (K, V rows, zero from
    pos on) and the new position's score sn and value vf apart. A split wholly past pos gives (-inf, 0, 0)."""
    at = b + tl.arange(0, S)
    ok = at <= pos
    sc = tl.where(ok, tl.where(at == pos, sn, tl.sum(kt.to(tl.float32) * qf[None, :], 1) * scale), -float("inf"))
    m = tl.max(sc, 0)
    e = tl.where(ok, tl.exp(sc - m), 0.0)
    new = tl.where((b <= pos) & (pos < b + S), tl.exp(sn - m), 0.0)    # the new position's weight, in this split
    return m, tl.sum(e, 0), tl.sum(e[:, None] * vt.to(tl.float32), 0) + new * vf


@triton.jit
def _fold(m, l, acc, kt, vt, b, pos, sn, qf, vf, scale, S: tl.constexpr):
    """Running (max, sum, weighted V) with the split from b folded in (splits in order)."""
    ms, ls, vs = _split(kt, vt, b, pos, sn, qf, vf, scale, S)
    top = tl.maximum(m, ms)
    keep, w = tl.exp(m - top), tl.exp(ms - top)
    return top, l * keep + w * ls, acc * keep + w * vs


@triton.jit
def _cache_tile(kc, vc, p, pos, d, HD: tl.constexpr):
    """K and V rows (S, HD) of positions p of one KV head's cache, zero from the new position on."""
    old = (p < pos)[:, None]
    return (tl.load(kc + p[:, None] * HD + d[None, :], mask=old, other=0.0),
            tl.load(vc + p[:, None] * HD + d[None, :], mask=old, other=0.0))
