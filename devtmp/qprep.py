"""Experiment (issue 26, for the next session's device time): the query's RMS norm and RoPE inside the layer
attention kernel, so that the compiled layer no longer has a kernel for them (the 'per_..._cached_attention' fusion,
1.8 us a layer in the h100awq target step at f0cc885). `install()` swaps lib.engine.runner.layer_forward for the
variant below before a Runner is built. Not in lib/: unmeasured on a GPU."""
import torch
import triton
import triton.language as tl

from lib.bench import on
from lib.engine import runner as R
from lib.engine.kernels import counters
from lib.engine.layer_kernels import BLOCK, SPLIT, WARPS


@triton.jit
def _attention_q(q_ptr, qn_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, ml_ptr, count_ptr, out_ptr, scale,
                 eps, sq_h, sq_n, sk_h, HQ: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, HD: tl.constexpr,
                 S: tl.constexpr, BL: tl.constexpr, NS: tl.constexpr, NSP: tl.constexpr, PREC: tl.constexpr,
                 NORM: tl.constexpr):
    h, r, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g, d = tl.arange(0, GP), tl.arange(0, HD)
    rot = (d + HD // 2) % HD
    heads, real = h * G + g, g < G
    pos = tl.load(pos_ptr + r)
    at_q = q_ptr + heads[:, None] * sq_h + r * sq_n
    q = tl.load(at_q + d[None, :], mask=real[:, None], other=0.0)           # raw projections
    qr = tl.load(at_q + rot[None, :], mask=real[:, None], other=0.0)
    DT = q.dtype
    if NORM:                                                                  # the module: fp32 rstd, rounded, times w
        qf = q.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(qf * qf, 1) / HD + eps)[:, None]
        q = ((qf * rstd).to(DT).to(tl.float32) * tl.load(qn_ptr + d).to(tl.float32)[None, :]).to(DT)
        qr = ((qr.to(tl.float32) * rstd).to(DT).to(tl.float32) * tl.load(qn_ptr + rot).to(tl.float32)[None, :]).to(DT)
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    half = tl.where(d < HD // 2, -qr.to(tl.float32), qr.to(tl.float32))        # rotate_half
    q = (q.to(tl.float32) * cos[None, :] + half * sin[None, :]).to(DT)
    k_at, v_at = k_ptr + h.to(tl.int64) * sk_h, v_ptr + h.to(tl.int64) * sk_h
    m = tl.full((GP,), -float("inf"), tl.float32)
    l = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, HD), tl.float32)
    for b in range(s * S, tl.minimum(s * S + S, pos + 1), BL):
        p = b + tl.arange(0, BL)
        ok = p <= pos
        kt = tl.load(k_at + p[:, None] * HD + d[None, :], mask=ok[:, None], other=0.0)
        vt = tl.load(v_at + p[:, None] * HD + d[None, :], mask=ok[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(kt), input_precision=PREC) * scale
        sc = tl.where(ok[None, :], sc, -float("inf"))
        top = tl.maximum(m, tl.max(sc, 1))
        e = tl.exp(sc - top[:, None])
        keep = tl.exp(m - top)
        l = l * keep + tl.sum(e, 1)
        acc = acc * keep[:, None] + tl.dot(e.to(vt.dtype), vt, input_precision=PREC)
        m = top
    at = (r * HQ + heads) * NS + s
    tl.store(ml_ptr + at * 2, m, mask=real)
    tl.store(ml_ptr + at * 2 + 1, l, mask=real)
    tl.store(part_ptr + at[:, None] * HD + d[None, :], acc, mask=real[:, None])
    tl.debug_barrier()
    tile = r * tl.num_programs(0) + h
    if tl.atomic_add(count_ptr + tile, 1) == NS - 1:
        tl.store(count_ptr + tile, 0)
        sp = tl.arange(0, NSP)
        live = (sp < NS) & (sp * S <= pos)
        for j in tl.static_range(G):
            row = (r * HQ + h * G + j) * NS + sp
            ms = tl.load(ml_ptr + row * 2, mask=live, other=-float("inf"), cache_modifier=".cg")
            ls = tl.load(ml_ptr + row * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
            vs = tl.load(part_ptr + row[:, None] * HD + d[None, :], mask=live[:, None], other=0.0, cache_modifier=".cg")
            w = tl.exp(ms - tl.max(ms, 0))
            o = tl.sum(w[:, None] * vs, 0) / tl.sum(w * ls, 0)
            tl.store(out_ptr + (r * HQ + h * G + j) * HD + d, o.to(out_ptr.dtype.element_ty))


def attention_q(q, qn, cos_table, sin_table, k_cache, v_cache, pos, eps):
    """q (1, HQ, n, hd): the raw projections (before the q norm and RoPE); qn the q norm's weight (or None)."""
    _, HQ, n, HD = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G, ns = HQ // Hkv, triton.cdiv(L, SPLIT)
    out = torch.empty(1, n, HQ, HD, dtype=q.dtype, device=q.device)
    part = torch.empty(n, HQ, ns, HD, dtype=torch.float32, device=q.device)
    ml = torch.empty(n, HQ, ns, 2, dtype=torch.float32, device=q.device)
    count = counters(q.device, n * Hkv, "attention")
    with on(q.device):
        _attention_q[(Hkv, n, ns)](q, q if qn is None else qn, cos_table, sin_table, k_cache, v_cache, pos, part, ml,
                                   count, out, HD ** -0.5, eps, q.stride(1), q.stride(2), L * HD, HQ, G,
                                   max(16, triton.next_power_of_2(G)), HD, SPLIT, BLOCK, ns,
                                   triton.next_power_of_2(ns), "ieee" if q.dtype == torch.float32 else "tf32",
                                   qn is not None, num_warps=WARPS)
    return out


@torch.library.custom_op("qprep::attention", mutates_args=())
def _op(q: torch.Tensor, qn: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
        v_cache: torch.Tensor, pos: torch.Tensor, eps: float, norm: bool) -> torch.Tensor:
    return attention_q(q, qn if norm else None, cos, sin, k_cache, v_cache, pos, eps)


@_op.register_fake
def _(q, qn, cos, sin, k_cache, v_cache, pos, eps, norm):
    return q.new_empty(1, q.shape[2], q.shape[1], q.shape[3])


TABLES = {}                          # the runner's full cos/sin tables, set by install()


def layer_forward(layer, fused, x, at, kv, kernels=None):
    if not kernels:
        return ORIGINAL(layer, fused, x, at, kv, kernels)
    (pos, mask, cos, sin), (k_cache, v_cache) = at, kv
    att = layer.self_attn
    n, hd = x.shape[1], k_cache.shape[-1]
    h = kernels.norm(layer.input_layernorm, x)
    q, k, v = R.project(fused["qkv"], h).split(fused["qkv_sizes"], dim=-1)
    q, k, v = q.view(1, n, -1, hd), k.view(1, n, -1, hd), v.view(1, n, -1, hd)
    norm = hasattr(att, "q_norm")
    if norm:
        k = att.k_norm(k)
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    k = k * cos + R.rotate_half(k) * sin
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    qn = att.q_norm.weight if norm else x
    eps = att.q_norm.variance_epsilon if norm else 0.0
    o = torch.ops.qprep.attention(q.transpose(1, 2), qn, TABLES["cos"], TABLES["sin"], k_cache, v_cache, pos, eps, norm)
    x, h = kernels.add_norm(layer.post_attention_layernorm, x, R.project(att.o_proj, o.reshape(1, n, -1)))
    mlp = layer.mlp
    g, u = R.project(fused["gate_up"], h).chunk(2, dim=-1)
    return R.project(mlp.down_proj, mlp.act_fn(g) * u, residual=x)


ORIGINAL = R.layer_forward


def install(model, max_len, rows):
    """Swap the layer function (before building the Runner); the cos/sin tables are the runner's (built the same way)."""
    dev, dt = model.get_output_embeddings().weight.device, model.get_output_embeddings().weight.dtype
    arange = torch.arange(max_len + rows, device=dev)
    c, s = model.model.rotary_emb(torch.zeros(1, dtype=dt, device=dev), arange[None])
    TABLES.update(cos=c[0].to(dt).contiguous(), sin=s[0].to(dt).contiguous())
    R.layer_forward = layer_forward
