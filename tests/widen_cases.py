"""The draft attention's fp16 widening (lib/engine/decode_attention.py: _widen, _unit) on every finite half, for
tests/test_decode.py (Triton's interpreter: its integer ops) and tests/test_kernels_cuda.py (the GPU: its PTX)."""
import torch
import triton
import triton.language as tl

from lib.engine import decode_attention
from lib.engine.decode_attention import _unit, _widen


@triton.jit
def _widen_all(x_ptr, widened_ptr, back_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i)
    w = _widen(x)
    tl.store(widened_ptr + i, w)
    tl.store(back_ptr + i, w * _unit(x))


def check_widen(device) -> None:
    """Each finite half h widens to the float of bits (h & 0x7FFF) << 13 | (h's sign) << 31, that is to its value /
    2^112 exactly (normal and subnormal halves), and times _unit (2^112, in the kernel) back to its value; a bf16
    tile widens to its values. The widening is the one for where it runs (the PTX on a GPU, integer ops under the
    interpreter): a fallback to the integer ops would give these bits too, only slower."""
    on_gpu = torch.device(device).type == "cuda"
    assert _widen is (decode_attention._widen_bits if on_gpu else decode_attention._widen_ints)
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32)
    h = bits.to(torch.int16)
    finite = (h & 0x7C00) != 0x7C00                                        # exponent 31: inf and NaN
    x = h[finite].view(torch.float16)
    x = torch.cat([x, x.new_zeros(-len(x) % 1024)])                        # whole blocks of 1,024
    n = len(x)
    widened, back = torch.empty(n, device=device), torch.empty(n, device=device)
    _widen_all[(n // 1024,)](x.to(device), widened, back, 1024)
    hb = x.view(torch.int16).to(torch.int32)
    want = ((hb & 0x7FFF) << 13) | ((hb & 0x8000) << 16)
    assert torch.equal(widened.cpu().view(torch.int32), want)
    assert torch.equal(widened.cpu().double() * 2.0 ** 112, x.double())   # the value / 2^112, exactly
    assert torch.equal(back.cpu(), x.float())
    y = x.to(torch.bfloat16)
    plain, back = torch.empty(n, device=device), torch.empty(n, device=device)
    _widen_all[(n // 1024,)](y.to(device), plain, back, 1024)
    assert torch.equal(plain.cpu(), y.float()) and torch.equal(back.cpu(), y.float())
