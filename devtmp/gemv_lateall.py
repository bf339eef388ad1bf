"""Twenty-third session (prepared): the draft GEMV whose activation reads wait for every weight of the program (LATE
== 2): the pointer offset by a zero computed from all of them (their count of NaNs times the timer's top bit), so the
reads issue once the last weight has landed whatever ptxas schedules first (fp16: it converts one weight before the
late reads, bf16 most of them)."""
import triton
import triton.language as tl
from lib.engine.decode import _gemv_input, _gemv_output
from lib.engine.kernels import _after_wait, _launch_next, _wait


@triton.jit
def _decode_gemv_all(x_ptr, g_ptr, w_ptr, out_ptr, ids_ptr, res_ptr, eps, N, K: tl.constexpr, BK: tl.constexpr,
                     BN: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr,
                     EMBED: tl.constexpr, PDL: tl.constexpr, T: tl.constexpr, LATE: tl.constexpr):
    _launch_next(PDL)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BK)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    u = w
    if GLU:
        u = tl.load(w_ptr + (rows + N).to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    g = cols
    if NORM:
        g = tl.load(g_ptr + cols, mask=cols < K, other=0.0)
    _wait(PDL)
    if LATE == 1:
        x_ptr = _after_wait(x_ptr, PDL)
    if LATE == 2:
        nan = tl.sum(tl.sum((w != w).to(tl.int32), 1), 0)                    # 0, known only once all have landed
        x_ptr = _after_wait(x_ptr + nan * 16, PDL)
    x, res = _gemv_input(x_ptr, ids_ptr, res_ptr, out_ptr, rows, cols, 0, N, K, RESIDUAL, EMBED)
    if T == 2:
        x1, res1 = _gemv_input(x_ptr, ids_ptr, res_ptr, out_ptr, rows, cols, 1, N, K, RESIDUAL, EMBED)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    tl.store(out_ptr + rows, _gemv_output(x, res, w, u, g, eps, K, NORM, GLU, RESIDUAL, DT), mask=rows < N)
    if T == 2:
        tl.store(out_ptr + N + rows, _gemv_output(x1, res1, w, u, g, eps, K, NORM, GLU, RESIDUAL, DT), mask=rows < N)
