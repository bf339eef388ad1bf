"""Experiment (issue 26, tenth session): lib/models/w4a16.py's kernel (with the fp16 nibble trick) with the zero
points and scales of the next K-block loaded one iteration ahead into registers (ZPRE). Offline SASS of the library
kernel: the 1- and 2-byte z/s loads cannot be cp.async'd, so Triton leaves them as plain loads inside the loop whose
DRAM latency the iteration waits on (z feeds the dequantisation). Same arithmetic, same order: bitwise the library's.
Launch with the library's arguments."""
import triton
import triton.language as tl
from lib.models.w4a16 import _half, _store
from w4a16_v2 import _epilogue


@triton.jit
def _zs(z_ptr, s_ptr, g, live, cols, ok, stride_g, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr):
    """K-block g's (zz, zh, scale) as the dequantisation and the epilogue of the scale use them."""
    okl = ok & live
    z = tl.load(z_ptr + g * stride_g + cols, mask=okl, other=0).to(tl.int32)
    s = tl.load(s_ptr + g * stride_g + cols, mask=okl, other=0.0).to(tl.float32)
    zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
    zh = (z << 4) | 0xD400
    zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
    return zz, zh, s


@triton.jit(do_not_specialize=["M"])
def _w4a16_kernel_zpre(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                       stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                       RESIDUAL: tl.constexpr, EMULATE: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = pid_m * 16 + tl.arange(0, 16)
    k128 = tl.arange(0, 128)
    r8 = tl.arange(0, 8)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    zz, zh, s = _zs(z_ptr, s_ptr, k_start // 128, k_start < k_end, cols, ok, stride_g, BLOCK_N, MAGIC)
    for k0 in range(k_start, k_end, 128):
        g = k0 // 128
        zzn, zhn, sn = _zs(z_ptr, s_ptr, g + 1, k0 + 128 < k_end, cols, ok, stride_g, BLOCK_N, MAGIC)  # ahead
        base = w_ptr + (2 * g).to(tl.int64) * stride_w
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
        w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)
        acc += part * s[:, None]
        zz, zh, s = zzn, zhn, sn
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


def pack_zs(w):
    """ZSWORD's layout: the scale's 16 bits and the zero point (bits 16-19) of a column and group in one int32."""
    import torch
    bits = w.scales.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return type(w)(w.words, (bits | (w.zeros.to(torch.int32) << 16)).contiguous(), w.scales)


@triton.jit(do_not_specialize=["M"])
def _w4a16_kernel_zsword(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm,
                         stride_w, stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr,
                         SPLIT: tl.constexpr, RESIDUAL: tl.constexpr, EMULATE: tl.constexpr):
    """ZSWORD: z_ptr holds pack_zs's words (4 bytes a column and group, cp.async-able, so pipelined with the weights)."""
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = pid_m * 16 + tl.arange(0, 16)
    k128 = tl.arange(0, 128)
    r8 = tl.arange(0, 8)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), 128):
        g = k0 // 128
        zs = tl.load(z_ptr + g * stride_g + cols, mask=ok, other=0)
        s = (zs & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
        z = (zs >> 16) & 0xF
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        zh = (z << 4) | 0xD400
        zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
        base = w_ptr + (2 * g).to(tl.int64) * stride_w
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
        w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)
        acc += part * s[:, None]
    _epilogue(acc, part_ptr, count_ptr, res_ptr, out_ptr, rows, cols, ok, M, N, pid_n, pid_k, pid_m, BLOCK_N, SPLIT,
              RESIDUAL)
