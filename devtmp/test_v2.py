"""Interpreter check of devtmp/w4a16_v2.py: PAIR bitwise the library kernel (odd and even K-block counts, split-K on
and off, residual); CARRIED within 1e-3 of the dequantised product and batch-invariant. TRITON_INTERPRET=1."""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
import torch
from lib.models import quantize as Q
from lib.models import w4a16 as W
import w4a16_v2 as V
lib_kernel = W._w4a16_kernel
g = torch.Generator().manual_seed(3)
for K, N, split in ((640, 128, 1), (640, 128, 2), (384, 64, 1), (1024, 192, 3)):
    awq = (Q.pack(torch.randint(0, 16, (K, N), generator=g)), Q.pack(torch.randint(0, 16, (K // 128, N), generator=g)),
           (torch.rand(K // 128, N, generator=g) * 0.02 + 0.001).half())
    w = W.pack_awq(*awq)
    x = torch.randn(9, K, generator=g).half()
    res = torch.randn(9, N, generator=g).half()
    ref = x.float() @ W.dequantize(w)
    t = W.Tiles(split_k=split)
    W._w4a16_kernel = lib_kernel
    want = W.w4a16_matmul(x, w, t, out_dtype=torch.float32)
    want_r = W.w4a16_matmul(x, w, t, residual=res)
    W._w4a16_kernel = V._w4a16_kernel_pair
    got = W.w4a16_matmul(x, w, t, out_dtype=torch.float32)
    assert torch.equal(got, want), (K, N, split, (got - want).abs().max())
    assert torch.equal(W.w4a16_matmul(x, w, t, residual=res), want_r)
    W._w4a16_kernel = V._w4a16_kernel_carried
    got = W.w4a16_matmul(x, w, t, out_dtype=torch.float32)
    err = ((got - ref).norm() / ref.norm()).item()
    assert err <= 1e-3, err
    assert torch.equal(W.w4a16_matmul(x[4:5], w, t), W.w4a16_matmul(x, w, t)[4:5])
    print(K, N, split, "pair equal, carried rel err %.1e" % err)
W._w4a16_kernel = lib_kernel
print("ok")
