"""Triton building blocks of greedy decoding for one hidden state (GPU, or CPU under TRITON_INTERPRET=1), and the
dense head: one launch of G programs that each score R rows of W; the last to finish writes the argmax.
FlashHead's kernels (flash_kernels.py), the fused body (decode.py) and the layer kernels
(layer_kernels.py) are built from these.

Tie rule (both heads): scores and logits are fp32 dot products of the bf16/fp32 inputs, accumulated in
fp32 (-0.0 counts as +0.0; NaN is not handled). Probes are the p clusters with the largest scores, ties
to the smaller cluster id; the token is the candidate with the largest logit, ties to the smaller token
id (torch.argmax over the vocabulary). Where fp32 sums are exact (e.g. small integers) this is exact; on
real data two summation orders can differ in the last bit, so only near-ties (gap ~1e-7 relative) can
disagree with a torch reference. A (value, index) pair travels as one int64 key whose order is that rule.

The kernels keep counters and a histogram between calls (scratch) and leave them as they found them, so calls
are CUDA-graph capturable; call each head once before capturing (that allocates the scratch). One stream at a
time per device. On Hopper each launch is a programmatic dependent launch: the first weight tile is read before
the wait for the hidden state, while the kernel before (e.g. decode.py's final norm) runs.
"""
import torch, triton, triton.language as tl

_MIN64 = tl.constexpr(-2 ** 63)


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
def _index(k):
    """The index of a key (_key's inverse for its low half), int32."""
    return (0x7FFFFFFF - (k & 0x7FFFFFFF)).to(tl.int32)


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
def _after_wait(ptr, PDL: tl.constexpr):
    """ptr plus a zero the compilers cannot fold (the global timer's top bit, read after the wait; clear until
    2262): loads from it are no longer issued at once after the wait but where their address is ready, after what
    ptxas schedules first (in a GEMV: unpacking its first weights, so once they have arrived)."""
    if PDL:
        ptr += ((tl.extra.cuda.globaltimer() >> 63) * 16).to(tl.int32)   # x 16: keeps 16-element alignment
    return ptr


@triton.jit
def _combine_splits(ml_ptr, part_ptr, row0, n_live, d, CH: tl.constexpr):
    """One query head's attention output (HD,) from the partials of its first n_live splits at rows row0.. of ml
    (max, sum) and part (weighted V, HD a row), in split order (read past L1: other programs wrote them), CH splits
    at a time with a running max and sum between chunks, so that a long cache's thousands of splits stay within
    registers. Up to CH splits it is one chunk: weights exp(max_s - max), bitwise the one-shot combination."""
    m, l = tl.full((), -float("inf"), tl.float32), tl.zeros((), tl.float32)
    acc = tl.zeros(d.shape, tl.float32)
    for c in range(0, n_live, CH):
        sp = c + tl.arange(0, CH)
        live, rows = sp < n_live, row0 + sp
        ms = tl.load(ml_ptr + rows * 2, mask=live, other=-float("inf"), cache_modifier=".cg")
        ls = tl.load(ml_ptr + rows * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
        vs = tl.load(part_ptr + rows[:, None] * d.shape[0] + d[None, :], mask=live[:, None], other=0.0,
                     cache_modifier=".cg")
        top = tl.maximum(m, tl.max(ms, 0))
        keep, w = tl.exp(m - top), tl.exp(ms - top)                  # keep: 0 before the first chunk
        acc = acc * keep + tl.sum(w[:, None] * vs, 0)
        l = l * keep + tl.sum(w * ls, 0)
        m = top
    return acc / l


COMBINE_CHUNK = 32    # splits a combination reads at once (fewer where the cache has fewer): the draft's and the
                      # target's e2e caches have at most 32, so their combination is one chunk as before


@triton.jit
def _qkv_heads(ptr, k_at, v_at, q_at, kn, kn_rot, qn, qn_rot, cos, sin, eps, HD: tl.constexpr, NORM: tl.constexpr):
    """This step's k, v and one q head (HD,) at ptr + k_at, v_at, q_at: k and q RMS-normed with weights kn, qn if NORM
    (Qwen3; _rot: rotated by HD/2), then rotated (RoPE, rotate-half); v as stored. The three are one (HD, 4) tensor
    (k, v, q, q) whose norms are one reduction, so their loads are one L2 round trip after the wait (head by head,
    the compiler issued q's load only after k's norm)."""
    d, c = tl.arange(0, HD), tl.arange(0, 4)[None, :]
    at = tl.where(c == 0, k_at, tl.where(c == 1, v_at, q_at))
    x = tl.load(ptr + at + d[:, None])
    xr = tl.load(ptr + at + ((d + HD // 2) % HD)[:, None])                # each element's rotate-half partner
    y, yr = x, xr
    if NORM:
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, 0) / HD + eps)[None, :]
        y = (xf * r).to(x.dtype) * tl.where(c == 0, kn[:, None], qn[:, None])
        yr = (xr.to(tl.float32) * r).to(x.dtype) * tl.where(c == 0, kn_rot[:, None], qn_rot[:, None])
    sign = tl.where(d < HD // 2, -1.0, 1.0)[:, None]
    out = (y.to(tl.float32) * cos[:, None] + sign * yr.to(tl.float32) * sin[:, None]).to(x.dtype)
    kq, _ = tl.split(tl.reshape(out, (HD, 2, 2)))                            # columns (k, q) of (k, v, q, q)
    _, vq = tl.split(tl.reshape(x, (HD, 2, 2)))                              # columns (v, q)
    k, q = tl.split(kq)
    v, _ = tl.split(vq)
    return k, v, q


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
    token, resets best and the counter for the next call, and is the one that returns True."""
    tl.atomic_max(best_ptr, tl.max(key, axis=0))
    tl.debug_barrier()                                        # the max lands before we count ourselves done
    last = tl.atomic_add(count_ptr, 1) == n - 1               # acq_rel: the last sees every other program's max
    if last:
        best = tl.atomic_xchg(best_ptr, _MIN64)
        tl.store(count_ptr, 0)
        tl.store(out_ptr, _index(best))
    return last


@triton.jit
def _dense_argmax(h_ptr, w_ptr, best_ptr, count_ptr, out_ptr, V, D: tl.constexpr, R: tl.constexpr,
                  BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program g scores rows g*R..g*R+R-1 of W; the last program to finish writes the argmax. The kernel after it
    may launch at once (it waits for the token before reading it: the fused step's first GEMV, say)."""
    _launch_next(PDL)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    ok = rows < V
    _finish(_key(_dot_rows(h_ptr, w_ptr, rows, ok, R, D, BLOCK_D, PDL), rows, ok), best_ptr, count_ptr, out_ptr,
            tl.num_programs(0))


_SCRATCH = {}
NBINS = 4096                    # the FlashHead centroid histogram's bins (flash_kernels.py)


def scratch(device, C: int = 0, S: int = 1) -> dict:
    """Per-device state the kernels restore after each call (ctl: control words 128 bytes apart, best: a key) and
    per-size scratch for FlashHead over C clusters with S slab slots a bin; never reallocated (a captured graph
    keeps the addresses)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:                      # "cuda" and "cuda:0": one scratch
        device = torch.device("cuda", torch.cuda.current_device())
    key = (str(device), C, S)
    if key not in _SCRATCH:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("call flash_greedy_triton / dense_greedy_triton once before graph capture")
        z = lambda n, dt=torch.int32: torch.zeros(n, dtype=dt, device=device)
        _SCRATCH[key] = dict(ctl=z(128), best=torch.full((1,), -2 ** 63, dtype=torch.int64, device=device),
                             hist=z(NBINS), plan=z(4), keys=z(max(C, 1), torch.int64),
                             slab=z(NBINS * S, torch.int64), probes=z(max(C, 1)), cand=z(max(C, 1), torch.int64))
    return _SCRATCH[key]


_COUNTERS: dict = {}


def counters(device: torch.device, n: int, owner: str) -> torch.Tensor:
    """Per-device, per-owner int32 zeros (at least 64k): how many programs of a tile have stored their partials.
    Each call of the owner's kernel leaves them at zero; made outside any CUDA-graph capture (call once before)."""
    key = (torch.device(device), owner)
    have = _COUNTERS.get(key)
    if have is None or have.numel() < n:
        if key[0].type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{owner}: {n} tile counters needed while a CUDA graph is captured; "
                               f"call it once before capturing")
        _COUNTERS[key] = have = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)
    return have


def interpreted(kernel) -> bool:
    """Whether Triton decorated `kernel` for its CPU interpreter, which runs no inline PTX. Triton chose that when
    first imported, so ask a kernel rather than the environment."""
    return type(kernel).__name__ == "InterpretedFunction"


def has_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA on Hopper or later (not Triton's CPU interpreter)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def launches(device: torch.device, warps: int, pdl: bool = True) -> tuple[bool, dict]:
    """(PDL on?, Triton launch options) for a kernel of `warps` warps on `device`."""
    on = pdl and has_pdl(device)
    return on, dict(num_warps=warps, launch_pdl=True) if on else dict(num_warps=warps)


def dense_greedy_triton(h, W, R=16, BLOCK_D=1024, warps=4, pdl=True):
    """h (1,d) -> argmax_v h.W[v] as (1,) int64 on the device, ties to the smallest v: one launch (its first
    weights read while the kernel before runs, where the GPU has programmatic dependent launch)."""
    V, D = W.shape
    s = scratch(h.device)
    out = torch.empty(1, dtype=torch.int64, device=h.device)
    pdl, opts = launches(h.device, warps, pdl)
    _dense_argmax[(triton.cdiv(V, R),)](h, W, s["best"], s["ctl"], out, V, D, R,
                                        min(BLOCK_D, triton.next_power_of_2(D)), pdl, **opts)
    return out
