"""Python side of devtmp/w4cu/w4a16.cu (thirty-sixth session's experiment): repack a PackedInt4 into the mma layout,
call the kernel through ctypes on torch's current stream (graph-capturable)."""
import ctypes, os
import torch
from lib.models import w4a16 as W
from lib.models.quantize import as_int32

_so = ctypes.CDLL(os.environ.get("W4MMA_SO", os.path.join(os.path.dirname(__file__), "w4a16.so")))
_so.w4a16_mma_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
_so.w4a16_mma_launch.restype = ctypes.c_int


def codes_of(w: W.PackedInt4) -> torch.Tensor:
    """(K, N) int32 codes 0..15 of a PackedInt4 (W.dequantize's unpacking)."""
    b, n = w.words.shape[0] // 2, w.words.shape[1]
    words = w.words.view(b, 2, n, 8).permute(0, 1, 3, 2)                      # (b, h, r, n)
    return ((words[:, :, None, :, None] >> W._shifts(words.device).int()) & 0xF).reshape(b * 128, n)


def pack(w: W.PackedInt4) -> tuple[torch.Tensor, torch.Tensor]:
    """(words (N/16, K/128, 2, 32, 4) int32, groups (K/128, N) int32) for w4a16_mma."""
    codes = codes_of(w)
    K, N = codes.shape
    c = codes.view(K // 128, 2, 2, 4, 2, 2, 2, N // 16, 2, 8)               # (G, Ph, Pl, c, u, hi, t, T, jr, g)
    c = c.permute(7, 0, 1, 9, 3, 2, 4, 5, 8, 6).reshape(N // 16, K // 128, 2, 32, 4, 8).to(torch.int64)
    e = torch.arange(8, device=codes.device)
    shift = 8 * (e // 4) + 4 * ((e // 2) % 2) + 16 * (e % 2)                   # e = 4 hi + 2 jr + t
    words = as_int32((c << shift).sum(-1))
    return words.contiguous(), w.groups.view(torch.int32).squeeze(-1).contiguous()


def matmul(x: torch.Tensor, packed: tuple, tn: int = 2, warps: int = 8, residual=None, pdl: bool = True):
    words, groups = packed
    M, K = x.shape
    N = groups.shape[1]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    rc = _so.w4a16_mma_launch(x.data_ptr(), words.data_ptr(), groups.data_ptr(),
                              residual.data_ptr() if residual is not None else None, out.data_ptr(), M, N, K,
                              x.stride(0), tn, warps, int(x.dtype == torch.bfloat16), int(pdl),
                              torch.cuda.current_stream(x.device).cuda_stream)
    if rc:
        raise RuntimeError(f"w4a16_mma_launch: {rc}")
    return out
