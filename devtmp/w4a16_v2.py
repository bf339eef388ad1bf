"""Experiment (issue 26, eighth session, prepared, not timed): two variants of lib/models/w4a16.py's one-dot kernel.
  PAIR:    two K-blocks an iteration (two dots in flight before their waits; loop overhead over 256 K positions).
           A range with an odd number of K-blocks masks the second half of its last iteration (codes and scale 0).
  CARRIED: the group's scale applied to the dequantised weights in the weights' dtype ((q - z) * s rounded once),
           so the dot accumulates in place (acc = dot(w, x, acc)) and Triton may keep a wgmma in flight across
           iterations; products are no longer exact (marlin's arithmetic), rows stay batch-invariant.
Launch with the library's arguments (kernel[grid](*args) as lib.models.w4a16.w4a16_matmul does)."""
import triton
import triton.language as tl
from lib.models.w4a16 import _half, _store


@triton.jit
def _block(w_ptr, z_ptr, s_ptr, x_ptr, g, k0, live, cols, N, rows, M, stride_w, stride_g, stride_xm, r8, k128,
           BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr):
    """K-block g: its (BLOCK_N, 128) dequantised operand, the x tile (128, 16) and the scales; all zero unless live."""
    okl = cols < tl.where(live, N, 0)
    M = tl.where(live, M, 0)
    z = tl.load(z_ptr + g * stride_g + cols, mask=okl, other=0).to(tl.int32)
    s = tl.load(s_ptr + g * stride_g + cols, mask=okl, other=0.0)
    zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
    zh = (z << 4) | 0xD400
    zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
    base = w_ptr + tl.full((), 2, tl.int64) * g * stride_w          # int64: the words of a 32B layer pass 2**31
    w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=okl[:, None], other=0)
    w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=okl[:, None], other=0)
    w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
    w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
    xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
    return w, xt, s


@triton.jit(do_not_specialize=["M"])
def _w4a16_kernel_pair(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                       stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                       RESIDUAL: tl.constexpr, EMULATE: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = pid_m * 16 + tl.arange(0, 16)
    k128, r8 = tl.arange(0, 128), tl.arange(0, 8)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(k_start, k_end, 256):
        wa, xa, sa = _block(w_ptr, z_ptr, s_ptr, x_ptr, k0 // 128, k0, k0 < k_end, cols, N, rows, M, stride_w, stride_g,
                            stride_xm, r8, k128, BLOCK_N, MAGIC, DT, EMULATE)
        live = k0 + 128 < k_end
        wb, xb, sb = _block(w_ptr, z_ptr, s_ptr, x_ptr, tl.where(live, k0 // 128 + 1, k0 // 128), k0 + 128, live, cols,
                            N, rows, M, stride_w, stride_g, stride_xm, r8, k128, BLOCK_N, MAGIC, DT, EMULATE)
        if EMULATE:
            pa = tl.dot(wa, xa.to(tl.float32), input_precision="ieee")
            pb = tl.dot(wb, xb.to(tl.float32), input_precision="ieee")
        else:
            pa = tl.dot(wa, xa, out_dtype=tl.float32)
            pb = tl.dot(wb, xb, out_dtype=tl.float32)
        acc += pa * sa.to(tl.float32)[:, None]                   # in K order: the same sums as the library kernel
        acc += pb * sb.to(tl.float32)[:, None]
    _epilogue(acc, part_ptr, count_ptr, res_ptr, out_ptr, rows, cols, ok, M, N, pid_n, pid_k, pid_m, BLOCK_N, SPLIT,
              RESIDUAL)


@triton.jit(do_not_specialize=["M"])
def _w4a16_kernel_carried(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm,
                          stride_w, stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr,
                          SPLIT: tl.constexpr, RESIDUAL: tl.constexpr, EMULATE: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = pid_m * 16 + tl.arange(0, 16)
    k128, r8 = tl.arange(0, 128), tl.arange(0, 8)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), 128):
        w, xt, s = _block(w_ptr, z_ptr, s_ptr, x_ptr, k0 // 128, k0, k0 < K, cols, N, rows, M, stride_w, stride_g,
                          stride_xm, r8, k128, BLOCK_N, MAGIC, DT, EMULATE)
        if EMULATE:                                              # the weights' rounding, then fp32 products
            w = (w * s.to(tl.float32)[:, None]).to(DT).to(tl.float32)
            acc = tl.dot(w, xt.to(tl.float32), acc, input_precision="ieee")
        else:
            w = w * s[:, None]                                   # (q - z) * s in the weights' dtype
            acc = tl.dot(w, xt, acc, out_dtype=tl.float32)
    _epilogue(acc, part_ptr, count_ptr, res_ptr, out_ptr, rows, cols, ok, M, N, pid_n, pid_k, pid_m, BLOCK_N, SPLIT,
              RESIDUAL)


@triton.jit
def _epilogue(acc, part_ptr, count_ptr, res_ptr, out_ptr, rows, cols, ok, M, N, pid_n, pid_k, pid_m,
              BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, RESIDUAL: tl.constexpr):
    """The library kernel's split-K epilogue, as it is."""
    at = rows[None, :] * N + cols[:, None]
    keep = (rows[None, :] < M) & ok[:, None]
    if SPLIT:
        splits = tl.num_programs(1)
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=keep)
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr + tile, 1) == splits - 1:
            tl.store(count_ptr + tile, 0)
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for kr in range(splits):
                acc += tl.load(part_ptr + kr * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
    else:
        _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
