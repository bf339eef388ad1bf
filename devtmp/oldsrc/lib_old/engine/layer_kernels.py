"""Triton kernels of a runner's multi-token calls (a target's verify and padded single-token calls, a prefill) on a
GPU, in place of what torch.compile makes of the layer there: attention of n query rows over the static KV cache
(instead of SDPA over the whole cache with a mask), q/k norms with RoPE and the cache write, and RMSNorm with the
residual add (instead of inductor's looped reduction, a few programs that each walk a row in several dependent
steps). Each is a custom op, so the compiled layer calls it without a graph break.

Attention (cached_attention): lib/engine/layer_attention.py.

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
from . import layer_attention  # noqa: F401 (registers study::cached_attention)
from .kernels import _launch_next, _qkv_heads, _wait, launches

NORM_WARPS = 8
GLU_BLOCK, GLU_WARPS = 1024, 4  # columns a SiLU-mul program takes


def supported(device: torch.device, head_dim: int) -> str:
    """Why the kernel cannot run for this device and head size ('' when it can)."""
    if head_dim & (head_dim - 1) or head_dim < 16:
        return f"head_dim {head_dim} is not a power of two of at least 16"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "no GPU (and not under TRITON_INTERPRET=1)"
    return ""


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
        """(1, n, HQ, hd), see layer_attention.cached_attention."""
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
