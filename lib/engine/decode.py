"""Fused single-token decode of a Qwen3 or Llama body (Triton): five bandwidth-bound kernels a layer.

  _decode_gemv (norm)       RMSNorm of the residual stream, then the fused q/k/v GEMV
  _decode_attention         q/k RMS norms (Qwen3), RoPE, the K/V cache write and split-KV single-query
                            attention; the last split of each KV head to finish combines the splits
  _decode_gemv (residual)   o-projection GEMV added to the residual stream
  _decode_gemv (norm, glu)  RMSNorm, gate/up GEMV, SiLU(gate) * up
  _decode_gemv (residual)   down-projection GEMV added to the residual stream

On Hopper every kernel is a programmatic dependent launch that lets the next one launch at its start; each
GEMV program holds BN whole weight rows, issues their loads, and only then waits for the kernel before it, so
the weights of the next kernels stream in while one finishes (the attention reads the older cache positions
before its wait the same way). Splits of the attention are a fixed number of positions, and every reduction
runs in a fixed order, so a position's output does not depend on how long the context is.
Arithmetic follows the Hugging Face modules: fp32 norms rounded to the weights' dtype before the weight
multiplies, fp32 dot products; rounding points differ in places (RoPE in fp32 then rounded once), so the
path is checked against the reference when a runner is built (check below) and the runner records which ran.
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"          # Triton's CPU interpreter (tests)


CHAINED, PERSISTENT = 1, 2        # how a task waits for its inputs (WAIT); 0: they were written before its launch


@triton.jit
def _launch_next(WAIT: tl.constexpr):
    """Let the next kernel launch now (programmatic dependent launch): several kernels of a step may then run
    at once, so before its wait (_wait) a kernel reads only what was written before the step began."""
    if WAIT == 1:
        tl.extra.cuda.gdc_launch_dependents()


_ASM = tl.constexpr(not INTERPRET)


@triton.jit
def _wait(WAIT: tl.constexpr, flag_ptr, target, first, SYNC: tl.constexpr):
    """Wait until this task's inputs are written. CHAINED: the kernel before has finished (it waited for its own).
    PERSISTENT: the stage before has counted `target` tasks done at flag_ptr; a program checks before its first task
    of a stage only (its later tasks come after). Activations are then read with .cg (from L2: another SM wrote
    them during this kernel, and this SM's L1 may hold an older copy). SYNC (read only when
    PERSISTENT): (counters, their stride, poll by atomics 0 or volatile loads 1, nanoseconds to sleep between polls)."""
    if WAIT == 1:
        tl.extra.cuda.gdc_wait()
    if WAIT == 2:
        if first:
            SL: tl.constexpr = SYNC[0]
            slots = flag_ptr + tl.arange(0, SL) * SYNC[1]
            if SYNC[2] == 0:
                n = tl.sum(tl.atomic_add(slots, tl.zeros((SL,), tl.int32), sem="acquire"), 0)
            else:
                n = tl.sum(tl.load(slots, volatile=True), 0)
            while n < target:
                if _ASM:
                    if SYNC[3] > 0:
                        tl.inline_asm_elementwise("nanosleep.u32 $2; mov.u32 $0, $1;", "=r,r,r", [n, n * 0 + SYNC[3]],
                                                  dtype=tl.int32, is_pure=False, pack=1)
                if SYNC[2] == 0:
                    n = tl.sum(tl.atomic_add(slots, tl.zeros((SL,), tl.int32), sem="acquire"), 0)
                else:
                    n = tl.sum(tl.load(slots, volatile=True), 0)
            if _ASM:
                if SYNC[2] != 0:
                    tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, $1;", "=r,r", [n], dtype=tl.int32,
                                              is_pure=False, pack=1)


@triton.jit
def _count(done_ptr, pid, n, P, SYNC: tl.constexpr):
    """Persistent step: count this program's tasks of a stage (n tasks dealt round-robin to P programs) as done in
    its slot, after every thread's stores."""
    if pid < n:
        tl.debug_barrier()
        tl.atomic_add(done_ptr + (pid % SYNC[0]) * SYNC[1], (n - pid + P - 1) // P, sem="release")


@triton.jit
def _gemv_task(t, x_ptr, g_ptr, w_ptr, out_ptr, eps, N, K: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
               NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, WAIT: tl.constexpr, flag_ptr, target,
               first, SYNC: tl.constexpr):
    """out[rows] = W[rows] @ a for the BN rows of task t; a = RMSNorm(x) * g if NORM else x. GLU: W holds gate rows
    then up rows (2N, K) and out = silu(gate) * up. RESIDUAL: out[rows] += (out is the residual stream)."""
    rows = t * BN + tl.arange(0, BN)
    cols = tl.arange(0, BK)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    if GLU:
        u = tl.load(w_ptr + (rows + N).to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    _wait(WAIT, flag_ptr, target, first, SYNC)                  # weights in flight; now the activations
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=".cg")
    if NORM:                                                      # HF RMSNorm: fp32, to dtype, times weight
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
        x = (xf * r).to(x.dtype) * tl.load(g_ptr + cols, mask=cols < K, other=0.0)
    xf = x.to(tl.float32)[None, :]
    y = tl.sum(w.to(tl.float32) * xf, 1).to(out_ptr.dtype.element_ty)
    if GLU:                                                       # act_fn(gate) * up, each rounded as HF does
        gate = y.to(tl.float32)
        up = tl.sum(u.to(tl.float32) * xf, 1).to(out_ptr.dtype.element_ty)
        y = (gate / (1.0 + tl.exp(-gate))).to(up.dtype) * up
    if RESIDUAL:
        res = tl.load(out_ptr + rows, mask=rows < N, cache_modifier=".cg")
        y = (res.to(tl.float32) + y.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows, y, mask=rows < N)


@triton.jit
def _rope_head(ptr, nw_ptr, cos, sin, eps, HD: tl.constexpr, NORM: tl.constexpr):
    """One head (HD,) at ptr: RMS norm with weight nw (Qwen3's q/k norm) if NORM, then RoPE (rotate-half)."""
    d = tl.arange(0, HD)
    rot = (d + HD // 2) % HD
    x = tl.load(ptr + d, cache_modifier=".cg")
    xr = tl.load(ptr + rot, cache_modifier=".cg")
    if NORM:
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, 0) / HD + eps)
        x = (xf * r).to(x.dtype) * tl.load(nw_ptr + d)
        xr = (xr.to(tl.float32) * r).to(x.dtype) * tl.load(nw_ptr + rot)
    sign = tl.where(d < HD // 2, -1.0, 1.0)
    return (x.to(tl.float32) * cos + sign * xr.to(tl.float32) * sin).to(x.dtype)


@triton.jit
def _attention_task(h, s, qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, part_ptr, ml_ptr,
                    count_ptr, out_ptr, eps, scale, HQ: tl.constexpr, G: tl.constexpr, HD: tl.constexpr,
                    S: tl.constexpr, NS: tl.constexpr, NSP: tl.constexpr, L, NORM: tl.constexpr, WAIT: tl.constexpr,
                    flag_ptr, target, first, SYNC: tl.constexpr):
    """Task (h, s): KV head h, positions s*S..s*S+S-1 of the L-position cache, for its G query heads. Older
    positions come from the cache, the new one from this step's k, v (the task owning it also caches them);
    each stores (max, sum, weighted V) per query head; the last of the NS tasks of head h to finish combines
    them into out (HQ*HD) in split order."""
    d = tl.arange(0, HD)
    pos = tl.load(pos_ptr)                                        # the step's position, set before it began
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    cache = h * (L * HD).to(tl.int64)
    p = s * S + tl.arange(0, S)
    old = (p < pos)[:, None]                                      # cached by earlier steps: read before the wait
    kt = tl.load(kc_ptr + cache + p[:, None] * HD + d[None, :], mask=old, other=0.0)     # in the cache's dtype
    vt = tl.load(vc_ptr + cache + p[:, None] * HD + d[None, :], mask=old, other=0.0)     # (half the registers)
    _wait(WAIT, flag_ptr, target, first, SYNC)                  # q, k, v of this step
    k = _rope_head(qkv_ptr + (HQ + h) * HD, kn_ptr, cos, sin, eps, HD, NORM)
    v = tl.load(qkv_ptr + (HQ + HQ // G + h) * HD + d, cache_modifier=".cg")
    if (s * S <= pos) & (pos < s * S + S):                        # the new position is ours: cache it
        tl.store(kc_ptr + cache + pos * HD + d, k)
        tl.store(vc_ptr + cache + pos * HD + d, v)
    new = (p == pos)[:, None]
    kt = tl.where(new, k[None, :], kt)
    vt = tl.where(new, v[None, :], vt)
    ok = p <= pos                                                 # none in splits past the new position
    for j in tl.static_range(G):
        qh = h * G + j
        q = _rope_head(qkv_ptr + qh * HD, qn_ptr, cos, sin, eps, HD, NORM).to(tl.float32)
        sc = tl.where(ok, tl.sum(kt.to(tl.float32) * q[None, :], 1) * scale, -float("inf"))
        m = tl.max(sc, 0)                                         # -inf in an empty split
        e = tl.where(ok, tl.exp(sc - m), 0.0)
        tl.store(ml_ptr + (qh * NS + s) * 2, m)
        tl.store(ml_ptr + (qh * NS + s) * 2 + 1, tl.sum(e, 0))
        tl.store(part_ptr + (qh * NS + s) * HD + d, tl.sum(e[:, None] * vt.to(tl.float32), 0))
    tl.debug_barrier()                                            # partials stored before we count ourselves
    if tl.atomic_add(count_ptr + h, 1) == NS - 1:                 # acq_rel: the last sees every partial
        tl.store(count_ptr + h, 0)
        sp = tl.arange(0, NSP)
        for j in tl.static_range(G):
            qh = h * G + j
            ms = tl.load(ml_ptr + (qh * NS + sp) * 2, mask=sp < NS, other=-float("inf"), cache_modifier=".cg")
            ls = tl.load(ml_ptr + (qh * NS + sp) * 2 + 1, mask=sp < NS, other=0.0, cache_modifier=".cg")
            acc = tl.load(part_ptr + (qh * NS + sp)[:, None] * HD + d[None, :], mask=(sp < NS)[:, None],
                          other=0.0, cache_modifier=".cg")
            w = tl.exp(ms - tl.max(ms, 0))                        # empty splits: exp(-inf) = 0
            o = tl.sum(w[:, None] * acc, 0) / tl.sum(w * ls, 0)
            tl.store(out_ptr + qh * HD + d, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _norm_task(x_ptr, g_ptr, out_ptr, eps, K: tl.constexpr, BK: tl.constexpr, WAIT: tl.constexpr, flag_ptr, target,
               SYNC: tl.constexpr):
    """The final RMSNorm of the residual stream."""
    cols = tl.arange(0, BK)
    _wait(WAIT, flag_ptr, target, True, SYNC)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=".cg")
    xf = x.to(tl.float32)
    r = tl.rsqrt(tl.sum(xf * xf, 0) / K + eps)
    tl.store(out_ptr + cols, (xf * r).to(x.dtype) * tl.load(g_ptr + cols, mask=cols < K), mask=cols < K)


# The chained step: one kernel a task kind, each program one task.

@triton.jit
def _decode_gemv(x_ptr, g_ptr, w_ptr, out_ptr, eps, N, K: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
                 NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, WAIT: tl.constexpr):
    _launch_next(WAIT)
    _gemv_task(tl.program_id(0), x_ptr, g_ptr, w_ptr, out_ptr, eps, N, K, BK, BN, NORM, GLU, RESIDUAL, WAIT,
               x_ptr, 0, True, 0)


@triton.jit
def _decode_attention(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, part_ptr, ml_ptr,
                      count_ptr, out_ptr, eps, scale, HQ: tl.constexpr, G: tl.constexpr, HD: tl.constexpr,
                      S: tl.constexpr, NS: tl.constexpr, NSP: tl.constexpr, L, NORM: tl.constexpr,
                      WAIT: tl.constexpr):
    _launch_next(WAIT)
    _attention_task(tl.program_id(0), tl.program_id(1), qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr,
                    pos_ptr, part_ptr, ml_ptr, count_ptr, out_ptr, eps, scale, HQ, G, HD, S, NS, NSP, L, NORM,
                    WAIT, pos_ptr, 0, True, 0)


@triton.jit
def _decode_norm(x_ptr, g_ptr, out_ptr, eps, K: tl.constexpr, BK: tl.constexpr, WAIT: tl.constexpr):
    _norm_task(x_ptr, g_ptr, out_ptr, eps, K, BK, WAIT, x_ptr, 0, 0)


# The persistent step: one kernel for every layer. P programs deal each stage's tasks out round-robin; a stage's
# tasks wait for the stage before to count all of its tasks done (so stages are grid-wide barriers, but nothing
# is launched, each program loads its next weights before it waits, and idle SMs start the next stage at once).
# Every program must be resident at once (P is at most what fits on the GPU), or a waiting one could starve one
# that is not yet running. Per-layer tensors are addressed as w_ptr + an element offset (offs: layer x kind).

@triton.jit
def _gemv_stage(pid, P, x_ptr, g_ptr, w_ptr, out_ptr, eps, N, K: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
                NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr, flag_ptr, target, done_ptr,
                SYNC: tl.constexpr):
    n = tl.cdiv(N, BN)
    for t in range(pid, n, P):
        _gemv_task(t, x_ptr, g_ptr, w_ptr, out_ptr, eps, N, K, BK, BN, NORM, GLU, RESIDUAL, 2, flag_ptr, target,
                   t == pid, SYNC)
    _count(done_ptr, pid, n, P, SYNC)


@triton.jit
def _at(w_ptr, offs_ptr, kind):
    return w_ptr + tl.multiple_of(tl.load(offs_ptr + kind), 8)   # offsets are checked to be 16-byte multiples


@triton.jit
def _decode_step(x_ptr, qkv_ptr, attn_ptr, act_ptr, out_ptr, part_ptr, ml_ptr, count_ptr, done_ptr, w_ptr, offs_ptr,
                 g_ptr, cos_ptr, sin_ptr, pos_ptr, eps, scale, n_layers, P, D: tl.constexpr, BD: tl.constexpr,
                 NQKV: tl.constexpr, BO: tl.constexpr, INTER: tl.constexpr, BI: tl.constexpr, BN_QKV: tl.constexpr,
                 BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr, HQ: tl.constexpr,
                 G: tl.constexpr, HD: tl.constexpr, S: tl.constexpr, NS: tl.constexpr, NSP: tl.constexpr, L,
                 NORM: tl.constexpr, SYNC: tl.constexpr):
    pid = tl.program_id(0)
    HKV: tl.constexpr = HQ // G
    n_att = HKV * NS
    n_down = tl.cdiv(D, BN_DOWN)
    for layer in range(n_layers):
        o = offs_ptr + layer * 10                                 # in_norm qkv q_norm k_norm o post_norm gate_up down
        f = done_ptr + 1 + layer * 5                              # k v; f[-1]: the stage before (counter 0: always 0)
        _gemv_stage(pid, P, x_ptr, _at(w_ptr, o, 0), _at(w_ptr, o, 1), qkv_ptr, eps, NQKV, D, BD, BN_QKV, True,
                    False, False, f - 1, tl.where(layer > 0, n_down, 0), f, SYNC)
        for t in range(pid, n_att, P):
            _attention_task(t // NS, t % NS, qkv_ptr, _at(w_ptr, o, 2), _at(w_ptr, o, 3), cos_ptr, sin_ptr,
                            _at(w_ptr, o, 8), _at(w_ptr, o, 9), pos_ptr, part_ptr, ml_ptr, count_ptr, attn_ptr, eps,
                            scale, HQ, G, HD, S, NS, NSP, L, NORM, 2, f, tl.cdiv(NQKV, BN_QKV), t == pid, SYNC)
        _count(f + 1, pid, n_att, P, SYNC)
        _gemv_stage(pid, P, attn_ptr, attn_ptr, _at(w_ptr, o, 4), x_ptr, eps, D, HQ * HD, BO, BN_O, False, False,
                    True, f + 1, n_att, f + 2, SYNC)
        _gemv_stage(pid, P, x_ptr, _at(w_ptr, o, 5), _at(w_ptr, o, 6), act_ptr, eps, INTER, D, BD, BN_GU, True, True,
                    False, f + 2, tl.cdiv(D, BN_O), f + 3, SYNC)
        _gemv_stage(pid, P, act_ptr, act_ptr, _at(w_ptr, o, 7), x_ptr, eps, D, INTER, BI, BN_DOWN, False, False,
                    True, f + 3, tl.cdiv(INTER, BN_GU), f + 4, SYNC)
    if pid == 0:                                                  # the last task: every other one has finished,
        _norm_task(x_ptr, g_ptr, out_ptr, eps, D, BD, 2, done_ptr + n_layers * 5, n_down, SYNC)
        for i in range(0, SYNC[0] * SYNC[1], 256):                   # so the counters go back to 0 for the next step
            c = i + tl.arange(0, 256)
            tl.store(done_ptr + c, 0, mask=c < SYNC[0] * SYNC[1])


SPLIT = 32                                                        # attention positions a task
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


def resident(kernel, warps: int, device: torch.device) -> int:
    """Programs of a compiled Triton kernel that fit on one SM at once (registers, shared memory, threads)."""
    p = torch.cuda.get_device_properties(device)
    per_warp = -(-kernel.n_regs * 32 // 256) * 256                           # registers go to warps in 256s
    by_regs = getattr(p, "regs_per_multiprocessor", 65536) // (per_warp * warps)
    by_smem = getattr(p, "shared_memory_per_multiprocessor", 228 * 1024) // (kernel.metadata.shared + 1024)
    return min(by_regs, by_smem, p.max_threads_per_multi_processor // (32 * warps), 32)


class FusedDecode:
    """The single-token step of a Runner's body (embedding, layers, final norm) through the kernels above:
    __call__(ids (1,1), start (0-dim device tensor)) -> final normed hidden state (1,1,d), writing the
    runner's KV cache like the reference path. Static buffers and a fixed grid: CUDA-graph capturable.
    persistent: the whole body in one kernel of `programs` programs (per_sm on each SM, at most what fits);
    else five chained kernels a layer. The two run the same tasks in the same order: their outputs are equal."""

    def __init__(self, runner, tile_bytes: int = 16384, warps: int = 2, split: int = SPLIT,
                 persistent: bool = True, per_sm: int = 4, sync: tuple = (1, 0, 0), maxnreg: int | None = None):
        cfg, dev, dt = runner.model.config, runner.device, runner.dtype
        att = runner.layers[0].self_attn
        self.runner, self.eps, self.warps = runner, cfg.rms_norm_eps, warps
        self.hq, self.hkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, runner.cache.k.shape[-1]
        self.qk_norm = hasattr(att, "q_norm")
        self.pdl = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
        self.wait = CHAINED if self.pdl else 0
        D, inter, L = cfg.hidden_size, cfg.intermediate_size, runner.cache.k.shape[3]
        self.split, self.ns = split, triton.cdiv(L, split)
        empty = lambda *shape, dtype=dt: torch.zeros(shape, dtype=dtype, device=dev)
        self.x, self.out = empty(D), empty(1, 1, D)
        self.qkv = empty((self.hq + 2 * self.hkv) * self.hd)                   # the step's activations
        self.attn, self.act = empty(self.hq * self.hd), empty(inter)
        self.part = empty(self.hq, self.ns, self.hd, dtype=torch.float32)     # attention splits: weighted V,
        self.ml = empty(self.hq, self.ns, 2, dtype=torch.float32)             # (max, sum) per query head
        self.count = empty(self.hkv, dtype=torch.int32)                       # splits done per KV head
        e = runner.layers[0].self_attn.o_proj.weight.element_size()
        self.bn = {"qkv": _rows(D, tile_bytes, e), "o": _rows(self.hq * self.hd, tile_bytes, e),
                   "gate_up": _rows(D, tile_bytes, e, 2), "down": _rows(inter, tile_bytes, e)}
        self.programs, self.layout, self.compiled = 0, "chained", {}
        self.persistent_launch = dict(num_warps=warps, **({"maxnreg": maxnreg} if maxnreg else {}))
        if persistent:
            self.offsets, why = self._layer_offsets()
            if not why:
                stride = 32 * triton.cdiv(1 + 5 * len(runner.layers), 32)         # tasks done per (layer, stage),
                self.sync = (sync[0], stride, *sync[1:])                          # in sync[0] counters each
                self.done = empty(sync[0] * stride, dtype=torch.int32)
                self.programs = 1 if INTERPRET else self._grid(per_sm)
            self.layout = f"persistent, {self.programs} programs" if self.programs else f"chained: {why}"

    def _layer_offsets(self) -> tuple:
        """(layer x kind element offsets of every per-layer tensor from the embedding's address, ''), or
        (None, why not)."""
        r = self.runner
        base = r.body.embed_tokens.weight
        rows = []
        for i, layer in enumerate(r.layers):
            att = layer.self_attn
            qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (base, base)
            rows.append([layer.input_layernorm.weight, r.fused[i]["qkv"], qn, kn, att.o_proj.weight,
                         layer.post_attention_layernorm.weight, r.fused[i]["gate_up"], layer.mlp.down_proj.weight,
                         *r.cache.layer(i)])
        if any(t.dtype != base.dtype or not t.is_contiguous() or (t.data_ptr() - base.data_ptr()) % 16
               for row in rows for t in row):
            return None, "a layer tensor is not a contiguous 16-byte-aligned tensor of the embedding's dtype"
        offsets = [[(t.data_ptr() - base.data_ptr()) // base.element_size() for t in row] for row in rows]
        return torch.tensor(offsets, dtype=torch.int64, device=base.device), ""

    def _grid(self, per_sm: int) -> int:
        """Programs of the persistent kernel: per_sm a streaming multiprocessor, at most what fits there."""
        dev = self.x.device
        kernel = _decode_step.warmup(*self._step_args(torch.zeros((), dtype=torch.int64, device=dev), 1),
                                     grid=(1,), **self.persistent_launch)
        kernel._init_handles()                                                 # loads it: registers, spills
        fits = resident(kernel, self.warps, dev)
        self.compiled = {"registers": kernel.n_regs, "spills": kernel.n_spills, "shared": kernel.metadata.shared,
                         "fit_per_sm": fits}
        return torch.cuda.get_device_properties(dev).multi_processor_count * min(per_sm, fits)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        with torch.cuda.device(self.x.device) if self.x.is_cuda else nullcontext():   # Triton launches on the
            return self._step(ids, start)                                             # current device

    def _step(self, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        r = self.runner
        torch.index_select(r.body.embed_tokens.weight, 0, ids[0], out=self.x.view(1, -1))
        if self.programs:
            _decode_step[(self.programs,)](*self._step_args(start, self.programs), **self.persistent_launch)
            return self.out
        for i, layer in enumerate(r.layers):
            att, mlp = layer.self_attn, layer.mlp
            self._gemv(self.x, layer.input_layernorm.weight, r.fused[i]["qkv"], self.qkv, "qkv")
            self._attention(att, r.cache.layer(i), start)
            self._gemv(self.attn, None, att.o_proj.weight, self.x, "o")
            self._gemv(self.x, layer.post_attention_layernorm.weight, r.fused[i]["gate_up"], self.act, "gate_up")
            self._gemv(self.act, None, mlp.down_proj.weight, self.x, "down")
        D = self.x.numel()
        _decode_norm[(1,)](self.x, r.body.norm.weight, self.out, self.eps, D, triton.next_power_of_2(D),
                           self.wait, **self._launch())
        return self.out

    def _step_args(self, start: torch.Tensor, programs: int) -> tuple:
        r, p2 = self.runner, triton.next_power_of_2
        D, inter = self.x.numel(), self.act.numel()
        return (self.x, self.qkv, self.attn, self.act, self.out, self.part, self.ml, self.count, self.done,
                r.body.embed_tokens.weight, self.offsets, r.body.norm.weight, r.cos, r.sin, start, self.eps,
                self.hd ** -0.5, len(r.layers), programs, D, p2(D), self.qkv.numel(), p2(self.attn.numel()), inter,
                p2(inter), self.bn["qkv"], self.bn["o"], self.bn["gate_up"], self.bn["down"], self.hq,
                self.hq // self.hkv, self.hd, self.split, self.ns, p2(self.ns), r.cache.k.shape[3], self.qk_norm,
                self.sync)

    def _launch(self) -> dict:
        return dict(num_warps=self.warps, launch_pdl=True) if self.pdl else dict(num_warps=self.warps)

    def _gemv(self, x, g, w, out, name: str) -> None:
        norm, glu, residual = GEMVS[name]
        N, K = w.shape[0] // (2 if glu else 1), w.shape[1]
        bn = self.bn[name]
        _decode_gemv[(triton.cdiv(N, bn),)](x, g if norm else x, w, out, self.eps, N, K, triton.next_power_of_2(K),
                                             bn, norm, glu, residual, self.wait, **self._launch())

    def _attention(self, att, kv: tuple, start: torch.Tensor) -> None:
        r, (k_cache, v_cache) = self.runner, kv
        qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (self.x, self.x)
        _decode_attention[(self.hkv, self.ns)](
            self.qkv, qn, kn, r.cos, r.sin, k_cache, v_cache, start, self.part, self.ml, self.count, self.attn,
            self.eps, self.hd ** -0.5, self.hq, self.hq // self.hkv, self.hd, self.split, self.ns,
            triton.next_power_of_2(self.ns), k_cache.shape[2], self.qk_norm, self.wait, **self._launch())


TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 0.15}


@torch.no_grad()
def check(runner, step: FusedDecode, steps: int = 8) -> str:
    """'' where `step` agrees with the runner's reference path over `steps` single-token calls from position 0
    (fixed token ids): final hidden states within TOLERANCE (max |difference| / rms of the reference), and the
    dense head's argmax equal but at near-ties (the fused token's reference logit within TOLERANCE x the largest
    |logit| of the maximum). Else the reason. What it measured is kept in step.checked; the cache is zeroed after
    (a fresh runner's state)."""
    dev, tol = runner.device, TOLERANCE[runner.dtype]
    ids = (torch.arange(steps, device=dev) * 7919 + 11) % runner.body.embed_tokens.weight.shape[0]
    hidden = []
    for fn in (lambda x, p: runner._forward(x, p, compiled=False), step):
        hidden.append(torch.stack([fn(ids[None, i:i + 1], torch.tensor(i, device=dev))[0, -1].clone()
                                   for i in range(steps)]).float())
        runner.cache.k.zero_()
        runner.cache.v.zero_()
    ref, got = hidden
    err = ((got - ref).abs().amax(-1) / ref.pow(2).mean(-1).sqrt()).max().item()
    W = runner.model.get_output_embeddings().weight
    logits = (ref.to(W.dtype) @ W.T).float()
    picked = logits.gather(1, (got.to(W.dtype) @ W.T).argmax(-1, keepdim=True))[:, 0]
    gap = (logits.amax(-1) - picked) / logits.abs().amax(-1)
    step.checked = {"steps": steps, "rel_error": err, "tolerance": tol, "argmax_equal": int((gap == 0).sum()),
                    "max_gap": gap.max().item()}
    if not err <= tol:
        return f"fused step off the reference: relative error {err:.3g} > {tol}"
    if not gap.max().item() <= tol:
        return f"fused step picks another token: reference logit gap {gap.max().item():.3g} > {tol}"
    return ""
