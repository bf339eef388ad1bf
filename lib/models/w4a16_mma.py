"""W4A16 on Hopper through mma.sync (w4a16_mma.cu, built here with nvcc): y (M, N) = x (M, K) @ W (+ residual),
exact (fp32 sums of the exact products x (q - z), each group scaled once) and batch-invariant, for the target's
decode and verify calls on sm_90; Int4Linear (lib/models/int4_linear.py) runs it where `supported` says it can, and
lib/models/w4a16.py's Triton kernel elsewhere.

Layout (`pack`, once at load, from AWQ's codes and groups: lib.models.w4a16.awq_codes): words (N/16, K/128, 2, 32,
4) int32, one (tile of 16 columns, group) a contiguous 1 KB, lane l = 4g + c's word for step s (16 K) at [.., s // 4,
l, s % 4]; bit 4j + 16t holds the code of column 16 tile + g + 8 (j % 2) at K = 128 group + 32 (s // 2) + 8c + 4
(s % 2) + 2 (j // 2) + t: the A fragment of m16n8k16 (rows g, g + 8; its K index 2c + t + 8 (j // 2)) with K
permuted within each 32 so that a lane's activations for steps s, s + 1 are 8 contiguous halves. groups (K/128, N)
int32: scale bits | zero code << 16 (the PackedInt4's scale-and-zero words). Same bytes as the Triton layout.

Measured (one H200, 32B decode shapes, p50 of graphed calls; notebook 02's int4 table, every kernel in one call, run
by devtmp/int4_table.py in the thirty-seventh session): a layer's four projections 79.1 / 79.8 / 80.1 / 82.3 / 153.1
us at 1 / 2 / 4 / 8 / 16 rows, against the Triton kernel's 101-105, gptqmodel's marlin 112-125 and a 63 us floor (4.1
TB/s copy); every row bitwise the same in calls of any length. Since then blocks take two row tiles past 8 rows: 138.3
us at 16 (another H200; bitwise the same outputs), still over the Triton kernel's 104.5. Its loop issues 136
instructions a warp for 2,048 weights (offline SASS; the Triton kernel's: 221). The h100awq target step on one H200
(devtmp/mma_step_ab.py, two loads side by side): 7.992 -> 6.489 ms at one token, 8.025 -> 6.490 for a verify of 7;
tokens equal."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import torch

from .quantize import as_int32

SOURCE = Path(__file__).with_name("w4a16_mma.cu")      # a block: 16 columns, 8 activation rows (16 past 8)


class MmaInt4(NamedTuple):
    words: torch.Tensor            # (N/16, K/128, 2, 32, 4) int32, the layout above
    groups: torch.Tensor           # (K/128, N) int32: scale bits | zero point code << 16


def supported(device: torch.device) -> str:
    """Why the kernel cannot run on `device` ('' when it can): a Hopper GPU (sm_90) and nvcc (or a build of this
    source already in the cache) are needed; the first call builds it. STUDY_W4A16_MMA=0 turns it off."""
    if os.environ.get("STUDY_W4A16_MMA", "1") == "0":
        return "off (STUDY_W4A16_MMA=0)"
    if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
        return "not a Hopper (sm_90) GPU"
    try:
        _library()                                              # built once; a failed build is a reason too
    except (RuntimeError, OSError) as e:
        return str(e)
    return ""


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    return shutil.which("nvcc") or next((str(p) for p in [Path(home) / "bin" / "nvcc"] if home and p.exists()), None)


def _library_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flashhead-study"
    return cache / f"w4a16_mma-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}.so"


@lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    """The built kernel, from the cache (keyed by the source's hash) or built now (a few seconds)."""
    path = _library_path()
    if not path.exists():
        nvcc = _nvcc()
        if not nvcc:
            raise RuntimeError(f"no nvcc to build lib/models/{SOURCE.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        cmd = [nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC",
               str(SOURCE), "-o", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"nvcc could not build {SOURCE.name}: {done.stderr.strip()[-500:]}")
        tmp.replace(path)                                       # atomic: a concurrent build reads a whole file
    lib = ctypes.CDLL(str(path))
    lib.w4a16_mma_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
    lib.w4a16_mma_launch.restype = ctypes.c_int
    return lib


def _codes_order(K: int, N: int) -> tuple[tuple, tuple]:
    """(view of (K, N) codes, permutation) giving (tile, group, s // 4, g, c, s % 4, 8 codes of a word)."""
    view = (K // 128, 2, 2, 4, 2, 2, 2, N // 16, 2, 8)         # (group, s//4, (s%4)//2, c, s%2, j//2, t, tile, j%2, g)
    return view, (7, 0, 1, 9, 3, 2, 4, 5, 8, 6)


def _shifts(device) -> torch.Tensor:
    """Bit offset 4j + 16t of the last axis of the permuted codes, e = 4 (j // 2) + 2 (j % 2) + t."""
    e = torch.arange(8, device=device)
    return 8 * (e // 4) + 4 * ((e // 2) % 2) + 16 * (e % 2)


def pack(codes: torch.Tensor, groups: torch.Tensor) -> MmaInt4:
    """(K, N) codes 0..15 and the groups (K/128, N, 2) of lib.models.w4a16.awq_codes (a PackedInt4's) -> MmaInt4, on
    their device."""
    K, N = codes.shape
    if K % 128 or N % 16:
        raise ValueError(f"the mma W4A16 kernel takes K a multiple of 128 and N of 16; got K={K}, N={N}")
    view, order = _codes_order(K, N)
    c = codes.view(view).permute(order).reshape(N // 16, K // 128, 2, 32, 4, 8).to(torch.int64)
    words = as_int32((c << _shifts(codes.device)).sum(-1))     # disjoint bits: sum == or
    return MmaInt4(words.contiguous(), groups.contiguous().view(torch.int32).view(K // 128, N))


def codes(w: MmaInt4) -> torch.Tensor:
    """pack's inverse: the (K, N) codes of w."""
    N, K = w.groups.shape[1], w.groups.shape[0] * 128
    c = (w.words.to(torch.int64)[..., None] >> _shifts(w.words.device)) & 0xF
    view, order = _codes_order(K, N)
    shape = [view[i] for i in order]
    return c.reshape(shape).permute([order.index(i) for i in range(len(order))]).reshape(K, N)


def dequantize(w: MmaInt4, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Torch reference: the (K, N) float32 weight that `w` stands for (dtype: the scales', fp16 or bf16)."""
    halves = w.groups.contiguous().view(torch.int16).view(*w.groups.shape, 2)
    scales, zeros = halves[..., 0].view(dtype).float(), halves[..., 1].int()
    return (codes(w) - zeros.repeat_interleave(128, 0)).float() * scales.repeat_interleave(128, 0)


def warps_for(N: int) -> int:
    """Warps a block (splitting K): 4 where there are 640 column tiles or more, else 8 (the best of 4 and 8 at each
    32B shape on one H200)."""
    return 4 if N // 16 >= 640 else 8


def mma_matmul(x: torch.Tensor, w: MmaInt4, residual: torch.Tensor | None = None) -> torch.Tensor:
    """y (M, N) = x (M, K) @ W (+ residual (M, N), added before the one rounding), in x's dtype (fp16 or bf16)."""
    M, K = x.shape
    N = w.groups.shape[1]
    if K != w.groups.shape[0] * 128 or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"x must be fp16 or bf16 of shape (M, {w.groups.shape[0] * 128}), got {tuple(x.shape)} "
                         f"{x.dtype}")
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:             # 16-byte reads of a row's halves
        x = x.clone(memory_format=torch.contiguous_format)
    if residual is not None and (residual.shape != (M, N) or residual.stride() != (N, 1)):
        raise ValueError(f"the residual must be contiguous of shape {(M, N)}, got {tuple(residual.shape)}")
    # A projection fused with others (Int4Linear.concat) keeps a column view of the fused groups, its rows the fused
    # width apart: the kernel takes that row stride (the model's own forward calls those modules, e.g. Hugging
    # Face's generate; the engine calls the fused one). Its words are a contiguous slice.
    groups = w.groups if w.groups.stride(1) == 1 else w.groups.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    rc = _library().w4a16_mma_launch(x.data_ptr(), w.words.data_ptr(), groups.data_ptr(),
                                     None if residual is None else residual.data_ptr(), y.data_ptr(), M, N, K,
                                     x.stride(0), groups.stride(0), warps_for(N), int(x.dtype == torch.bfloat16),
                                     1, torch.cuda.current_stream(x.device).cuda_stream)   # 1: PDL (sm_90)
    if rc:
        raise RuntimeError(f"w4a16_mma_launch failed: {'bad arguments' if rc < 0 else f'CUDA error {rc}'}")
    return y
