"""Forty-third session, device: the Triton FlashHead with 3 special tokens (one row) against 26 (Qwen3's added tokens,
ids 151,643-151,668: two rows), thesis draft shape (V = 151,936, d = 1,024, c = 9,496 clusters of 16, p = 16), bf16;
each head graphed, replays interleaved (CUDA events), beside the dense head; tokens checked against exact_fp32."""
import json, os, sys
import torch
sys.path.insert(0, ".")
from lib.bench import capture, copy_bandwidth, interleaved, stats, device_name
from lib.engine.heads import DenseHead, FlashHead, exact_fp32

dev = torch.device("cuda")
torch.manual_seed(0)
V, d, c, p = 151936, 1024, 9496, 16
W = (torch.randn(V, d, device=dev) / 32).to(torch.bfloat16)
assign = torch.randperm(V, device=dev) % c
cents = (torch.zeros(c, d, device=dev).index_add_(0, assign, W.float()) / (V // c)).to(torch.bfloat16)   # mean rows
heads = {"dense": DenseHead(W, "triton"),
         "flash_3_special": FlashHead(W, cents, assign, p, [151643, 151644, 151645], "triton"),
         "flash_26_special": FlashHead(W, cents, assign, p, list(range(151643, 151669)), "triton")}
for name, h in heads.items():
    print(name, h.kernel_ran, flush=True)
g = torch.Generator(device=dev).manual_seed(1)
states = torch.cat([W[torch.randint(0, V, (64,), device=dev, generator=g)] + 0.01 * torch.randn(64, d, device=dev, generator=g).to(W.dtype),
                    W[151643:151669]])                                  # the special rows themselves: they should win
for name in ("flash_3_special", "flash_26_special"):
    h = heads[name]
    got = torch.cat([h(s[None]) for s in states])
    want = exact_fp32(h, states)
    print(name, "equal to exact_fp32:", int((got == want).sum()), "of", len(states),
          "| special rows picked as themselves:", int((got[64:] == torch.arange(151643, 151669, device=dev)).sum()), "of 26")
x = states[:1].clone()                                               # a hidden state near a token (zeros: every score ties)
graphs = {n: capture(lambda h=h: h(x))[0] for n, h in heads.items()}
ms = interleaved({n: g.replay for n, g in graphs.items()}, 50, 1000, dev)
bw = copy_bandwidth(dev)
rows = {}
for n, h in heads.items():
    b = V * d * 2 if n == "dense" else h.bytes_read()
    rows[n] = {**stats(ms[n]), "bytes": b, "floor_ms": 1000 * b / bw}
    print(f"{n:18s} mean {rows[n]['mean_ms']*1000:7.2f} us  p50 {rows[n]['p50_ms']*1000:7.2f}  p95 {rows[n]['p95_ms']*1000:7.2f}  floor {rows[n]['floor_ms']*1000:6.2f}")
json.dump({"device": device_name(dev), "copy_GBps": bw / 1e9, "rows": rows}, open(os.environ.get("OUT", ".") + "/special_rows.json", "w"), indent=1)
