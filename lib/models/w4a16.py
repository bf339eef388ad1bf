"""W4A16 matrix multiply for decode: y (M, N) = x (M, K) @ W for 1..16 activation rows and AWQ int4 weights.

Layout (read as stored, no repacking): the AWQ GEMM layout of lib.models.quantize, W[k, n] = (q[k, n] -
z[k // group, n]) * s[k // group, n] with
  qweight (K, N/8) int32, qzeros (K/group, N/8) int32: nibble j (bits 4j..4j+3) of packed column c holds
      column 8c + AWQ_ORDER[j], AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7);
  scales (K/group, N) fp16 (or bf16).
AutoAWQ's interleave puts columns 2i and 2i+1 in nibbles i and i+4, i.e. the low and high 16-bit halves of
`packed >> 4i`: one shift and one mask give two neighbouring codes at once, each in its own 16-bit half.

Design (decode on an H100 is memory-bound):
  * every program computes a 16-row tile with tl.dot; rows >= M are loaded as zeros, so a row's arithmetic
    is the same for any M (batch invariance: row i of a 9-row call equals that row computed alone);
  * int4 -> float in registers after the load without a conversion instruction: a code c OR-ed into the
    bit pattern of 128.0 (bf16, 0x4300) or 1024.0 (fp16, 0x6400) *is* the float 128 + c (1024 + c), since
    the unit in the last place there is 1; (128 + q) - (128 + z) = q - z is then exact in x's dtype;
  * the tensor cores take x and the integer weights q - z (exact in bf16/fp16, so every product is
    exact in fp32); the group's scale multiplies the fp32 partial dot afterwards. So the only rounding is
    fp32 accumulation (BLOCK_K must divide the group), unlike rounding (q - z) * s to bf16 first;
  * split-K: program (n, s) covers output columns n*BLOCK_N.. and the s-th K range; with several ranges
    each writes fp32 partials (split, M, N) and a second kernel adds them in the fixed order s = 0, 1, ...
    (no atomics: deterministic). The split is chosen from (N, K) only, never from M.
Measured once (one H200, Triton 3.6, 20 calls in a CUDA graph on the same weights, default tiles): down
(K 25600, N 5120) 72 us and gate/up (K 5120, N 51200) 132 us a call, about 1.0 TB/s of packed weights, flat
from M = 1 to 16, against a 2.8 TB/s device copy in the same run: the dequantisation in registers, not HBM,
bounds it so far. Per-column shifts on a gathered load (no join/reshape) were 13x slower; folding the zero
point into a row-sum correction was slower too.
Under TRITON_INTERPRET=1 (CPU) the interpreter stores bf16 as raw uint16 and cannot add or dot it, so
there the operands are widened to fp32 first: the same exact products, summed in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .quantize import GROUP, PACK, unpack

MAX_ROWS = 16                      # rows of the computed tile; M may be 1..16
TARGET_PROGRAMS = 1600             # split-K aims at about this many programs (132 SMs), with at most
MAX_SPLIT = 16                     # this many K ranges (partials cost M * N * 8 bytes a range)
_MAGIC = {torch.bfloat16: 0x4300, torch.float16: 0x6400}   # bit patterns of 128.0 (bf16) and 1024.0 (fp16)


class AwqInt4(NamedTuple):
    qweight: torch.Tensor          # (K, N/8) int32
    qzeros: torch.Tensor           # (K/group, N/8) int32
    scales: torch.Tensor           # (K/group, N) fp16 or bf16
    group: int


@dataclass(frozen=True)
class Tiles:
    """Launch parameters. Defaults: the best of a small sweep on one H200 (Triton 3.6, M = 1 and 16, down and
    gate/up shapes), where this kernel reached about 1.0 TB/s of packed weights, a third of the copy bandwidth."""
    block_n: int = 128             # output columns per program (power of two, >= 16)
    block_k: int = 64              # K step of the loop (power of two, >= 16, divides the group)
    split_k: int | None = None     # K ranges (None: from N and K so that about TARGET_PROGRAMS programs run)
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _codes(p, MAGIC: tl.constexpr, DT: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """AWQ-packed int32 (ROWS, COLS/8) -> (ROWS, COLS) in dtype DT holding MAGIC + code, in column order."""
    i4 = tl.arange(0, 4) * 4
    # the low half of p >> 4i is nibble i (column 2i), the high half nibble i + 4 (column 2i + 1)
    pairs = ((p[:, :, None] >> i4[None, None, :]) & 0x000F000F) | (MAGIC * 0x10001)
    lo = pairs.to(tl.int16)                                      # truncation keeps the low half
    hi = (pairs >> 16).to(tl.int16)
    # join appends the (lo, hi) axis: (c, i, half) is column 8c + 2i + half, row-major as reshape reads it
    return tl.reshape(tl.join(lo, hi), (ROWS, COLS)).to(DT, bitcast=True)


@triton.jit(do_not_specialize=["M"])                            # one compiled kernel for every M (M == 1 too)
def _w4a16_kernel(x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr, M, N, K, stride_xm, k_per_split,
                  GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MAGIC: tl.constexpr,
                  EMULATE: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    N8 = N // 8
    rows = tl.arange(0, 16)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    pcols = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    kk = tl.arange(0, BLOCK_K)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        # padded rows read as 0: the tile, and so each row's sums, do not depend on M
        x = tl.load(x_ptr + rows[:, None] * stride_xm + (k0 + kk)[None, :], mask=rows[:, None] < M, other=0.0)
        q = tl.load(qw_ptr + (k0 + kk).to(tl.int64)[:, None] * N8 + pcols[None, :],
                    mask=pcols[None, :] < N8, other=0)
        g = k0 // GROUP                                          # one group per step: BLOCK_K divides GROUP
        z = tl.load(qz_ptr + g * N8 + pcols[None, :], mask=pcols[None, :] < N8, other=0)
        s = tl.load(s_ptr + g * N + cols, mask=cols < N, other=0.0).to(tl.float32)
        wq = _codes(q, MAGIC, DT, BLOCK_K, BLOCK_N)
        zq = _codes(z, MAGIC, DT, 1, BLOCK_N)
        if EMULATE:                                              # interpreter: same exact values in fp32
            part = tl.dot(x.to(tl.float32), wq.to(tl.float32) - zq.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(x, wq - zq, out_dtype=tl.float32)      # (MAGIC+q) - (MAGIC+z) = q - z exactly
        acc += part * s[None, :]                                 # the group's scale, in fp32
    # split == 1: out_ptr is y itself (cast to its dtype); else the fp32 partials of range pid_k
    ptrs = out_ptr + pid_k * M * N + rows[:, None] * N + cols[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=["total"])
def _reduce_kernel(part_ptr, out_ptr, total, splits, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(splits):                                      # fixed order: deterministic, batch-invariant
        acc += tl.load(part_ptr + s * total + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


# Triton picks the interpreter when the kernels are decorated, so ask the kernel rather than the environment
_INTERPRETED = type(_w4a16_kernel).__name__ == "InterpretedFunction"


def awq_weight(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> AwqInt4:
    """Check the AWQ GEMM tensors (shapes, dtypes) and bundle them, contiguous, for w4a16_matmul."""
    K, n8 = qweight.shape
    if K % group:
        raise ValueError(f"K={K} is not a multiple of the group size {group}")
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32 or qzeros.shape != (K // group, n8):
        raise ValueError(f"qweight/qzeros must be int32 of shapes (K, N/8), (K/group, N/8); got "
                         f"{tuple(qweight.shape)} {qweight.dtype}, {tuple(qzeros.shape)} {qzeros.dtype}")
    if scales.shape != (K // group, n8 * PACK) or scales.dtype not in _MAGIC:
        raise ValueError(f"scales must be fp16/bf16 of shape {(K // group, n8 * PACK)}, got "
                         f"{tuple(scales.shape)} {scales.dtype}")
    return AwqInt4(qweight.contiguous(), qzeros.contiguous(), scales.contiguous(), group)


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """Torch reference: the (K, N) float32 weight the AWQ tensors stand for (quantize.unpack's nibble order)."""
    w = awq_weight(qweight, qzeros, scales, group)
    q, z = unpack(w.qweight), unpack(w.qzeros)                   # (K, N), (K/group, N) codes
    return (q - z.repeat_interleave(group, 0)).float() * w.scales.float().repeat_interleave(group, 0)


def split_plan(K: int, N: int, tiles: Tiles) -> tuple[int, int]:
    """(split, K per split): from the shape and tiles only, never from M (batch invariance)."""
    blocks = K // tiles.block_k
    split = tiles.split_k or min(MAX_SPLIT, triton.cdiv(TARGET_PROGRAMS, triton.cdiv(N, tiles.block_n)))
    per = triton.cdiv(blocks, max(1, min(split, blocks)))       # K blocks per range
    return triton.cdiv(blocks, per), per * tiles.block_k        # no empty ranges


def check_tiles(tiles: Tiles, group: int) -> None:
    pow2 = all(v >= 16 and v & (v - 1) == 0 for v in (tiles.block_n, tiles.block_k))
    if not pow2 or group % tiles.block_k:
        raise ValueError(f"block_n and block_k must be powers of two >= 16 and block_k must divide the group "
                         f"size {group}; got {tiles}")


def w4a16_matmul(x: torch.Tensor, w: AwqInt4, tiles: Tiles = Tiles(), out_dtype: torch.dtype | None = None):
    """y (M, N) = x (M, K) @ W in fp32 accumulation, as out_dtype (default x's dtype); M in 1..16."""
    M, K = x.shape
    N = w.scales.shape[1]
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"w4a16_matmul takes 1..{MAX_ROWS} rows, got M={M}")
    if K != w.qweight.shape[0] or x.dtype not in _MAGIC:
        raise ValueError(f"x must be fp16/bf16 of shape (M, {w.qweight.shape[0]}), got {tuple(x.shape)} {x.dtype}")
    check_tiles(tiles, w.group)
    x = x if x.stride(1) == 1 else x.contiguous()
    split, per = split_plan(K, N, tiles)
    y = torch.empty(M, N, dtype=out_dtype or x.dtype, device=x.device)
    dst = y if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    _w4a16_kernel[(triton.cdiv(N, tiles.block_n), split)](
        x, w.qweight, w.qzeros, w.scales, dst, M, N, K, x.stride(0), per, w.group, tiles.block_n,
        tiles.block_k, _MAGIC[x.dtype], _INTERPRETED,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    if split > 1:
        _reduce_kernel[(triton.cdiv(M * N, 1024),)](dst, y, M * N, split, 1024)
    return y
