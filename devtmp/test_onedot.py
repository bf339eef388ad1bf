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
