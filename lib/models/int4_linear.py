"""Int4Linear: a bias-free Linear of AWQ int4 weights in a model, through this study's W4A16 kernels: on Hopper the
mma kernel (lib/models/w4a16_mma.py, built with nvcc), elsewhere the Triton one (lib/models/w4a16.py). The kernel is
chosen once, at load (`kernel_for`), the weights are kept in its layout only, and the module says which runs
(`path`). Both are exact to fp32 accumulation and batch-invariant; their bits differ (their sums' orders do)."""
from __future__ import annotations

import torch

from . import w4a16_mma
from .quantize import GROUP
from .w4a16 import DEFAULT_TILES, PackedInt4, awq_codes, pack_awq, tile_counters, w4a16_matmul
from .w4a16_mma import MmaInt4, mma_matmul

MMA_WORDS_DIMS = 5                 # the mma layout's words: (N/16, K/128, 2, 32, 4); the Triton one's: (K/64, N, 8)


def kernel_for(device: torch.device, out_features: int = 16) -> tuple[str, str]:
    """("mma" or "triton", the path in words): the mma kernel wherever it can run (its blocks take 16 columns)."""
    why = w4a16_mma.supported(device) or (f"{out_features} columns, not a multiple of 16" if out_features % 16 else "")
    return ("triton", f"Triton ({why})") if why else ("mma", "mma.sync (CUDA, sm_90)")


@torch.library.custom_op("study::w4a16_matmul", mutates_args=())
def _w4a16_op(x: torch.Tensor, words: torch.Tensor, groups: torch.Tensor,
              residual: torch.Tensor | None = None) -> torch.Tensor:
    if words.dim() == MMA_WORDS_DIMS:
        return mma_matmul(x, MmaInt4(words, groups), residual)
    return w4a16_matmul(x, PackedInt4(words, groups), DEFAULT_TILES, residual=residual)


@_w4a16_op.register_fake
def _(x, words, groups, residual=None):
    return x.new_empty(x.shape[0], groups.shape[1])


def column_views(words: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """Each projection's words in a concatenation's: columns are tiles of 16 in the mma layout (its first axis)."""
    if words.dim() == MMA_WORDS_DIMS:
        return words.split([s // 16 for s in sizes], dim=0)
    return words.split(sizes, dim=1)


class Int4Linear(torch.nn.Module):
    """A bias-free Linear of AWQ int4 weights through a W4A16 kernel. A custom op, so torch.compile traces the layer
    around it without a graph break (`traceable`); `concat` fuses projections of one input; the kernel adds a
    residual in its epilogue (`adds_residual`: lib/engine/layer.py's project), so that the layer's residual add
    after the projection is not a kernel of its own."""
    traceable = True
    adds_residual = True
    column_views = staticmethod(column_views)

    def __init__(self, w: PackedInt4 | MmaInt4, path: str = ""):
        super().__init__()
        self.kernel = "mma" if isinstance(w, MmaInt4) else "triton"
        self.path = path or self.kernel
        self.in_features, self.out_features = w.groups.shape[0] * GROUP, w.groups.shape[1]
        for name, t in w._asdict().items():
            self.register_buffer(name, t)
        if self.kernel == "triton":
            tile_counters(w.words.device, 0)

    @classmethod
    def from_awq(cls, module, kernel: str | None = None) -> "Int4Linear":
        """From a loaded AWQ module (gptqmodel's: qweight, qzeros, scales, group_size; no bias), for `kernel`
        (None: kernel_for the module's device)."""
        if getattr(module, "bias", None) is not None:
            raise ValueError(f"{type(module).__name__} has a bias; the W4A16 backend takes bias-free projections")
        awq = (module.qweight, module.qzeros, module.scales, getattr(module, "group_size", GROUP))
        kernel, path = (kernel, kernel) if kernel else kernel_for(module.qweight.device, module.scales.shape[1])
        return cls(w4a16_mma.pack(*awq_codes(*awq)) if kernel == "mma" else pack_awq(*awq), path)

    @classmethod
    def concat(cls, modules) -> "Int4Linear":
        """One module for `modules` side by side; they keep views of its tensors, so nothing is duplicated."""
        if len({m.kernel for m in modules}) > 1:
            raise ValueError(f"cannot fuse projections run by different W4A16 kernels: {[m.path for m in modules]}")
        parts = [m.packed for m in modules]
        mma = isinstance(parts[0], MmaInt4)
        fused = cls(type(parts[0])(torch.cat([p.words for p in parts], dim=0 if mma else 1),
                                   torch.cat([p.groups for p in parts], dim=1)), modules[0].path)
        sizes = [m.out_features for m in modules]
        for m, words, groups in zip(modules, column_views(fused.words, sizes), fused.groups.split(sizes, dim=1)):
            m.words, m.groups = words, groups
        return fused

    @property
    def packed(self) -> PackedInt4 | MmaInt4:
        return (MmaInt4 if self.kernel == "mma" else PackedInt4)(self.words, self.groups)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        # inference only: the op has no gradient, so x is detached (a compiled layer whose inputs require grad
        # would otherwise trace a backward through it)
        x2 = x.detach().reshape(-1, self.in_features)
        r2 = None if residual is None else residual.detach().reshape(-1, self.out_features).contiguous()
        y = torch.ops.study.w4a16_matmul(x2, self.words, self.groups, r2)
        return y.view(*x.shape[:-1], self.out_features)


def swap_awq_modules(model) -> int:
    """Replace every loaded AWQ module of `model` (gptqmodel's: qweight, qzeros, scales) by an Int4Linear on the same
    weights, freeing the AWQ tensors as it goes; returns how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if all(hasattr(child, t) for t in ("qweight", "qzeros", "scales")):
                setattr(parent, name, Int4Linear.from_awq(child))
                swapped += 1
    return swapped
