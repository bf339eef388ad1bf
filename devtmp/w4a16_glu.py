"""Experiment (issue 26, eighth session, prepared, not timed): SiLU(gate) * up in the W4A16 kernel's epilogue.
The fused gate/up weight (K, 2H) keeps its layout: a program's 64 columns are 32 gate columns c.. and the 32 up
columns H + c.., so its accumulator holds both halves of 32 outputs; the epilogue (after the split-K sum where
there is one) rounds each to the activations' dtype as the separate projection does, and writes
silu(gate) * up, computed in fp32 and rounded once, to (M, H). Saves the SiLU-mul kernel a layer (64 launches and
0.09 ms a step on the H100 at b367605) and the (M, 2H) round trip. glu_matmul(x, w) is the entry point."""
import torch
import triton
import triton.language as tl
from lib.models import w4a16 as W
from lib.models.w4a16 import _half


@triton.jit(do_not_specialize=["M"])
def _w4a16_glu_kernel(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                      stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                      EMULATE: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    HALF: tl.constexpr = BLOCK_N // 2
    H = N // 2
    rows = pid_m * 16 + tl.arange(0, 16)
    k128, r8, j = tl.arange(0, 128), tl.arange(0, 8), tl.arange(0, BLOCK_N)
    out_cols = pid_n * HALF + j % HALF                            # the output column each accumulator row feeds
    cols = tl.where(j < HALF, out_cols, H + out_cols)             # gate rows, then the matching up rows
    ok = out_cols < H
    k_start = pid_k * k_per_split
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), 128):
        g = k0 // 128
        z = tl.load(z_ptr + g * stride_g + cols, mask=ok, other=0).to(tl.int32)
        s = tl.load(s_ptr + g * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        base = w_ptr + (2 * g).to(tl.int64) * stride_w
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w = tl.join(_half(w0, zz, BLOCK_N, DT, EMULATE), _half(w1, zz, BLOCK_N, DT, EMULATE))
        w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None], mask=rows[None, :] < M, other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)
        acc += part * s[:, None]
    at = rows[None, :] * N + cols[:, None]
    keep = (rows[None, :] < M) & ok[:, None]
    if SPLIT:                                                    # the library kernel's split-K sum, as it is
        splits = tl.num_programs(1)
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=keep)
        tl.debug_barrier()
        tile = pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr + tile, 1) == splits - 1:
            tl.store(count_ptr + tile, 0)
            acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for kr in range(splits):
                acc += tl.load(part_ptr + kr * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            _store_glu(out_ptr, acc, rows, pid_n, M, H, HALF)
    else:
        _store_glu(out_ptr, acc, rows, pid_n, M, H, HALF)


@triton.jit
def _store_glu(out_ptr, acc, rows, pid_n, M, H, HALF: tl.constexpr):
    DT: tl.constexpr = out_ptr.dtype.element_ty
    gate, up = tl.split(tl.permute(tl.reshape(acc, (2, HALF, 16)), (1, 2, 0)))
    gate = gate.to(DT).to(tl.float32)                            # each projection rounded as it would be stored
    up = up.to(DT).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    c = pid_n * HALF + tl.arange(0, HALF)
    tl.store(out_ptr + rows[None, :] * H + c[:, None], y.to(DT), mask=(rows[None, :] < M) & (c < H)[:, None])


def glu_matmul(x: torch.Tensor, w: W.PackedInt4, tiles: W.Tiles = W.Tiles(), maxnreg: int | None = None) -> torch.Tensor:
    """silu(x @ W[:, :H]) * (x @ W[:, H:]) for the fused gate/up weight W (K, 2H): (M, H). maxnreg: a register cap
    (offline, sm_90a: 95 registers unsplit, 5 programs an SM; 80 without spills, 6; 72 with a 16-byte stack, 7)."""
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    M, K = x.shape
    N = w.scales.shape[1]
    split, per = W.split_plan(K, N, tiles)
    grid = (triton.cdiv(N // 2, tiles.block_n // 2), split, triton.cdiv(M, W.ROWS))
    y = torch.empty(M, N // 2, dtype=x.dtype, device=x.device)
    part = torch.empty(split, M, N, dtype=torch.float32, device=x.device) if split > 1 else y
    count = W.tile_counters(x.device, grid[0] * grid[2])
    with W.on(x.device):
        _w4a16_glu_kernel[grid](x, w.words, w.zeros, w.scales, part, count, y, M, N, K, x.stride(0),
                                w.words.stride(0), w.scales.stride(0), per, tiles.block_n, W._MAGIC[x.dtype],
                                split > 1, W._EMULATE, num_warps=tiles.num_warps, num_stages=tiles.num_stages, **extra)
    return y
