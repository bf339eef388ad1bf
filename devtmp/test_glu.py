"""Interpreter check of devtmp/w4a16_glu.py: equal to silu(gate) * up computed from the library's fp16 outputs
(within one rounding), split-K on and off, ragged H, batch-invariant. TRITON_INTERPRET=1."""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
import torch
import torch.nn.functional as F
from lib.models import quantize as Q
from lib.models import w4a16 as W
import w4a16_glu as G
g = torch.Generator().manual_seed(5)
for K, H, split in ((512, 96, 1), (512, 96, 2), (384, 64, None)):
    ws = []
    for _ in range(2):
        ws.append(W.pack_awq(Q.pack(torch.randint(0, 16, (K, H), generator=g)),
                             Q.pack(torch.randint(0, 16, (K // 128, H), generator=g)),
                             (torch.rand(K // 128, H, generator=g) * 0.02 + 0.001).half()))
    w = W.concat(ws)
    x = torch.randn(9, K, generator=g).half()
    t = W.Tiles(split_k=split)
    y = W.w4a16_matmul(x, w, t)
    want = (F.silu(y[:, :H].float()) * y[:, H:].float()).half()
    got = G.glu_matmul(x, w, t)
    assert got.shape == (9, H)
    assert ((got.float() - want.float()).abs() <= want.float().abs() * 2**-10 + 1e-6).all(), (got - want).abs().max()
    assert torch.equal(G.glu_matmul(x[4:5], w, t), got[4:5])
    print(K, H, split, "ok", (got.float() - want.float()).abs().max().item())
print("ok")
