"""Interpreter (CPU) or GPU: the fused draft step with decode_attention's _widen (fp16 widened by bit moves) against
the kernel before it (devtmp/decode_attention_old.py) in fp16 and bf16: bitwise equal hidden states and caches over
positions through several splits and folds (programs=2)."""
import sys, os
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
import lib.engine.decode as D
import decode_attention_old as old
from lib.engine.runner import Runner

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=512, tie_word_embeddings=True)
ok = True
for dt in (torch.float16, torch.bfloat16):
    model = Qwen3ForCausalLM(cfg).eval().to(dev, dt)
    for p in model.parameters():
        p.data.mul_(8)                                          # wider values: subnormal and large halves in the cache
    a, b = Runner(model, 160), Runner(model, 160)
    sa, sb = D.FusedDecode(a, programs=2), D.FusedDecode(b, programs=2)
    ids = torch.randint(3, 200, (160,), generator=torch.Generator().manual_seed(2)).to(dev)
    for r in (a, b):
        r.prefill(ids[None, :60])
    a.cache.k[:, :, :, :60].mul_(torch.logspace(-9, 3, 60, device=dev).to(dt)[:, None])   # halves from subnormal up
    b.cache.k.copy_(a.cache.k)
    for p in range(60, 100):
        at = torch.tensor(p, device=dev)
        x = sa(ids[None, p:p + 1], at).clone()
        saved, D._decode_attention = D._decode_attention, old._decode_attention
        try:
            y = sb(ids[None, p:p + 1], at).clone()
        finally:
            D._decode_attention = saved
        if not torch.equal(x, y):
            ok = False
            print(dt, "position", p, "differs", (x.float() - y.float()).abs().max().item())
            break
    print(dt, "caches equal", torch.equal(a.cache.k, b.cache.k), torch.equal(a.cache.v, b.cache.v),
          "finite", bool(torch.isfinite(x).all()))
print("bitwise equal" if ok else "NOT equal")
