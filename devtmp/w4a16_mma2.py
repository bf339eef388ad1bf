"""Experiment (issue 26, seventh session, not timed): lib/models/w4a16.py's kernel in the unswapped orientation,
out (16, BLOCK_N) = x (16, K) @ W (K, BLOCK_N): 16 rows make the tensor-core op Ampere's mma.sync (no wgmma, so no
async-proxy fence and no wait a chunk), the dequantised chunk the B operand. install() swaps it in."""
import triton
import triton.language as tl
from lib.models import w4a16 as W
from lib.models.w4a16 import _pair, _store


@triton.jit(do_not_specialize=["M"])                            # one compiled kernel for every M (M == 1 too)
def _w4a16_kernel_mma2(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                  stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                  RESIDUAL: tl.constexpr, EMULATE: tl.constexpr):
    """RESIDUAL: out = res + the product, added in fp32 and rounded once."""
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = pid_m * 16 + tl.arange(0, 16)
    k16 = tl.arange(0, 16)
    r8 = tl.arange(0, 8)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), 128):
        g = k0 // 128                                            # one group a K-block
        z = tl.load(z_ptr + g * stride_g + cols, mask=ok, other=0).to(tl.int32)
        s = tl.load(s_ptr + g * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        part = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        for h in tl.static_range(2):
            base = w_ptr + (2 * g + h).to(tl.int64) * stride_w           # the (N, 8) words of half h
            words = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
            for j in tl.static_range(4):
                k = k0 + 16 * (4 * h + j) + k16                  # the 16 K positions of chunk 4h + j
                # padded rows read as 0: the tile, and so each row's sums, do not depend on M
                xr = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :], mask=rows[:, None] < M, other=0.0)
                lo, hi = _pair(words >> (4 * j), zz, DT, EMULATE)
                w = tl.reshape(tl.join(lo, hi), (BLOCK_N, 16))   # (column, 2r + t): K order within the chunk
                if EMULATE:
                    part = tl.dot(xr.to(tl.float32), tl.trans(w), part, input_precision="ieee")
                else:
                    part = tl.dot(xr, tl.trans(w), part, out_dtype=tl.float32)  # 16 rows: mma.sync
        acc += part * s[None, :]                                 # the group's scale, in fp32
    at = rows[:, None] * N + cols[None, :]
    keep = (rows[:, None] < M) & ok[None, :]
    if SPLIT:                                                    # fp32 partials; the last range to finish adds them
        splits = tl.num_programs(1)
        tl.store(part_ptr + pid_k * M * N + at, acc, mask=keep)
        tl.debug_barrier()                                       # partials stored before we count ourselves
        tile = pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count_ptr + tile, 1) == splits - 1:     # acq_rel: the last sees every partial
            tl.store(count_ptr + tile, 0)                        # ready for the next call
            acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
            for kr in range(splits):                             # fixed order: deterministic, batch-invariant
                acc += tl.load(part_ptr + kr * M * N + at, mask=keep, other=0.0, cache_modifier=".cg")
            _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
    else:
        _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)


def install():
    W._w4a16_kernel = _w4a16_kernel_mma2
