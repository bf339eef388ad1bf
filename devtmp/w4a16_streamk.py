"""Development (not in lib yet): a stream-K variant of lib.models.w4a16's kernel. The (column tile, K-block) units
of a matmul are cut into P equal contiguous ranges, P = the resident programs of the GPU (no wave tail); a tile cut
between programs is summed by its last finisher in program order: deterministic, and independent of M."""
import math
import torch
import triton
import triton.language as tl
from lib.models.w4a16 import _pair, _MAGIC, _EMULATE, PackedInt4, tile_counters, ROWS


@triton.jit
def _first_program(u, P, total):
    """The program whose range [p*total//P, (p+1)*total//P) holds unit u."""
    return ((u + 1) * P - 1) // total


@triton.jit(do_not_specialize=["M"])
def _w4a16_streamk(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, out_ptr, M, N, K, stride_xm, stride_w, stride_g,
                   BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, EMULATE: tl.constexpr):
    p, pid_m = tl.program_id(0), tl.program_id(1)
    P = tl.num_programs(0)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    blocks = K // 128
    tiles = tl.cdiv(N, BLOCK_N)
    total = tiles * blocks
    u0 = (p * total) // P
    u1 = ((p + 1) * total) // P
    rows = pid_m * 16 + tl.arange(0, 16)
    k16 = tl.arange(0, 16)
    r8 = tl.arange(0, 8)
    for t in range(u0 // blocks, tl.cdiv(u1, blocks)):
        b0 = tl.maximum(u0, t * blocks) - t * blocks               # this program's K-blocks of tile t
        b1 = tl.minimum(u1, (t + 1) * blocks) - t * blocks
        cols = t * BLOCK_N + tl.arange(0, BLOCK_N)
        ok = cols < N
        acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
        for g in range(b0, b1):
            z = tl.load(z_ptr + g * stride_g + cols, mask=ok, other=0).to(tl.int32)
            s = tl.load(s_ptr + g * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
            zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
            part = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
            for h in tl.static_range(2):
                base = w_ptr + tl.cast(2 * g + h, tl.int64) * stride_w
                words = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
                for j in tl.static_range(4):
                    k = g * 128 + 16 * (4 * h + j) + k16
                    xt = tl.load(x_ptr + rows[None, :] * stride_xm + k[:, None], mask=rows[None, :] < M, other=0.0)
                    lo, hi = _pair(words >> (4 * j), zz, DT, EMULATE)
                    w = tl.reshape(tl.join(lo, hi), (BLOCK_N, 16))
                    if EMULATE:
                        part = tl.dot(w, xt.to(tl.float32), part, input_precision="ieee")
                    else:
                        part = tl.dot(w, xt, part, out_dtype=tl.float32)
            acc += part * s[:, None]
        at = rows[None, :] * N + cols[:, None]
        keep = (rows[None, :] < M) & ok[:, None]
        if (b0 == 0) & (b1 == blocks):                             # the whole tile: straight out
            tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=keep)
        else:                                                      # a piece: piece 0 = the program's first tile
            piece = (t != u0 // blocks).to(tl.int32)
            slot = ((p * 2 + piece) * tl.num_programs(1) + pid_m).to(tl.int64) * (16 * BLOCK_N)
            tl.store(part_ptr + slot + tl.arange(0, 16)[None, :] * BLOCK_N + tl.arange(0, BLOCK_N)[:, None], acc)
            tl.debug_barrier()
            p_first = _first_program(t * blocks, P, total)
            p_last = _first_program((t + 1) * blocks - 1, P, total)
            tile = pid_m * tiles + t
            if tl.atomic_add(count_ptr + tile, 1) == p_last - p_first:
                tl.store(count_ptr + tile, 0)
                acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
                for q in range(p_first, p_last + 1):               # program order: deterministic
                    pq = (t != (q * total // P) // blocks).to(tl.int32)
                    sq = ((q * 2 + pq) * tl.num_programs(1) + pid_m).to(tl.int64) * (16 * BLOCK_N)
                    acc += tl.load(part_ptr + sq + tl.arange(0, 16)[None, :] * BLOCK_N + tl.arange(0, BLOCK_N)[:, None],
                                   cache_modifier=".cg")
                tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=keep)


def resident_programs(device, block_n=64, num_warps=4, per_sm=10):
    """Programs the GPU holds at once (default tiles: 48 registers, 20 KB shared -> 10 a Hopper SM)."""
    if device.type != "cuda":
        return 7
    return torch.cuda.get_device_properties(device).multi_processor_count * per_sm


def w4a16_streamk(x, w: PackedInt4, block_n=64, num_warps=4, num_stages=3, programs=None, maxnreg=None):
    M, K = x.shape
    N = w.scales.shape[1]
    P = min(programs or resident_programs(x.device, block_n, num_warps), triton.cdiv(N, block_n) * (K // 128))
    mt = triton.cdiv(M, ROWS)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(P * 2 * mt * 16 * block_n, dtype=torch.float32, device=x.device)
    counters = tile_counters(x.device, triton.cdiv(N, block_n) * mt)
    _w4a16_streamk[(P, mt)](x, w.words, w.zeros, w.scales, part, counters, y, M, N, K, x.stride(0), w.words.stride(0),
                            w.scales.stride(0), block_n, _MAGIC[x.dtype], _EMULATE,
                            num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return y
