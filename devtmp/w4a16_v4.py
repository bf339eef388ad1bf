"""W4A16 matrix multiply for decode and verify: y (M, N) = x (M, K) @ W with AWQ int4 weights, any M, exact
and batch-invariant; `Int4Linear` puts it in a model as the `triton_w4a16` AWQ backend.

Layout: AWQ's GEMM tensors (qweight (K, N/8), qzeros (K/128, N/8) int32 in AWQ's nibble order, scales
(K/128, N)) are repacked once at load (`pack_awq`) into
  words (K/64, N, 8) int32: word [2b + h, n, r] holds in bits 4j + 16t (j 0..3, t 0..1) the code of column n,
      k = 128b + 16(4h + j) + 2r + t (K-block b = one group); a program's (columns, 8) tile is contiguous,
  groups (K/128, N, 2) in the scales' dtype (fp16 or bf16): [..., 0] the group's scale, [..., 1] its zero point's
      code (0..15) as the bits of an int16; group 128 only. A column's scale and zero point are one 4-byte word
      (AWQ stores 2.5 bytes: 1.6 % more bytes in all).
So a mask of a word leaves the codes of k and k + 1 (neighbours in K) in its two 16-bit halves, which is where
the tensor cores want a thread's pair of an operand, and chunk 4h + j of a K-block (16 K positions) is in bits
4j.. of 8 words.

Kernel (decode on an H100 is memory-bound; the int4 -> float work must stay under the load):
  * operands swapped, out^T (BLOCK_N, 16) = W^T (BLOCK_N, K) @ x^T (K, 16): the weights are the register
    operand of a 64..256-row wgmma and the 16 (padded) activation rows the shared-memory one. Rows >= M are
    zeros, so each row's arithmetic is the same for any M: batch invariance (row i of a 9-row call equals that
    row alone). M > 16 runs in tiles of 16 rows (grid axis 2), e.g. a prefill;
  * int4 -> float without a conversion: a code c OR-ed into the bit pattern of 1024.0 (fp16, 0x6400) or 128.0
    (bf16, 0x4300) is that float plus c, since its unit in the last place is 1. One lop3 does (word & 0x000F000F)
    | magic for two codes, one sub.{f16,bf16}x2 takes (magic + z) off both: q - z, exact (inline PTX). In fp16
    an odd chunk needs no shift (marlin's trick): its codes OR-ed into 1024.0 four bits up give 1024 + 16c, and
    one fma (/16, - (64 + z)) leaves c - z; one shift by 8 a word serves chunks 2 and 3 (bf16's 7-bit mantissa has
    no room for that: one shift a chunk);
  * the scale-and-zero word of a group is 4 bytes, which cp.async can copy: Triton pipelines it with the weights
    (num_stages), where a 1-byte zero point and a 2-byte scale were plain loads whose DRAM latency each K-block
    waited on;
  * the eight chunks of a K-block (16 K positions each) are joined into one (BLOCK_N, 128) operand in natural K
    order and multiplied by ONE dot (K = 128): one fence and one wait a K-block, where eight chained K = 16 dots
    drained the tensor-core pipe eight times (and took 15-18 % longer on one H100; the outputs are bit-equal);
  * the group's scale multiplies the fp32 sum of a K-block (128 = one group) afterwards, so the only rounding is
    fp32 accumulation; the tensor cores' products of x and the integers q - z are exact;
  * split-K: program (n, s, m) covers columns n*BLOCK_N .., the s-th range of K-blocks, rows 16m ..; with
    several ranges each writes fp32 partials (split, M, N), and the last to finish (a counter per tile) adds
    them in the order s = 0, 1, ...: deterministic, one launch. The split comes from (N, K) only, never from M;
  * a residual (the layer's stream) can be added to the fp32 sum before its one rounding, in the epilogue.
Measured (one H100, the int4 table of outputs/h100awq/int4_kernels.json, 68faadc): a Qwen3-32B layer's four
projections take 104 us at one row and 110 us at 16 (floor 87 us: AWQ's bytes at the copy bandwidth; gptqmodel's
marlin 125 and 134): gate/up at 93 % of that floor's speed, down 83 %, q/k/v 68 %, o 62 % (their fixed cost: the
ramp-up of one wave and the split-K tail). Before the scale-and-zero word and the fp16 shift trick (b367605): 118 and
122 us. Compiled offline (sm_90a, Triton 3.9, ptxas 12.9, default tiles): 72 registers (7 programs an SM; ptxas
alone takes 77-78, 6 an SM), a K-block loop of 221 warp instructions for 2,048 weights a warp (226 before); ncu on
gate/up: issue slots busy 70 % of the time (63 % before), DRAM at 70 % of its peak. The eight-dot kernel before
these: 319 instructions, 48 registers, 137-166 us a layer.
Programmatic dependent launch (Hopper): a call waits for the kernel before at its top and lets the next launch
after its K loop, hiding that launch under its tail. One H100, h100awq step (record 51bc51e): 8.576 -> 8.480 ms;
triggered at the top 8.661 (slower), with the first K-blocks asked into L2 before the wait 8.567.
Under TRITON_INTERPRET=1 (CPU) inline PTX cannot run, so there the same q - z come from integer arithmetic and
the products are summed in fp32 (`_EMULATE`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from lib.bench import on
from lib.engine.kernels import _launch_next, _wait, counters, launches
from lib.models.quantize import GROUP, as_int32, unpack

ROWS = 16                          # activation rows of one program (the wgmma's N)
# split-K: enough K ranges for about 640 programs, all resident at once on an H100 (132 SMs, 7 programs an SM)
# One H100, 8 rows, the 32B decode shapes, interleaved: the best of the splits tried for q/k/v (4 ranges; 1, 2, 8
# tried), o (8; 4, 16), gate/up (1; 2, 4, 8: 4 was 6 % slower) and down (8; 16 was 11 % slower); the same with the
# scale-and-zero word at 1 and 8 rows (q/k/v 2-8, o 4-16, gate/up 1-2, down 4-16 tried; 3 stages best of 2-4)
PROGRAMS = 640
MAX_SPLIT = 16                     # K ranges at most (partials cost M * N * 4 bytes a range)
_MAGIC = {torch.float16: 0x6400, torch.bfloat16: 0x4300}      # 1024.0 (fp16) and 128.0 (bf16)


class PackedInt4(NamedTuple):
    words: torch.Tensor            # (K/64, N, 8) int32, the layout above
    groups: torch.Tensor           # (K/128, N, 2) fp16 or bf16: scale, zero point code


@dataclass(frozen=True)
class Tiles:
    """Launch parameters: output columns a program computes, K ranges, warps and pipeline stages. Defaults: the best
    of sweeps on one H200 and one H100 (block_n 64/128 x warps 4/8 x stages 2/3/4 x splits, 8 rows)."""
    block_n: int = 64              # 64, 128 or 256 (the wgmma's M)
    split_k: int | None = None     # K ranges (None: from N and K, see split_plan)
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = 72       # registers a thread (None: ptxas's choice, 77-78 here: 6 programs an SM, and
                                   # gate/up's 800 programs a second wave); 72 fits 7 an SM (fp16: no spill; bf16
                                   # with split-K: 8 bytes)


@triton.jit
def _pair(p, j: tl.constexpr, zz, zh, DT: tl.constexpr, EMULATE: tl.constexpr):
    """(lo, hi) = the codes of chunk j (bits 4j..4j+3 and 16+4j..) of the words p minus the zero point, as DT; zz
    holds (magic + z) twice, zh the fp16 bits of -(64 + z) twice. fp16 (marlin's trick): one shift a word, by 8,
    serves chunks 2 and 3; an odd chunk's codes stay 4 bits up, where OR-ed into 1024.0 they make 1024 + 16c, and
    one fma (x / 16 - (64 + z)) leaves c - z, exact. bf16's 7-bit mantissa has no room for that: one shift a chunk."""
    if EMULATE:
        q = p >> (4 * j)
        z = zz & 0xF
        return ((q & 0xF) - z).to(tl.float32), (((q >> 16) & 0xF) - z).to(tl.float32)
    elif DT == tl.float16 and j % 2 == 1:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, s; mov.b32 s, 0x2C002C00; lop3.b32 t, $2, 0x00F000F0, 0x64006400, 0xEA; "
            "fma.rn.f16x2 t, t, s, $3; mov.b32 {$0, $1}, t; }",
            "=h,=h,r,r", [p >> (8 * (j // 2)), zh], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    elif DT == tl.float16:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 t, t, $3; mov.b32 {$0, $1}, t; }",
            "=h,=h,r,r", [p >> (8 * (j // 2)), zz], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; sub.bf16x2 t, t, $3; mov.b32 {$0, $1}, t; }",
            "=h,=h,r,r", [p >> (4 * j), zz], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)


@triton.jit
def _chunk(words, j: tl.constexpr, zz, zh, BLOCK_N: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr):
    """Chunk j of a half K-block's (BLOCK_N, 8) words: (column, 2r + t), its 16 K positions in order."""
    lo, hi = _pair(words, j, zz, zh, DT, EMULATE)
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, 16))


@triton.jit
def _half(words, zz, zh, BLOCK_N: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr):
    """The four chunks of a half K-block, (BLOCK_N, 16, 2, 2): index [n, kk, b, a] holds chunk 2a + b."""
    c0, c1 = _chunk(words, 0, zz, zh, BLOCK_N, DT, EMULATE), _chunk(words, 1, zz, zh, BLOCK_N, DT, EMULATE)
    c2, c3 = _chunk(words, 2, zz, zh, BLOCK_N, DT, EMULATE), _chunk(words, 3, zz, zh, BLOCK_N, DT, EMULATE)
    return tl.join(tl.join(c0, c1), tl.join(c2, c3))


@triton.jit(do_not_specialize=["M"])                            # one compiled kernel for every M (M == 1 too)
def _w4a16_kernel(x_ptr, w_ptr, g_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                  stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                  RESIDUAL: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr):
    """RESIDUAL: out = res + the product, added in fp32 and rounded once. PDL: launched as a programmatic
    dependent launch (Hopper): waits for the kernel before at its top, lets the next launch after its K loop."""
    _wait(PDL)                                                   # x (and the residual) written by the kernel before
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
        g = k0 // 128                                            # one group a K-block
        sz = tl.load(g_ptr + g * stride_g + cols, mask=ok, other=0)             # int32: scale bits, zero point
        s = (sz & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
        z = (sz >> 16) & 0xF
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        zh = (z << 4) | 0xD400                                   # -(64 + z) in fp16 (only fp16 uses it)
        zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
        base = w_ptr + (2 * g).to(tl.int64) * stride_w           # the (N, 8) words of half 0, then of half 1
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        # the eight chunks as one (BLOCK_N, 128) operand: index [n, kk, b, a, h] holds chunk 4h + 2a + b, and the
        # permute puts K back in its natural order, so one dot (K = 128) replaces eight chained K = 16 dots
        w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
        w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        # padded rows read as 0: the tile, and so each row's sums, do not depend on M
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)
        acc += part * s[:, None]                                 # the group's scale, in fp32
    _launch_next(PDL)                # the next kernel's programs take the SMs as ours end, and wait for our stores
    at = rows[None, :] * N + cols[:, None]
    keep = (rows[None, :] < M) & ok[:, None]
    if SPLIT:                                                    # fp32 partials; the last range to finish adds them
        splits = tl.num_programs(1)
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=keep)
        tl.debug_barrier()                                       # partials stored before we count ourselves
        tile = pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr + tile, 1) == splits - 1:     # acq_rel: the last sees every partial
            tl.store(count_ptr + tile, 0)                        # ready for the next call
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for kr in range(splits):                             # fixed order: deterministic, batch-invariant
                acc += tl.load(part_ptr + kr * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
    else:
        _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)



@triton.jit(do_not_specialize=["M"])                            # one compiled kernel for every M (M == 1 too)
def _w4a16_kernel_sopaque(x_ptr, w_ptr, g_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                  stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                  RESIDUAL: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr):
    """RESIDUAL: out = res + the product, added in fp32 and rounded once. PDL: launched as a programmatic
    dependent launch (Hopper): waits for the kernel before at its top, lets the next launch after its K loop."""
    _wait(PDL)                                                   # x (and the residual) written by the kernel before
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
        g = k0 // 128                                            # one group a K-block
        sz = tl.load(g_ptr + g * stride_g + cols, mask=ok, other=0)             # int32: scale bits, zero point
        sq = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [sz], dtype=tl.int32, is_pure=False, pack=1)
        s = (sq & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
        z = (sz >> 16) & 0xF
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        zh = (z << 4) | 0xD400                                   # -(64 + z) in fp16 (only fp16 uses it)
        zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
        base = w_ptr + (2 * g).to(tl.int64) * stride_w           # the (N, 8) words of half 0, then of half 1
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        # the eight chunks as one (BLOCK_N, 128) operand: index [n, kk, b, a, h] holds chunk 4h + 2a + b, and the
        # permute puts K back in its natural order, so one dot (K = 128) replaces eight chained K = 16 dots
        w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
        w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        # padded rows read as 0: the tile, and so each row's sums, do not depend on M
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)
        acc += part * s[:, None]                                 # the group's scale, in fp32
    _launch_next(PDL)                # the next kernel's programs take the SMs as ours end, and wait for our stores
    at = rows[None, :] * N + cols[:, None]
    keep = (rows[None, :] < M) & ok[:, None]
    if SPLIT:                                                    # fp32 partials; the last range to finish adds them
        splits = tl.num_programs(1)
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=keep)
        tl.debug_barrier()                                       # partials stored before we count ourselves
        tile = pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr + tile, 1) == splits - 1:     # acq_rel: the last sees every partial
            tl.store(count_ptr + tile, 0)                        # ready for the next call
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for kr in range(splits):                             # fixed order: deterministic, batch-invariant
                acc += tl.load(part_ptr + kr * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
    else:
        _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)



@triton.jit(do_not_specialize=["M"])                            # one compiled kernel for every M (M == 1 too)
def _w4a16_kernel_spure(x_ptr, w_ptr, g_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                  stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                  RESIDUAL: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr):
    """RESIDUAL: out = res + the product, added in fp32 and rounded once. PDL: launched as a programmatic
    dependent launch (Hopper): waits for the kernel before at its top, lets the next launch after its K loop."""
    _wait(PDL)                                                   # x (and the residual) written by the kernel before
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
        g = k0 // 128                                            # one group a K-block
        sz = tl.load(g_ptr + g * stride_g + cols, mask=ok, other=0)             # int32: scale bits, zero point
        sq = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [sz], dtype=tl.int32, is_pure=True, pack=1)
        s = (sq & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
        z = (sz >> 16) & 0xF
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        zh = (z << 4) | 0xD400                                   # -(64 + z) in fp16 (only fp16 uses it)
        zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
        base = w_ptr + (2 * g).to(tl.int64) * stride_w           # the (N, 8) words of half 0, then of half 1
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        # the eight chunks as one (BLOCK_N, 128) operand: index [n, kk, b, a, h] holds chunk 4h + 2a + b, and the
        # permute puts K back in its natural order, so one dot (K = 128) replaces eight chained K = 16 dots
        w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
        w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        # padded rows read as 0: the tile, and so each row's sums, do not depend on M
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)
        acc += part * s[:, None]                                 # the group's scale, in fp32
    _launch_next(PDL)                # the next kernel's programs take the SMs as ours end, and wait for our stores
    at = rows[None, :] * N + cols[:, None]
    keep = (rows[None, :] < M) & ok[:, None]
    if SPLIT:                                                    # fp32 partials; the last range to finish adds them
        splits = tl.num_programs(1)
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=keep)
        tl.debug_barrier()                                       # partials stored before we count ourselves
        tile = pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr + tile, 1) == splits - 1:     # acq_rel: the last sees every partial
            tl.store(count_ptr + tile, 0)                        # ready for the next call
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for kr in range(splits):                             # fixed order: deterministic, batch-invariant
                acc += tl.load(part_ptr + kr * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
    else:
        _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)



@triton.jit
def _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL: tl.constexpr):
    if RESIDUAL:
        acc += tl.load(res_ptr + at, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=keep)


