"""Twelfth session, offline (no device time left): the W4A16 kernel with two K-blocks (groups) an iteration, so that
the loop's bookkeeping (addresses, the pipeline's barriers and commits, the uniform-datapath counters: ~130 of the
221 SASS instructions a K-block, sm_90a, 64 columns, 4 warps, 3 stages, 72 registers) is paid once for two groups.
The accumulation order is the kernel's (acc += dot_a * s_a, then acc += dot_b * s_b), so outputs are bitwise the same.
An odd number of K-blocks in a range: the second group of the last iteration is masked (weights, scales and x read
as 0). Usage: offline SASS `python3 devtmp/sass_w4.py OUT 64 4 3 k2` (MAXNREG=72); interpreter check
`TRITON_INTERPRET=1 python3 devtmp/w4a16_k2.py`; on a GPU `python3 devtmp/w4a16_k2.py bench`."""
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch
import triton
import triton.language as tl
from lib.bench import on
from lib.models import w4a16 as W
from lib.models.w4a16 import _half, _store


@triton.jit
def _group(w_ptr, g_ptr, x_ptr, g, k0, kend, rows, cols, ok, M, stride_xm, stride_w, stride_g,
           BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, EMULATE: tl.constexpr):
    """Group g (K positions k0.. k0 + 127): its dequantised (BLOCK_N, 128) operand, x^T tile and scales; all read as
    0 where k0 >= kend."""
    DT: tl.constexpr = x_ptr.dtype.element_ty
    k128 = tl.arange(0, 128)
    r8 = tl.arange(0, 8)
    live = ok & ((cols * 0 + k0) < kend)                          # the group holds K positions of the range
    sz = tl.load(g_ptr + g * stride_g + cols, mask=live, other=0)
    s = (sz & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    z = (sz >> 16) & 0xF
    zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
    zh = (z << 4) | 0xD400
    zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
    base = w_ptr + (2 * g).to(tl.int64) * stride_w
    w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=live[:, None], other=0)
    w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=live[:, None], other=0)
    w = tl.join(_half(w0, zz, zh, BLOCK_N, DT, EMULATE), _half(w1, zz, zh, BLOCK_N, DT, EMULATE))
    w = tl.reshape(tl.permute(w, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
    xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + k128)[:, None],
                 mask=(rows[None, :] < M) & ((k0 + k128)[:, None] < kend), other=0.0)
    return w, xt, s


@triton.jit(do_not_specialize=["M"])
def _w4a16_kernel_k2(x_ptr, w_ptr, g_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                     stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                     RESIDUAL: tl.constexpr, EMULATE: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * 16 + tl.arange(0, 16)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    kend = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(k_start, kend, 256):                          # two groups an iteration
        g = k0 // 128
        wa, xa, sa = _group(w_ptr, g_ptr, x_ptr, g, k0, kend, rows, cols, ok, M, stride_xm, stride_w, stride_g,
                            BLOCK_N, MAGIC, EMULATE)
        wb, xb, sb = _group(w_ptr, g_ptr, x_ptr, g + 1, k0 + 128, kend, rows, cols, ok, M, stride_xm, stride_w,
                            stride_g, BLOCK_N, MAGIC, EMULATE)
        if EMULATE:
            pa = tl.dot(wa, xa.to(tl.float32), input_precision="ieee")
            pb = tl.dot(wb, xb.to(tl.float32), input_precision="ieee")
        else:
            pa = tl.dot(wa, xa, out_dtype=tl.float32)
            pb = tl.dot(wb, xb, out_dtype=tl.float32)
        acc += pa * sa[:, None]                                   # the kernel's order: group a, then group b
        acc += pb * sb[:, None]
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


def matmul_k2(x, w, tiles=W.Tiles()):
    """w4a16_matmul with the two-group loop (no residual)."""
    M, K = x.shape
    N = w.groups.shape[1]
    split, per = W.split_plan(K, N, tiles)
    grid = (triton.cdiv(N, tiles.block_n), split, triton.cdiv(M, W.ROWS))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(split, M, N, dtype=torch.float32, device=x.device) if split > 1 else y
    count = W.tile_counters(x.device, grid[0] * grid[2])
    with on(x.device):
        _w4a16_kernel_k2[grid](x, w.words, w.groups.view(torch.int32), part, count, y, y, M, N, K, x.stride(0),
                               w.words.stride(0), w.groups.stride(0) // 2, per, tiles.block_n, W._MAGIC[x.dtype],
                               split > 1, False, W._EMULATE, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
                               **({} if tiles.maxnreg is None or W._EMULATE else {"maxnreg": tiles.maxnreg}))
    return y


if __name__ == "__main__":
    from lib.models.quantize import GROUP
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.float16
    torch.manual_seed(0)
    shapes = [(384, 64, 1), (640, 128, 3), (1280, 192, 16)] if dev == "cpu" else \
        [(5120, 10240, 1), (8192, 5120, 1), (5120, 51200, 1), (25600, 5120, 1), (5120, 10240, 8), (25600, 5120, 8)]
    for K, N, M in shapes:
        words = torch.randint(-2**31, 2**31 - 1, (K // 64, N, 8), dtype=torch.int32, device=dev)
        scales = (torch.rand(K // 128, N, device=dev) * 0.01 + 0.001).to(dt)
        zeros = torch.randint(0, 16, (K // 128, N), device=dev).to(torch.int16).view(dt)
        w = W.PackedInt4(words, torch.stack([scales, zeros], -1).contiguous())
        x = torch.randn(M, K, device=dev, dtype=dt)
        for tiles in (W.Tiles(), W.Tiles(split_k=3)):
            a, b = W.w4a16_matmul(x, w, tiles), matmul_k2(x, w, tiles)
            print(K, N, M, tiles.split_k, "bitwise equal:", torch.equal(a, b), flush=True)
        if dev == "cuda" and len(sys.argv) > 1 and sys.argv[1] == "bench":
            from lib import bench
            raw = bench.interleaved({"w4a16": lambda: W.w4a16_matmul(x, w), "k2": lambda: matmul_k2(x, w)}, 20, 100, dev)
            print({n: round(bench.stats(v)["p50_ms"] * 1e3, 2) for n, v in raw.items()}, "us", flush=True)
