"""Device: one W4A16 call per variant at a 32B shape, 8 rows, for ncu (stall reasons). python3 devtmp/ncu_w4.py SHAPE"""
import sys, torch
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq
import w4a16_v3 as V3
K, N = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}[sys.argv[1]]
awq = random_awq(K, N, torch.device("cuda"))
x = torch.randn(8, K, device="cuda", dtype=torch.float16)
p = W.pack_awq(*awq)
for _ in range(3):
    W.w4a16_matmul(x, p)
lib = W._w4a16_kernel
W._w4a16_kernel = V3._w4a16_kernel_zsword
pz = V3.pack_zs(p)
for _ in range(3):
    W.w4a16_matmul(x, pz, W.Tiles(maxnreg=72))
torch.cuda.synchronize()
