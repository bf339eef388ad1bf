"""Interpreter check of devtmp/w4a16_onedot.py: equal to the dequantised product to fp32 rounding, rows batch-invariant."""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
import torch
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, dequantized
import w4a16_onedot


def test_onedot_equals_the_reference_and_is_row_invariant():
    torch.manual_seed(0)
    K, N = 512, 192
    awq = random_awq(K, N, "cpu")
    packed = W.pack_awq(*awq)
    ref_w = dequantized(awq)
    x16 = torch.randn(16, K).half()
    lib = {m: W.w4a16_matmul(x16[:m].contiguous(), packed, W.Tiles(64, 2)) for m in (1, 5, 16)}
    w4a16_onedot.install()
    for m in (1, 5, 16):
        y = W.w4a16_matmul(x16[:m].contiguous(), packed, W.Tiles(64, 2))
        ref = x16[:m].float() @ ref_w
        assert float((y.float() - ref).norm() / ref.norm()) < 1e-3
        torch.testing.assert_close(y.float(), lib[m].float(), rtol=1e-3, atol=1e-2)
        assert torch.equal(y, W.w4a16_matmul(x16, packed, W.Tiles(64, 2))[:m])


def test_mma2_equals_the_reference_and_is_row_invariant():
    import w4a16_mma2
    torch.manual_seed(1)
    K, N = 512, 192
    awq = random_awq(K, N, "cpu")
    packed = W.pack_awq(*awq)
    ref_w = dequantized(awq)
    x16 = torch.randn(16, K).half()
    w4a16_mma2.install()
    assert W._w4a16_kernel is w4a16_mma2._w4a16_kernel_mma2
    for m in (1, 5, 16):
        for split in (1, 2):
            y = W.w4a16_matmul(x16[:m].contiguous(), packed, W.Tiles(64, split))
            ref = x16[:m].float() @ ref_w
            assert float((y.float() - ref).norm() / ref.norm()) < 1e-3
            assert torch.equal(y, W.w4a16_matmul(x16, packed, W.Tiles(64, split))[:m])
    r = torch.randn(5, N).half()
    y = W.w4a16_matmul(x16[:5].contiguous(), packed, W.Tiles(64, 2), residual=r)
    ref = (x16[:5].float() @ ref_w + r.float())
    assert float((y.float() - ref).norm() / ref.norm()) < 1e-3
