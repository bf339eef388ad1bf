"""Fused decode of one token (or two: a round's catch-up) through a Qwen3 or Llama body (Triton): five
bandwidth-bound kernels a layer.

  _decode_gemv (norm)       RMSNorm of the residual stream, then the fused q/k/v GEMV (layer 0: of the token's
                            embedding row, which it also writes as the residual stream's start)
  _decode_attention         (decode_attention.py) q/k RMS norms (Qwen3), RoPE, the K/V cache write and
                            split-KV single-query attention; the last program of a query head to finish combines
  _decode_gemv (residual)   o-projection GEMV added to the residual stream
  _decode_gemv (norm, glu)  RMSNorm, gate/up GEMV, SiLU(gate) * up
  _decode_gemv (residual)   down-projection GEMV added to the residual stream

On Hopper every kernel is a programmatic dependent launch that lets the next one launch at its start; each
GEMV program holds BN whole weight rows, issues their loads, and only then waits for the kernel before it, so
the weights of the next kernels stream in while one finishes (the attention reads the older cache positions
before its wait the same way). What a program reads after its wait it reads at once (activations, residual;
the o-projection's activations once its first weights are in: LATE_ACTIVATIONS): the step is a chain of dependent
kernels, each one's latency after its wait on the critical path. The attention's splits (a fixed number of positions)
go to at most PROGRAMS programs a query head, and every reduction runs in a fixed order: a position's output does
not depend on the cache's length, and a long cache launches no more programs than a short one.
Two tokens: each GEMV program reads its weights once and computes both tokens' rows (their loads issued together
after the wait), the attention is launched once a token (the second one position on, its cache tile read after its
wait, since the first token's launch writes an entry of it), and the final norm takes a program a token: six
kernels a layer, each token's arithmetic that of its single-token step (bitwise). On one H100 (h100awq's fp16 draft,
ae18cf5): 0.750 ms against 0.606 for one token and 1.109 for two single-token steps.
Arithmetic follows the Hugging Face modules: fp32 norms rounded to the weights' dtype before the weight
multiplies, fp32 dot products; rounding points differ in places (RoPE in fp32 then rounded once), so the
path is checked against the reference when a runner is built (check below) and the runner records which ran.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..bench import on
from .decode_attention import _decode_attention
from .kernels import COMBINE_CHUNK, _after_wait, _launch_next, _wait, launches

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"          # Triton's CPU interpreter (tests)


@triton.jit
def _decode_gemv(x_ptr, g_ptr, w_ptr, out_ptr, ids_ptr, res_ptr, eps, N, K: tl.constexpr, BK: tl.constexpr,
                 BN: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, EMBED: tl.constexpr,
                 PDL: tl.constexpr, T: tl.constexpr, LATE: tl.constexpr):
    """out[t, rows] = W[rows] @ a_t for BN rows a program and each of the T (1 or 2) tokens t; a_t = RMSNorm(x_t) * g
    if NORM else x_t. GLU: W holds gate rows then up rows (2N, K) and out = silu(gate) * up. RESIDUAL:
    out[t, rows] += (out is the residual stream). EMBED (the first layer's q/k/v): x_t is row ids[t] of the
    embedding table at x_ptr, which program 0 also writes to res_ptr as the residual stream's start (no lookup kernel
    of its own between the head and this one). Two tokens read the weights once. LATE: see LATE_ACTIVATIONS."""
    _launch_next(PDL)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BK)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    u = w
    if GLU:
        u = tl.load(w_ptr + (rows + N).to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    g = cols
    if NORM:
        g = tl.load(g_ptr + cols, mask=cols < K, other=0.0)      # a weight too: read before the wait
    _wait(PDL)                                                    # weights in flight; now the activations
    if LATE:
        x_ptr = _after_wait(x_ptr, PDL)
    x, res = _gemv_input(x_ptr, ids_ptr, res_ptr, out_ptr, rows, cols, 0, N, K, RESIDUAL, EMBED)
    if T == 2:                                                    # both tokens' loads issued before any sum
        x1, res1 = _gemv_input(x_ptr, ids_ptr, res_ptr, out_ptr, rows, cols, 1, N, K, RESIDUAL, EMBED)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, _gemv_output(x, res, w, u, g, eps, K, NORM, GLU, RESIDUAL, DT), mask=rows < N)
    if T == 2:
        tl.store(out_ptr + N + rows, _gemv_output(x1, res1, w, u, g, eps, K, NORM, GLU, RESIDUAL, DT), mask=rows < N)


@triton.jit
def _gemv_input(x_ptr, ids_ptr, res_ptr, out_ptr, rows, cols, t, N, K: tl.constexpr, RESIDUAL: tl.constexpr,
                EMBED: tl.constexpr):
    """Token t's activations (BK,) and, where RESIDUAL, its residual-stream entries at rows (issued beside them,
    not after the dot)."""
    if EMBED:
        x = tl.load(x_ptr + tl.load(ids_ptr + t) * K + cols, mask=cols < K, other=0.0)
        if tl.program_id(0) == 0:
            tl.store(res_ptr + t * K + cols, x, mask=cols < K)
    else:
        x = tl.load(x_ptr + t * K + cols, mask=cols < K, other=0.0)
    res = rows
    if RESIDUAL:
        res = tl.load(out_ptr + t * N + rows, mask=rows < N)
    return x, res


@triton.jit
def _gemv_output(x, res, w, u, g, eps, K: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr,
                 RESIDUAL: tl.constexpr, DT: tl.constexpr):
    if NORM:                                                      # HF RMSNorm: fp32, to dtype, times weight
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
        x = (xf * r).to(x.dtype) * g
    xf = x.to(tl.float32)[None, :]
    y = tl.sum(w.to(tl.float32) * xf, 1).to(DT)
    if GLU:                                                       # act_fn(gate) * up, each rounded as HF does
        gate = y.to(tl.float32)
        up = tl.sum(u.to(tl.float32) * xf, 1).to(DT)
        y = (gate / (1.0 + tl.exp(-gate))).to(up.dtype) * up
    if RESIDUAL:
        y = (res.to(tl.float32) + y.to(tl.float32)).to(DT)
    return y


@triton.jit
def _decode_norm(x_ptr, g_ptr, out_ptr, eps, K: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    """The final RMSNorm of token t's residual stream, program t (the head's kernels may launch at once: see
    kernels.py)."""
    _launch_next(PDL)
    cols = tl.arange(0, BK)
    at = tl.program_id(0) * K + cols
    _wait(PDL)
    x = tl.load(x_ptr + at, mask=cols < K, other=0.0)
    xf = x.to(tl.float32)
    r = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    tl.store(out_ptr + at, (xf * r).to(x.dtype) * tl.load(g_ptr + cols, mask=cols < K), mask=cols < K)


# Launch settings (history in outputs/GPU_RUNS.md). On one H100, body step as Runner.chain runs it, position 300:
# GEMV programs of 8 KB of weights a warp, attention splits of 16 positions and 1 warp: 0.636 -> 0.593 ms (fdff1be);
# the residual read beside the activations 0.609 -> 0.564, one query head an attention program 0.534 (afc4534); a
# done counter per kernel 0.995; bulk-prefetching the next kernels' weights into L2 slower (95f292b); q, k, v in one
# round trip 0.537 -> 0.516 (015a50c); the new position's score apart from the cached tile 0.515 -> 0.507; the
# embedding row read by layer 0's q/k/v GEMV: K = 6 block 0.615 -> 0.611 ms dense, 0.528 -> 0.521 FlashHead. A
# per-program globaltimer trace (c5e78a8) showed the down projection's weights streaming after its wait: gate/up and
# down in 2-warp programs of twice the rows: body 0.506-0.509 -> 0.497-0.498 ms (down_tiles.py); on one H200, K = 6
# block 0.550 -> 0.539 dense, 0.483 -> 0.471 FlashHead (block_ab.py, 6fb9331). The o-projection's activation reads
# issued once its first weights have landed (LATE_ACTIVATIONS), its programs then of 2 warps: on one H200, body
# 442.0 -> 416.8 us at position 38 (late_ab.py); down in 4-warp programs: 415.8 -> 404.6 us; block 0.502 -> 0.493 ms
# dense, 0.436 -> 0.426 FlashHead (bf16: the same bits).
# Long caches (one H200, the dense draft's K = 6 block, ms a token, attn_ab.py): a program a split 1.433 at position
# 8,192, 64 programs a query head folding 2 further splits at a time 0.960 (1 at a time 1.356, 32 programs 1.204);
# 0.745 -> 0.698 at 2,048; at notebook 02's cache (21 splits) 0.509 before, 0.511 with no fold, 0.519 with FOLD = 2
# compiled in (its loop never runs there), hence no fold where no program has a second split.
TILE_BYTES = 8192               # weights a warp of a GEMV program holds
GEMV_WARPS = {"qkv": 1, "o": 2, "gate_up": 2, "down": 4}
SPLIT, ATTENTION_WARPS = 16, 1
PROGRAMS = 64                   # attention programs a query head at most (longer caches: several splits each)
FOLD = 2                        # further splits a program loads at once (longer caches)
LATE_ACTIVATIONS = {"o"}        # GEMVs whose activation reads wait for their first weights (_after_wait)
GEMVS = {"qkv": (True, False, False), "o": (False, False, True),   # (norm, glu, residual) of each GEMV
         "gate_up": (True, True, False), "down": (False, False, True)}


def supported(runner) -> str:
    """Why the fused step cannot run this runner's layers ('' when it can)."""
    if not all(f and isinstance(f["qkv"], torch.Tensor) for f in runner.fused):
        return "quantised projections"
    if runner.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {runner.dtype}"
    hd = runner.cache.k.shape[-1]
    if hd & (hd - 1):
        return f"head_dim {hd} is not a power of two"
    if runner.device.type != "cuda" and not INTERPRET:
        return "no GPU (and not under TRITON_INTERPRET=1)"
    return ""


def _rows(k: int, tile_bytes: int, elem: int, tiles: int = 1) -> int:
    """Weight rows a GEMV program holds: about tile_bytes of weights (a power of two, at least 1)."""
    return max(1, triton.next_power_of_2(tile_bytes // (tiles * elem * triton.next_power_of_2(k))))


class FusedDecode:
    """The single-token step of a Runner's body (embedding, layers, final norm) through the kernels above:
    __call__(ids (1,T), start (0-dim device tensor)) -> final normed hidden states (1,T,d), writing the runner's KV
    cache like the reference path. T = 2 (a round's catch-up after a full acceptance) reads each weight once for both
    tokens and attends twice: bitwise two single-token steps. Static buffers and a fixed grid: CUDA-graph
    capturable."""

    def __init__(self, runner, tile_bytes: int = TILE_BYTES, warps: dict = GEMV_WARPS, split: int = SPLIT,
                 attention_warps: int = ATTENTION_WARPS, programs: int = PROGRAMS,
                 fold: int = FOLD):
        cfg, dev, dt = runner.model.config, runner.device, runner.dtype
        att = runner.layers[0].self_attn
        self.runner, self.eps = runner, cfg.rms_norm_eps
        self.hq, self.hkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, runner.cache.k.shape[-1]
        self.qk_norm = hasattr(att, "q_norm")
        self.pdl, self.opts = launches(dev, 1)                                # Triton launch options, made once
        self.gemv_opts = {name: launches(dev, w)[1] for name, w in warps.items()}
        self.attention_opts = launches(dev, attention_warps)[1]
        D, inter, L = cfg.hidden_size, cfg.intermediate_size, runner.cache.k.shape[3]
        splits = triton.cdiv(L, split)
        self.split, self.programs = split, min(splits, programs)              # attention programs a query head
        self.fold = fold if self.programs < splits else 1     # else no program has a second split: the straight-line
                                                              # code alone (faster)
        empty = lambda *shape, dtype=dt: torch.zeros(shape, dtype=dtype, device=dev)
        self.x, self.out = empty(2, D), empty(1, 2, D)                        # the step's activations, a row a
        self.qkv = empty(2, (self.hq + 2 * self.hkv) * self.hd)                # token
        self.attn, self.act = empty(2, self.hq * self.hd), empty(2, inter)
        self.part = empty(self.hq, self.programs, self.hd, dtype=torch.float32)   # attention programs' weighted V,
        self.ml = empty(self.hq, self.programs, 2, dtype=torch.float32)           # (max, sum) per query head
        self.count = empty(self.hq, dtype=torch.int32)                        # splits done per program row
        e = runner.layers[0].self_attn.o_proj.weight.element_size()
        k = {"qkv": D, "o": self.hq * self.hd, "gate_up": D, "down": inter}       # each GEMV's input length
        self.bn = {name: _rows(k[name], tile_bytes * warps[name], e, 2 if glu else 1)   # rows a program holds
                   for name, (_, glu, _) in GEMVS.items()}
        self.late = frozenset(LATE_ACTIVATIONS)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        with on(self.x.device):                                                       # Triton launches on the
            return self._step(ids, start)                                             # current device

    def _step(self, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        r, T = self.runner, ids.shape[1]
        if T not in (1, 2):
            raise ValueError(f"the fused step takes 1 or 2 tokens, got {T}")
        for i, layer in enumerate(r.layers):
            att, mlp = layer.self_attn, layer.mlp
            x, first = (r.body.embed_tokens.weight, ids) if i == 0 else (self.x, None)   # layer 0 looks the token up
            self._gemv(x, layer.input_layernorm.weight, r.fused[i]["qkv"], self.qkv, "qkv", T, first)
            for t in range(T):
                self._attention(att, r.cache.layer(i), start, t)
            self._gemv(self.attn, None, att.o_proj.weight, self.x, "o", T)
            self._gemv(self.x, layer.post_attention_layernorm.weight, r.fused[i]["gate_up"], self.act, "gate_up", T)
            self._gemv(self.act, None, mlp.down_proj.weight, self.x, "down", T)
        D = self.x.shape[1]
        _decode_norm[(T,)](self.x, r.body.norm.weight, self.out, self.eps, D, triton.next_power_of_2(D),
                           self.pdl, **self.opts)
        return self.out[:, :T]

    def _gemv(self, x, g, w, out, name: str, T: int, ids=None) -> None:
        norm, glu, residual = GEMVS[name]
        N, K = w.shape[0] // (2 if glu else 1), w.shape[1]
        bn = self.bn[name]
        _decode_gemv[(triton.cdiv(N, bn),)](x, g if norm else x, w, out, x if ids is None else ids, self.x, self.eps,
                                             N, K, triton.next_power_of_2(K), bn, norm, glu, residual,
                                             ids is not None, self.pdl, T, name in self.late, **self.gemv_opts[name])

    def _attention(self, att, kv: tuple, start: torch.Tensor, t: int) -> None:
        """Token t's attention, at position start + t (the second token's reads the first token's cache entry)."""
        r, (k_cache, v_cache) = self.runner, kv
        qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (self.x, self.x)
        _decode_attention[(self.hq, self.programs)](
            self.qkv[t], qn, kn, r.cos, r.sin, k_cache, v_cache, start, self.part, self.ml, self.count, self.attn[t],
            self.eps, self.hd ** -0.5, self.hq, self.hq // self.hkv, self.hd, self.split, self.programs,
            min(triton.next_power_of_2(self.programs), COMBINE_CHUNK), k_cache.shape[2], self.qk_norm, self.pdl, t,
            self.fold, **self.attention_opts)


TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 0.15}


@torch.no_grad()
def check(runner, step: FusedDecode, steps: int = 8) -> str:
    """'' where `step` agrees with the runner's reference path over `steps` positions (fixed token ids), fed one
    token a call and two (a round's catch-up), after a prefix of 2.5 attention splits written by the reference path
    (so that several splits and their combination are checked): final hidden states within TOLERANCE (_error), and
    the dense head's argmax equal but at near-ties (the fused token's reference logit within TOLERANCE x the largest
    |logit| of the maximum). Else the reason. What it measured is kept in step.checked; the cache is zeroed after (a
    fresh runner's state)."""
    tol, steps = TOLERANCE[runner.dtype], min(steps, runner.max_len)        # a short cache: the positions it has
    start = max(0, min(5 * step.split // 2, runner.max_len - steps))
    ids = (torch.arange(start + steps, device=runner.device) * 7919 + 11) % runner.body.embed_tokens.weight.shape[0]
    installed, runner.decode = runner.decode, None                # the reference path, even on a fused runner
    try:
        ref = _hidden(runner, lambda x, p: runner._forward(x, p, compiled=False), ids, start, steps, 1)
        got, pairs = (_hidden(runner, step, ids, start, steps, width) for width in (1, 2))
    finally:
        runner.decode = installed                                 # also where a step raised
    err = max(_error(h, ref) for h in (got, pairs))
    W = runner.model.get_output_embeddings().weight
    logits = (ref.to(W.dtype) @ W.T).float()
    picked = lambda h: logits.gather(1, (h.to(W.dtype) @ W.T).argmax(-1, keepdim=True))[:, 0]
    gap = torch.stack([(logits.amax(-1) - picked(h)) / logits.abs().amax(-1) for h in (got, pairs)]).amax(0)
    step.checked = {"steps": steps, "from_position": start, "rel_error": err, "tolerance": tol,
                    "argmax_equal": int((gap == 0).sum()), "max_gap": gap.max().item(),
                    "two_tokens_equal_single": bool(torch.equal(pairs, got))}
    if not err <= tol:
        return f"fused step off the reference: relative error {err:.3g} > {tol}"
    if not gap.max().item() <= tol:
        return f"fused step picks another token: reference logit gap {gap.max().item():.3g} > {tol}"
    return ""


def _error(h: torch.Tensor, ref: torch.Tensor) -> float:
    """max |h - ref| / (rms(ref) + |ref|) over elements, rms that of the element's position: each element against
    its own size (within TOLERANCE: torch.allclose with rtol = TOLERANCE, atol = TOLERANCE x rms). Trained models
    carry a few dims far above the rest (SmolLM2's final hidden states: 25-39 where the rms is 1.4-2.4), where a unit
    in the last place of bf16 is 0.09-0.13 of the rms; in units of the rms alone, two bf16 paths equally close to
    an fp32 one (the fused and the reference path of its 28-layer draft: 0.032 and 0.030 relative L2 error, the
    same argmax; one H200) differed by 0.17 there, and the check sent the fused one back."""
    return ((h - ref).abs() / (ref.pow(2).mean(-1, keepdim=True).sqrt() + ref.abs())).max().item()


def _hidden(runner, fn, ids: torch.Tensor, start: int, steps: int, width: int) -> torch.Tensor:
    """Final hidden states (steps, d) fp32 of positions start.. through fn(ids (1, width), position), width tokens a
    call, after the reference path has written the prefix; the cache is zeroed after."""
    at = lambda i: torch.tensor(i, device=runner.device)
    if start:
        runner._forward(ids[None, :start], at(0), compiled=False)
    out = torch.cat([fn(ids[None, i:i + width], at(i))[0].clone() for i in range(start, start + steps, width)])
    runner.cache.k.zero_()
    runner.cache.v.zero_()
    return out.float()
