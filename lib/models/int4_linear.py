"""`Int4Linear`: AWQ int4 projections through lib/models/w4a16.py's kernel, as the `triton_w4a16` AWQ backend (custom
ops, so that torch.compile traces the layer around them), and `swap_awq_modules`, which puts them in a loaded model."""
from __future__ import annotations

import torch

from .quantize import GROUP
from .w4a16 import DEFAULT_TILES, PackedInt4, concat, pack_awq, tile_counters, w4a16_matmul, w4a16_matmul_norm


@torch.library.custom_op("study::w4a16_matmul", mutates_args=())
def _w4a16_op(x: torch.Tensor, words: torch.Tensor, groups: torch.Tensor, residual: torch.Tensor | None = None,
              sq: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    return w4a16_matmul(x, PackedInt4(words, groups), DEFAULT_TILES, residual=residual,
                        rms=None if sq is None else (sq, eps))


@_w4a16_op.register_fake
def _(x, words, groups, residual=None, sq=None, eps=0.0):
    return x.new_empty(x.shape[0], groups.shape[1])


@torch.library.custom_op("study::w4a16_matmul_norm", mutates_args=())
def _w4a16_norm_op(x: torch.Tensor, words: torch.Tensor, groups: torch.Tensor, residual: torch.Tensor,
                   gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return w4a16_matmul_norm(x, PackedInt4(words, groups), residual, gamma, DEFAULT_TILES)


@_w4a16_norm_op.register_fake
def _(x, words, groups, residual, gamma):
    m, n = x.shape[0], groups.shape[1]
    return x.new_empty(m, n), x.new_empty(m, n), x.new_empty(m, -(-n // DEFAULT_TILES.block_n), dtype=torch.float32)


class Int4Linear(torch.nn.Module):
    """A bias-free Linear of AWQ int4 weights through w4a16_matmul. A custom op, so torch.compile traces the layer
    around it without a graph break (`traceable`); `concat` fuses projections of one input; the kernel adds a
    residual in its epilogue (`adds_residual`: lib/engine/layer.py's project), so that the layer's residual add
    after the projection is not a kernel of its own; and it splits an RMSNorm between two projections
    (`folds_norm`): `forward_norm` begins the norm of its output, `forward(gx, rms=...)` finishes it, so that the
    norm is not a kernel of its own either."""
    traceable = True
    adds_residual = True
    folds_norm = True

    def __init__(self, w: PackedInt4):
        super().__init__()
        self.in_features, self.out_features = w.words.shape[0] * 64, w.groups.shape[1]
        for name, t in w._asdict().items():
            self.register_buffer(name, t)
        tile_counters(w.words.device, 0)

    @classmethod
    def from_awq(cls, module) -> "Int4Linear":
        """From a loaded AWQ module (gptqmodel's: qweight, qzeros, scales, group_size; no bias)."""
        if getattr(module, "bias", None) is not None:
            raise ValueError(f"{type(module).__name__} has a bias; the W4A16 backend takes bias-free projections")
        return cls(pack_awq(module.qweight, module.qzeros, module.scales, getattr(module, "group_size", GROUP)))

    @classmethod
    def concat(cls, modules) -> "Int4Linear":
        """One module for `modules` side by side; they keep views of its tensors, so nothing is duplicated."""
        fused = cls(concat([m.packed for m in modules]))
        start = 0
        for m in modules:
            cols = slice(start, start + m.out_features)
            m.words, m.groups = fused.words[:, cols], fused.groups[:, cols]
            start = cols.stop
        return fused

    @property
    def packed(self) -> PackedInt4:
        return PackedInt4(self.words, self.groups)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                rms: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
        """x (..., in) @ W (+ residual); rms = (sq, eps): x is a gx of forward_norm (w4a16_matmul's rms)."""
        x2, r2 = self._rows(x, residual)
        y = torch.ops.study.w4a16_matmul(x2, self.words, self.groups, r2, *(rms or (None, 0.0)))
        return y.view(*x.shape[:-1], self.out_features)

    def forward_norm(self, x: torch.Tensor, residual: torch.Tensor,
                     gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(y, gx, sq): y = x @ W + residual, gx = gamma * y and sq the partial sums of y^2, (rows, tiles) fp32
        (w4a16_matmul_norm)."""
        x2, r2 = self._rows(x, residual)
        y, gx, sq = torch.ops.study.w4a16_matmul_norm(x2, self.words, self.groups, r2, gamma.detach())
        shape = (*x.shape[:-1], self.out_features)
        return y.view(shape), gx.view(shape), sq

    def _rows(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple:
        # inference only: the op has no gradient, so x is detached (a compiled layer whose inputs require grad
        # would otherwise trace a backward through it)
        x2 = x.detach().reshape(-1, self.in_features)
        return x2, None if residual is None else residual.detach().reshape(-1, self.out_features).contiguous()


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
