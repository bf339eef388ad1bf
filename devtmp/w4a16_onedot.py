"""Experiment (issue 26, prepared in the seventh session, not timed): lib/models/w4a16.py's kernel with the K-block's
eight chunks joined into one (BLOCK_N, 128) register operand and multiplied by ONE tl.dot (K = 128), the activation
tile loaded in the joined K order, instead of eight chained K = 16 dots. Offline SASS of the library kernel (sm_90a,
Triton 3.9) shows each of its eight dots as fence.proxy.async (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC) + wgmma.fence +
one HGMMA.64x16x16 + wait_group 0: the tensor-core pipe drained eight times a K-block. install() swaps it in."""
import triton
import triton.language as tl
from lib.models import w4a16 as W
from lib.models.w4a16 import _pair, _store


@triton.jit
def _chunk(words, j: tl.constexpr, zz, BLOCK_N: tl.constexpr, DT: tl.constexpr, EMULATE: tl.constexpr):
    lo, hi = _pair(words >> (4 * j), zz, DT, EMULATE)
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, 16))            # (column, 2r + t): K order within the chunk


@triton.jit(do_not_specialize=["M"])                            # one compiled kernel for every M (M == 1 too)
def _w4a16_kernel_onedot(x_ptr, w_ptr, z_ptr, s_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                  stride_g, k_per_split, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, SPLIT: tl.constexpr,
                  RESIDUAL: tl.constexpr, EMULATE: tl.constexpr, NATURAL: tl.constexpr = True):
    """NATURAL: the joined tile permuted to natural K order (else x is gathered in the joined order). RESIDUAL: out = res + the product, added in fp32 and rounded once."""
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = pid_m * 16 + tl.arange(0, 16)
    k16 = tl.arange(0, 16)
    r8 = tl.arange(0, 8)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    k_start = pid_k * k_per_split
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    f = tl.arange(0, 128)                                        # the joined tile's K order: chunk 4c + 2b + a
    kpos = 16 * (4 * (f % 2) + 2 * ((f // 2) % 2) + (f // 4) % 2) + f // 8
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), 128):
        g = k0 // 128                                            # one group a K-block
        z = tl.load(z_ptr + g * stride_g + cols, mask=ok, other=0).to(tl.int32)
        s = tl.load(s_ptr + g * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
        base = w_ptr + (2 * g).to(tl.int64) * stride_w
        w0 = tl.load(base + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        w1 = tl.load(base + stride_w + cols[:, None] * 8 + r8[None, :], mask=ok[:, None], other=0)
        t0 = tl.join(tl.join(_chunk(w0, 0, zz, BLOCK_N, DT, EMULATE), _chunk(w0, 1, zz, BLOCK_N, DT, EMULATE)),
                     tl.join(_chunk(w0, 2, zz, BLOCK_N, DT, EMULATE), _chunk(w0, 3, zz, BLOCK_N, DT, EMULATE)))
        t1 = tl.join(tl.join(_chunk(w1, 0, zz, BLOCK_N, DT, EMULATE), _chunk(w1, 1, zz, BLOCK_N, DT, EMULATE)),
                     tl.join(_chunk(w1, 2, zz, BLOCK_N, DT, EMULATE), _chunk(w1, 3, zz, BLOCK_N, DT, EMULATE)))
        if NATURAL:                                              # chunks made major: K in its natural order
            w = tl.reshape(tl.permute(tl.join(t0, t1), (0, 4, 3, 2, 1)), (BLOCK_N, 128))
            xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + f)[:, None], mask=rows[None, :] < M, other=0.0)
        else:
            w = tl.reshape(tl.join(t0, t1), (BLOCK_N, 128))      # (column, f): K position k0 + kpos[f]
            xt = tl.load(x_ptr + rows[None, :] * stride_xm + (k0 + kpos)[:, None], mask=rows[None, :] < M,
                         other=0.0)
        if EMULATE:
            part = tl.dot(w, xt.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(w, xt, out_dtype=tl.float32)           # one dot: 8 wgmma, one fence and one wait
        acc += part * s[:, None]                                 # the group's scale, in fp32
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


def install():
    """Route lib.models.w4a16.w4a16_matmul (and so Int4Linear) through this kernel."""
    W._w4a16_kernel = _w4a16_kernel_onedot
