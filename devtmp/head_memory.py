"""The heads' memory on a GPU, read from torch's allocator, beside notebook 04's count (lib.report.micro.
flash_extra_bytes): at the thesis's draft shape (V 151,936, d 1,024, c 9,496 clusters of 16, bf16), random
weights. For each head and path: bytes allocated by building it (its kept tensors, the Triton check's probes
freed), and the peak scratch of a call above what is held. Usage: python3 devtmp/head_memory.py"""
import torch
from lib.engine.heads import DenseHead, FlashHead
from lib.report.micro import flash_extra_bytes

V, d, c, b, dev = 151936, 1024, 9496, 16, "cuda"
torch.manual_seed(0)
W = torch.randn(V, d, device=dev, dtype=torch.bfloat16)
cent = torch.randn(c, d, device=dev)
assign = torch.randperm(V, device=dev) % c
h = torch.randn(1, d, device=dev, dtype=torch.bfloat16)
print(torch.cuda.get_device_name(), "| embeddings", W.nbytes / 1e6, "MB")


def reading(make, label, count=None):
    torch.cuda.synchronize()
    a0 = torch.cuda.memory_allocated()
    head = make()
    head(h)                                                          # first call: anything made lazily
    torch.cuda.synchronize()
    a1 = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(5):
        head(h)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - a1
    print(f"{label:28s} held {(a1 - a0) / 1e6:8.4f} MB" + (f" (count {count / 1e6:.4f})" if count is not None else "")
          + f" | a call's peak above it {peak / 1e6:.4f} MB | kernel {head.kernel_ran}")
    del head


for k in ("torch", "triton"):
    reading(lambda: DenseHead(W, k), f"dense, {k}")
    reading(lambda: FlashHead(W, cent, assign, 16, [0, 1, 2], kernel=k), f"FlashHead p=16, {k}",
            flash_extra_bytes(c, b, d, 2, triton=(k == "triton")) + 3 * 8)
