"""One decoder layer of a Hugging Face Qwen3 or Llama model over a static KV cache, in the module's own arithmetic:
what lib/engine/runner.py calls (compiled or not) for every call but the fused single-token step. Projections are
fused where they can be (q/k/v, gate/up: one matmul each); lib/engine/layer_kernels.py's Triton kernels stand in
for SDPA, the norm modules and RoPE where they can run."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_forward(layer, fused: dict, x: torch.Tensor, at: tuple, kv: tuple, kernels=None) -> torch.Tensor:
    """One decoder layer (Qwen3: q/k RMS norms; Llama: none) on x (1,n,D) at = (positions pos (n,), mask, cos,
    sin), writing K/V into the static cache kv = (k_cache, v_cache), (1,Hkv,max_len,hd) each; mask (n,max_len)
    allows each query its own and earlier positions (SDPA's), or with kernels gives each query's last position (n,),
    -1 for a padding row; cos, sin (n,hd) the rotary tables at pos. kernels: lib/engine/layer_kernels.py's
    TritonLayer in place of SDPA, the norm modules and RoPE."""
    (pos, mask, cos, sin), (k_cache, v_cache) = at, kv
    att = layer.self_attn
    n = x.shape[1]
    h = kernels.norm(layer.input_layernorm, x) if kernels else layer.input_layernorm(x)
    if kernels and fused:                                                       # q/k norms, RoPE, cache: one kernel
        q = kernels.rope_cache(att, project(fused["qkv"], h), cos, sin, kv, pos)
    else:
        q = rope_cache(att, fused, h, cos, sin, kv, pos)
    if kernels:                                                                             # o: (1,n,heads,hd)
        o = kernels.attend(q, k_cache, v_cache, mask)
        x, h = kernels.add_norm(layer.post_attention_layernorm, x, project(att.o_proj, o.reshape(1, n, -1)))
    else:
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask,
                                           enable_gqa=q.shape[1] != k_cache.shape[1]).transpose(1, 2)
        x = project(att.o_proj, o.reshape(1, n, -1), residual=x)
        h = layer.post_attention_layernorm(x)
    return project(layer.mlp.down_proj, gated(layer.mlp, fused, h, kernels), residual=x)


def rope_cache(att, fused: dict, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: tuple,
               pos: torch.Tensor) -> torch.Tensor:
    """q (1,heads,n,hd) of h (1,n,D): the q/k/v projections, q/k RMS norms (Qwen3 only) and RoPE, k and v written into
    the cache kv at pos (lib/engine/layer_kernels.py's rope_cache does it in one kernel)."""
    n, hd = h.shape[1], kv[0].shape[-1]
    if fused:                                                                               # one GEMV for q, k, v
        q, k, v = project(fused["qkv"], h).split(fused["qkv_sizes"], dim=-1)
    else:
        q, k, v = project(att.q_proj, h), project(att.k_proj, h), project(att.v_proj, h)
    q, k, v = q.view(1, n, -1, hd), k.view(1, n, -1, hd), v.view(1, n, -1, hd)
    if hasattr(att, "q_norm"):                                                              # Qwen3 only
        q, k = att.q_norm(q), att.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)                      # (1,heads,n,hd)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    kv[0].index_copy_(2, pos, k)
    kv[1].index_copy_(2, pos, v)
    return q


def gated(mlp, fused: dict, h: torch.Tensor, kernels=None) -> torch.Tensor:
    """act_fn(gate(h)) * up(h); after the fused projection one kernel where `kernels` take the activation."""
    if fused:                                                                               # one GEMV for gate, up
        gate_up = project(fused["gate_up"], h)
        if kernels and kernels.takes_activation(mlp):
            return kernels.silu_mul(gate_up)
        g, u = gate_up.chunk(2, dim=-1)
    else:
        g, u = project(mlp.gate_proj, h), project(mlp.up_proj, h)
    return mlp.act_fn(g) * u


def project(module, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """A projection (plus `residual` where given): a weight tensor (fused plain Linears), a plain Linear or a module
    that says it is `traceable` (lib.models.w4a16's custom op, which adds the residual in its epilogue) is traced
    with the layer; any other quantised module (gptqmodel's AWQ kernels) is called opaquely, since dynamo cannot
    trace their Python wrappers (a ContextVar, a lock): one graph break per call, and torch.compile fuses the
    norms, RoPE and attention between."""
    if residual is not None and getattr(module, "adds_residual", False):
        return module(x, residual)
    if isinstance(module, torch.Tensor):
        y = F.linear(x, module)
    elif type(module) is torch.nn.Linear or getattr(module, "traceable", False):
        y = module(x)
    else:
        y = _opaque(module, x)
    return y if residual is None else residual + y


@torch.compiler.disable
def _opaque(module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


def fuse_projections(layer) -> dict:
    """One projection for q/k/v and one for gate/up, letting one GEMV read each group: plain Linear weights stored
    contiguously (the modules keep views, so nothing is duplicated), or quantised modules whose class can `concat`
    (lib.models.w4a16.Int4Linear: its modules keep views too). Other quantised layers are left alone ({})."""
    att, mlp = layer.self_attn, layer.mlp
    groups = {"qkv": (att.q_proj, att.k_proj, att.v_proj), "gate_up": (mlp.gate_proj, mlp.up_proj)}
    mods = [m for g in groups.values() for m in g]
    plain = all(type(m) is torch.nn.Linear and m.bias is None for m in mods)
    if not plain and not all(type(m) is type(mods[0]) and hasattr(type(m), "concat") for m in mods):
        return {}
    out = {}
    for name, group in groups.items():
        if not _still_views(group, *layer.__dict__.get("fused_" + name, (None, None))):   # else a second runner
            sizes = [m.out_features for m in group]
            layer.__dict__["fused_" + name] = (_concat_weights(group, sizes) if plain else type(group[0]).concat(group),
                                               sizes)
        out[name], out[name + "_sizes"] = layer.__dict__["fused_" + name]
    return out


def _still_views(group, fused, sizes) -> bool:
    """Whether the modules of `group` still hold views of an earlier fusion's tensor: moving or casting the model
    since (`.to`, `.half`) gives each module a tensor of its own and leaves the fused one where it was."""
    if fused is None:
        return False
    if isinstance(fused, torch.Tensor):
        return all(m.weight.data_ptr() == w.data_ptr() for m, w in zip(group, fused.split(sizes)))
    return all(m.words.data_ptr() == w.data_ptr() for m, w in zip(group, fused.words.split(sizes, dim=1)))


def _concat_weights(group, sizes: list[int]) -> torch.Tensor:
    fused = torch.cat([m.weight.data for m in group])
    for m, w in zip(group, fused.split(sizes)):
        m.weight.data = w
    return fused


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)
