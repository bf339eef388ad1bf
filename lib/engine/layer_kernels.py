"""Triton kernels of a runner's multi-token calls (a target's verify and padded single-token calls, a prefill) on a
GPU, in place of what torch.compile makes of the layer there: attention of n query rows over the static KV cache
(instead of SDPA over the whole cache with a mask), q/k norms with RoPE and the cache write, and RMSNorm with the
residual add (instead of inductor's looped reduction, a few programs that each walk a row in several dependent
steps). Each is a custom op, so the compiled layer calls it without a graph break.

Attention: program (h, r, s) takes the G query heads that share KV head h, for query row r, over the cache
positions of split s (S positions from s*S) up to the row's own position (causal): scores of the (G, hd) query
tile against BL positions at a time on the tensor cores, an online softmax in fp32, then (max, sum, weighted V)
stored per query head (a padding row, at position -1, reads nothing and gets zeros). The last of a (h, r)'s NS
programs to finish (a counter) combines the splits in split order; a row whose positions all lie in the first
split (position < S: most of the study's) is written by that split's program at once, acc / l, bitwise what
combining one split gives, with no partials, counter or combination. One
H200, h100awq's target step at position 38, three runners each, interleaved: 8.35-8.38 -> 8.01-8.05 ms for one
token, 8.29-8.31 -> 7.95-7.97 for a verify of 8 (devtmp/direct_ab.py, twenty-fourth session).
Splits and blocks are fixed positions, every reduction runs in a fixed order, and nothing a program computes
depends on the other rows: a row's output is bitwise the same at any row index and in a call of any length,
and blocks past a row's position are not read, so the cost follows the positions in use, not the cache's length.
Launch settings: on one H100 (8 rows at the 32B target's heads, 342 cache positions; devtmp sweep of split 64-256,
block 32-128, 2-8 warps, recorded in the README) splits of 256 in blocks of 128 with 4 warps were fastest, 9.5 us a
call in a graph against 13.4 for splits of 128 in blocks of 64 and 19.9 for SDPA.

q/k norms, RoPE and the cache write (rope_cache): one program a query head and row, in place of the two kernels
torch.compile made of them; on one H100 (h100awq target step, 8 rows, interleaved; experiment record in the README)
8.640 -> 8.551 ms, 64 launches of 2.2 us against 128 of 1.5.

On Hopper each is a programmatic dependent launch (lib/models/w4a16.py says what it gained): it waits for the
kernel before at its top; the attention lets the next kernel launch after its loop, the others at their start.

SiLU(gate) * up after a fused gate/up projection (silu_mul): a kernel of its own, so that it too is a programmatic
dependent launch (torch.compile's fused elementwise kernel was not, and the down projection after it could not launch
early). One H100, h100awq step, interleaved (record 9de11ec): 8.665 -> 8.588 ms at one token, 8.560 -> 8.427 at 8.
Tried there and dropped: these kernels starting the next projection's weights into L2 before their wait (bulk
prefetch under the attention and the norms): 0.19-0.62 ms slower, the small kernels' own reads queued behind it.

RMSNorm: one program a row holds the whole row; with a residual, the sum is stored (the new residual stream) and
normalised. Rounding follows the Hugging Face module: fp32 statistics, normalised row rounded to the dtype, then
times the weight.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..bench import on
from .kernels import COMBINE_CHUNK, _combine_splits, _launch_next, _qkv_heads, _wait, counters, launches

SPLIT = 256                     # cache positions an attention program takes
BLOCK = 128                     # positions a step of its loop scores
WARPS = 4
DIRECT = True                   # a row within the first split written by its program (no combination)
NORM_WARPS = 8
GLU_BLOCK, GLU_WARPS = 1024, 4  # columns a SiLU-mul program takes


@triton.jit
def _layer_attention(q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, ml_ptr, count_ptr, out_ptr, scale, sq_h, sq_n,
                     sk_h, HQ: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr, S: tl.constexpr,
                     BL: tl.constexpr, NS: tl.constexpr, CH: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
                     DIRECT: tl.constexpr):
    _wait(PDL)                                                   # q and the cache written by the kernel before
    h, r, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g, d = tl.arange(0, GP), tl.arange(0, HD)
    heads, real = h * G + g, g < G                               # GP >= 16 rows for the dot: G real ones
    pos = tl.load(pos_ptr + r)
    out_at = out_ptr + (r * HQ + heads)[:, None] * HD + d[None, :]   # the row's output, (GP, HD)
    if pos < 0:                                                  # a padding row (runner.py): attends nothing,
        if s == 0:                                               # its output zeros (finite, unread)
            tl.store(out_at, tl.zeros((GP, HD), out_ptr.dtype.element_ty), mask=real[:, None])
        return
    q = tl.load(q_ptr + heads[:, None] * sq_h + r * sq_n + d[None, :], mask=real[:, None], other=0.0)
    k_at, v_at = k_ptr + h.to(tl.int64) * sk_h, v_ptr + h.to(tl.int64) * sk_h
    m = tl.full((GP,), -float("inf"), tl.float32)
    l = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, HD), tl.float32)
    for b in range(s * S, tl.minimum(s * S + S, pos + 1), BL):   # blocks of positions this row may see
        p = b + tl.arange(0, BL)
        ok = p <= pos
        kt = tl.load(k_at + p[:, None] * HD + d[None, :], mask=ok[:, None], other=0.0)
        vt = tl.load(v_at + p[:, None] * HD + d[None, :], mask=ok[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(kt), input_precision=PREC) * scale
        sc = tl.where(ok[None, :], sc, -float("inf"))
        top = tl.maximum(m, tl.max(sc, 1))                       # finite: a block holds position b <= pos
        e = tl.exp(sc - top[:, None])
        keep = tl.exp(m - top)                                   # 0 before the first block
        l = l * keep + tl.sum(e, 1)
        acc = acc * keep[:, None] + tl.dot(e.to(vt.dtype), vt, input_precision=PREC)
        m = top
    _launch_next(PDL)                                            # our scores done: the o-projection may launch
    if DIRECT and pos < S:                                       # split 0 holds every position the row sees:
        if s == 0:                                               # its output is acc / l, what the combination
            o = acc / l[:, None]                                 # of one split gives bitwise; no partials, no count
            tl.store(out_at, o.to(out_ptr.dtype.element_ty), mask=real[:, None])
        return
    at = (r * HQ + heads) * NS + s                               # (row, head, split): a split past pos stores
    tl.store(ml_ptr + at * 2, m, mask=real)                      # max -inf, sum 0, weighted V 0
    tl.store(ml_ptr + at * 2 + 1, l, mask=real)
    tl.store(part_ptr + at[:, None] * HD + d[None, :], acc, mask=real[:, None])
    tl.debug_barrier()                                           # partials stored before we count ourselves
    tile = r * tl.num_programs(0) + h
    if tl.atomic_add(count_ptr + tile, 1) == NS - 1:             # acq_rel: the last sees every partial
        tl.store(count_ptr + tile, 0)                            # ready for the next call
        for j in tl.static_range(G):                             # the splits that hold positions
            o = _combine_splits(ml_ptr, part_ptr, (r * HQ + h * G + j) * NS, pos // S + 1, d, CH)
            tl.store(out_ptr + (r * HQ + h * G + j) * HD + d, o.to(out_ptr.dtype.element_ty))


def supported(device: torch.device, head_dim: int) -> str:
    """Why the kernel cannot run for this device and head size ('' when it can)."""
    if head_dim & (head_dim - 1) or head_dim < 16:
        return f"head_dim {head_dim} is not a power of two of at least 16"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "no GPU (and not under TRITON_INTERPRET=1)"
    return ""


def cached_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                     split: int = SPLIT, block: int = BLOCK, direct: bool = DIRECT) -> torch.Tensor:
    """q (1, HQ, n, hd) of queries at positions pos (n,) over caches (1, Hkv, L, hd), each query attending its own
    and earlier positions (at -1: a padding row, attending nothing, its output zeros) -> (1, n, HQ, hd) in q's dtype
    (the layout the o-projection reads). direct=False combines every row's splits (the tests' reference for the
    direct rows)."""
    _, HQ, n, HD = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    if HQ % Hkv or HD & (HD - 1) or split % block or k_cache.shape != v_cache.shape:
        raise ValueError(f"cached_attention: {HQ} query heads over {Hkv} KV heads, head_dim {HD} (a power of two), "
                         f"split {split} (a multiple of {block}), caches {tuple(k_cache.shape)} {tuple(v_cache.shape)}")
    if k_cache.stride()[1:] != (L * HD, HD, 1) or v_cache.stride() != k_cache.stride():
        raise ValueError("cached_attention: the caches must be contiguous per KV head")
    q = q if q.stride(-1) == 1 else q.contiguous()
    G, ns = HQ // Hkv, triton.cdiv(L, split)
    out = torch.empty(1, n, HQ, HD, dtype=q.dtype, device=q.device)
    part = torch.empty(n, HQ, ns, HD, dtype=torch.float32, device=q.device)
    ml = torch.empty(n, HQ, ns, 2, dtype=torch.float32, device=q.device)
    count = counters(q.device, n * Hkv, "attention")
    pdl, opts = launches(q.device, WARPS)
    with on(q.device):                                           # Triton launches on the current device
        _layer_attention[(Hkv, n, ns)](q, k_cache, v_cache, pos, part, ml, count, out, HD ** -0.5, q.stride(1),
                                       q.stride(2), L * HD, HQ, G, max(16, triton.next_power_of_2(G)), HD, split,
                                       block, ns, min(triton.next_power_of_2(ns), COMBINE_CHUNK),
                                       "ieee" if q.dtype == torch.float32 else "tf32", pdl, direct, **opts)
    return out


@torch.library.custom_op("study::cached_attention", mutates_args=())
def _cached_attention_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         pos: torch.Tensor) -> torch.Tensor:
    return cached_attention(q, k_cache, v_cache, pos)


@_cached_attention_op.register_fake
def _(q, k_cache, v_cache, pos):
    return q.new_empty(1, q.shape[2], q.shape[1], q.shape[3])


@triton.jit
def _layer_rope_cache(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, q_ptr, eps, L, row,
                      HQ: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    """Program (r, a): query head a of row r (of the q/k/v projection's rows, `row` apart) RMS-normed (Qwen3) and
    rotated into q (n, HQ, HD); the first query head of each KV head also writes that head's k (normed, rotated)
    and v into the caches at the row's position."""
    _launch_next(PDL)
    _wait(PDL)
    r, a = tl.program_id(0), tl.program_id(1)
    h, d = a // G, tl.arange(0, HD)
    rot = (d + HD // 2) % HD
    cos = tl.load(cos_ptr + r * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + r * HD + d).to(tl.float32)
    qn, qn_rot = tl.load(qn_ptr + d), tl.load(qn_ptr + rot)
    kn, kn_rot = tl.load(kn_ptr + d), tl.load(kn_ptr + rot)
    k, v, q = _qkv_heads(qkv_ptr + r * row, (HQ + h) * HD, (HQ + HQ // G + h) * HD, a * HD, kn, kn_rot, qn, qn_rot,
                         cos, sin, eps, HD, NORM)
    tl.store(q_ptr + (r * HQ + a) * HD + d, q)
    if a % G == 0:
        at = (h.to(tl.int64) * L + tl.load(pos_ptr + r)) * HD + d
        tl.store(kc_ptr + at, k)
        tl.store(vc_ptr + at, v)


def rope_cache(qkv: torch.Tensor, norms: list[torch.Tensor], rope: list[torch.Tensor], caches: list[torch.Tensor],
               pos: torch.Tensor, eps: float) -> torch.Tensor:
    """qkv (1, n, (HQ + 2 Hkv) hd), a q/k/v projection's output: q and k RMS-normed with norms = [q_norm, k_norm]
    (Qwen3; []: Llama) and rotated by rope = [cos, sin] (n, hd) (RoPE, rotate-half, in fp32, rounded once); k and v
    written into caches = [k_cache, v_cache] (1, Hkv, L, hd) at positions pos (n,). Returns q (1, HQ, n, hd), the
    layout attention reads."""
    (cos, sin), (k_cache, v_cache) = rope, caches
    n, (_, Hkv, L, HD) = qkv.shape[1], k_cache.shape
    heads = qkv.shape[2] // HD - 2 * Hkv
    if heads < Hkv or heads % Hkv or qkv.shape[2] % HD or k_cache.stride()[1:] != (L * HD, HD, 1):
        raise ValueError(f"rope_cache: q/k/v of {qkv.shape[2]} columns for {Hkv} KV heads of {HD} (and a multiple "
                         f"of them for q), caches {tuple(k_cache.shape)} contiguous per KV head")
    qkv = qkv.contiguous()
    q = torch.empty(1, n, heads, HD, dtype=qkv.dtype, device=qkv.device)
    qn, kn = norms or (cos, cos)
    pdl, opts = launches(qkv.device, 1)
    with on(qkv.device):
        _layer_rope_cache[(n, heads)](qkv, qn, kn, cos.contiguous(), sin.contiguous(), k_cache, v_cache, pos, q, eps,
                                      L, qkv.stride(1), heads, heads // Hkv, HD, bool(norms), pdl, **opts)
    return q.transpose(1, 2)


@torch.library.custom_op("study::rope_cache", mutates_args=("caches",))
def _rope_cache_op(qkv: torch.Tensor, norms: list[torch.Tensor], rope: list[torch.Tensor], caches: list[torch.Tensor],
                   pos: torch.Tensor, eps: float) -> torch.Tensor:
    return rope_cache(qkv, norms, rope, caches, pos, eps)


@_rope_cache_op.register_fake
def _(qkv, norms, rope, caches, pos, eps):
    hd, hkv = caches[0].shape[-1], caches[0].shape[1]
    return qkv.new_empty(1, qkv.shape[1], qkv.shape[2] // hd - 2 * hkv, hd).transpose(1, 2)


@triton.jit
def _layer_rms_norm(x_ptr, y_ptr, w_ptr, sum_ptr, out_ptr, eps, D, BD: tl.constexpr, ADD: tl.constexpr,
                    PDL: tl.constexpr):
    """Row r: out = w * RMSNorm(x (+ y)), the sum stored to sum_ptr where ADD."""
    _launch_next(PDL)
    _wait(PDL)
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BD)
    ok = d < D
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    x = tl.load(x_ptr + r * D + d, mask=ok, other=0.0)
    if ADD:                                                      # fp32 sum, rounded: the residual stream
        x = (x.to(tl.float32) + tl.load(y_ptr + r * D + d, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + r * D + d, x, mask=ok)
    xf = x.to(tl.float32)
    h = (xf * tl.rsqrt(tl.sum(xf * xf, 0) / D + eps)).to(x.dtype)
    tl.store(out_ptr + r * D + d, (w.to(tl.float32) * h.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, y: torch.Tensor | None = None) -> tuple:
    """(w * RMSNorm(s), s) over the last dimension, s = x + y (x where y is None; then s is x itself)."""
    D = x.shape[-1]
    x = x.contiguous()
    s = x if y is None else torch.empty_like(x)
    out = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    pdl, opts = launches(x.device, NORM_WARPS)
    with on(x.device):
        _layer_rms_norm[(x.numel() // D,)](x, x if y is None else y.contiguous(), weight, s, out, eps, D,
                                           triton.next_power_of_2(D), y is not None, pdl, **opts)
    return out, s


@torch.library.custom_op("study::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm(x, weight, eps)[0]


@_rms_norm_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, dtype=weight.dtype)


@torch.library.custom_op("study::add_rms_norm", mutates_args=())
def _add_rms_norm_op(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor,
                                                                                                     torch.Tensor]:
    return rms_norm(x, weight, eps, y)


@_add_rms_norm_op.register_fake
def _(x, y, weight, eps):
    return torch.empty_like(x, dtype=weight.dtype), torch.empty_like(x)


@triton.jit
def _layer_silu_mul(gu_ptr, out_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Row r, block b of columns: out = SiLU(gate) * up, gate and up the two halves of the gate/up projection's row,
    each rounded as the modules round them (SiLU in fp32, rounded to the dtype; then the product)."""
    _launch_next(PDL)
    _wait(PDL)
    r, c = tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < N
    gate = tl.load(gu_ptr + r * 2 * N + c, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + r * 2 * N + N + c, mask=ok, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + r * N + c, (act.to(tl.float32) * up.to(tl.float32)).to(up.dtype), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of a gate/up projection's output (..., 2N) whose last dimension holds gate then up."""
    N = gate_up.shape[-1] // 2
    gate_up = gate_up.contiguous()
    out = torch.empty(*gate_up.shape[:-1], N, dtype=gate_up.dtype, device=gate_up.device)
    pdl, opts = launches(gate_up.device, GLU_WARPS)
    with on(gate_up.device):
        _layer_silu_mul[(gate_up.numel() // (2 * N), triton.cdiv(N, GLU_BLOCK))](gate_up, out, N, GLU_BLOCK, pdl,
                                                                                **opts)
    return out


@torch.library.custom_op("study::silu_mul", mutates_args=())
def _silu_mul_op(gate_up: torch.Tensor) -> torch.Tensor:
    return silu_mul(gate_up)


@_silu_mul_op.register_fake
def _(gate_up):
    return gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)


class TritonLayer:
    """What lib/engine/layer.py's layer_forward calls in place of SDPA, the norm modules and RoPE."""

    @staticmethod
    def rope_cache(att, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: tuple,
                   pos: torch.Tensor) -> torch.Tensor:
        """q (1, HQ, n, hd) of the attention module `att` (its q/k norms where it has them), k and v cached."""
        qk = hasattr(att, "q_norm")                               # Qwen3 (q_norm and k_norm share their eps)
        norms, eps = ([att.q_norm.weight, att.k_norm.weight], att.q_norm.variance_epsilon) if qk else ([], 0.0)
        return torch.ops.study.rope_cache(qkv, norms, [cos, sin], list(kv), pos, eps)

    @staticmethod
    def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """(1, n, HQ, hd), see cached_attention."""
        return torch.ops.study.cached_attention(q, k_cache, v_cache, pos)

    @staticmethod
    def norm(module, x: torch.Tensor) -> torch.Tensor:
        """A Hugging Face RMSNorm module (weight, variance_epsilon) applied to x."""
        return torch.ops.study.rms_norm(x, module.weight, module.variance_epsilon)

    @staticmethod
    def add_norm(module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, module(x + y)) in one kernel."""
        h, s = torch.ops.study.add_rms_norm(x, y, module.weight, module.variance_epsilon)
        return s, h

    @staticmethod
    def takes_activation(mlp) -> bool:
        """Whether silu_mul is the MLP's act_fn(gate) * up (its activation is SiLU)."""
        return getattr(getattr(mlp, "config", None), "hidden_act", None) == "silu"

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of a fused gate/up projection's output, see silu_mul."""
        return torch.ops.study.silu_mul(gate_up)
