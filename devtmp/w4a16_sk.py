"""Stream-K W4A16 (twentieth session, issue 26): lib/models/w4a16.py's loop body, but P = SMs x per_sm programs each
take an equal contiguous range of the (tile, K-block) work, tile-major, so every SM gets the same bytes (the
timeline probe, devtmp/w4_timeline.py, found SMs holding 4-7 programs of the split-K grid and the call ending with
the most loaded ones). A tile split across programs is summed by its last contributor to finish, in program order
(deterministic; the ranges depend on N, K and P only, never on M). per_sm must be the most programs an SM can hold
(shared memory: num_stages), so that all P are resident and each SM holds exactly per_sm."""
import sys
import torch, triton
import triton.language as tl
sys.path.insert(0, ".")
from lib.models import w4a16 as W
from lib.models.w4a16 import _half, _store, _MAGIC, _EMULATE, ROWS
from lib.engine.kernels import _launch_next, _wait, counters, launches


@triton.jit(do_not_specialize=["M"])
def _w4a16_sk_kernel(x_ptr, w_ptr, g_ptr, part_ptr, count_ptr, res_ptr, out_ptr, M, N, K, stride_xm, stride_w,
                     stride_g, SEG, BLOCK_N: tl.constexpr, MAGIC: tl.constexpr, RESIDUAL: tl.constexpr,
                     EMULATE: tl.constexpr, PDL: tl.constexpr):
    _wait(PDL)
    p, pid_m = tl.program_id(0), tl.program_id(1)
    P = tl.num_programs(0)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    B = K // 128                                                 # K-blocks a column tile
    T = tl.cdiv(N, BLOCK_N)
    work = T * B                                                 # (tile, K-block) pairs, tile-major
    start, end = (p * work) // P, ((p + 1) * work) // P          # ours: at least one (P <= work)
    rows = pid_m * 16 + tl.arange(0, 16)
    k128, r8, c = tl.arange(0, 128), tl.arange(0, 8), tl.arange(0, BLOCK_N)
    t_first, t_last = start // B, (end - 1) // B
    for t in range(t_first, t_last + 1):
        kb_lo, kb_hi = tl.maximum(start, t * B) - t * B, tl.minimum(end, t * B + B) - t * B
        cols = t * BLOCK_N + c
        ok = cols < N
        acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
        for kb in range(kb_lo, kb_hi):
            k0 = kb * 128
            sz = tl.load(g_ptr + kb * stride_g + cols, mask=ok, other=0)
            s = (sz & 0xFFFF).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
            z = (sz >> 16) & 0xF
            zz = tl.broadcast_to(((z | MAGIC) * 0x10001)[:, None], (BLOCK_N, 8))
            zh = (z << 4) | 0xD400
            zh = tl.broadcast_to(((zh << 16) | zh)[:, None], (BLOCK_N, 8))
            base = w_ptr + tl.cast(2 * kb, tl.int64) * stride_w
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
        if t == t_last:
            _launch_next(PDL)
        at = rows[None, :] * N + cols[:, None]
        keep = (rows[None, :] < M) & ok[:, None]
        if (kb_lo == 0) & (kb_hi == B):                          # the whole tile is ours
            _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)
        else:                                                    # a partial, in our slot for this tile
            slot = rows[None, :] * BLOCK_N + c[:, None]
            tl.store(part_ptr + (p * SEG + t - t_first) * M * BLOCK_N + slot, acc, mask=keep)
            tl.debug_barrier()
            first = ((t * B + 1) * P - 1) // work                # owners of the tile's first and last K-blocks
            last = ((t * B + B) * P - 1) // work
            tile = pid_m * T + t
            if tl.atomic_add(count_ptr + tile, 1) == last - first:   # acq_rel: the last sees every partial
                tl.store(count_ptr + tile, 0)
                acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
                for q in range(first, last + 1):                 # contributors in program order: deterministic
                    jq = t - ((q * work) // P) // B
                    acc += tl.load(part_ptr + (q * SEG + jq) * M * BLOCK_N + slot, mask=keep, other=0.0,
                                   cache_modifier=".cg")
                _store(out_ptr, res_ptr, at, keep, acc, RESIDUAL)


def plan(K, N, sms, per_sm, block_n=64):
    B, T = K // 128, triton.cdiv(N, block_n)
    work = T * B
    P = min(sms * per_sm, work)
    L = triton.cdiv(work, P)
    return P, (L + B - 2) // B + 1


def w4a16_sk(x, w, per_sm=4, num_stages=7, block_n=64, num_warps=4, maxnreg=72, sms=None, residual=None):
    M, K = x.shape
    N = w.groups.shape[1]
    sms = sms or (torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 8)
    P, seg = plan(K, N, sms, per_sm, block_n)
    mt = triton.cdiv(M, ROWS)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(P * seg * M * block_n, dtype=torch.float32, device=x.device)
    count = counters(x.device, triton.cdiv(N, block_n) * mt, "w4a16_sk")
    pdl, opts = launches(x.device, num_warps)
    extra = {} if _EMULATE else {"maxnreg": maxnreg}
    _w4a16_sk_kernel[(P, mt)](x, w.words, w.groups.view(torch.int32), part, count,
                              y if residual is None else residual, y, M, N, K, x.stride(0), w.words.stride(0),
                              w.groups.stride(0) // 2, seg, block_n, _MAGIC[x.dtype], residual is not None, _EMULATE,
                              pdl, num_stages=num_stages, **opts, **extra)
    return y
