"""Device (forty-second session): where h100awq's engine and HF forward part. One prompt (+ the 7 tokens both emit),
eager: HF's hidden state after every layer (output_hidden_states) against the engine's residual after every layer
(lib.engine.runner's layer_forward wrapped), relative max difference and cosine per layer; then the same with the
engine's Triton layer kernels off (the model's norm modules and SDPA, as HF) to see which part of the engine parts."""
import sys
sys.path.insert(0, ".")
import torch
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build as engines
from lib.engine import runner as R
from lib.engine.speculative import Request, generate_baseline

P = common.setup(sys.argv[1])
model = load_target(P)
target = engines.build_target(P, model)
W = model.get_output_embeddings().weight
prompt, ids = common.side_prompts(P)[0]
base = generate_baseline(target, Request(ids, 12)).tokens
x = torch.tensor([ids + base[:7]], device=W.device)
with torch.no_grad():
    hf = model.model(x, output_hidden_states=True).hidden_states          # embeddings, each layer (last normed)
outs, plain = [], R.layer_forward
R.layer_forward = lambda *a, **kw: outs.append(plain(*a, **kw)) or outs[-1]


def drift(tag):
    print(tag, "layer: rel max |engine - hf|, cosine, engine max |x|")
    for i, e in enumerate(outs):
        ref = hf[i + 1] if i + 1 < len(hf) - 1 else None
        if ref is None:
            break
        d = (e.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
        cos = torch.nn.functional.cosine_similarity(e.float().flatten(), ref.float().flatten(), dim=0).item()
        if i < 8 or i % 8 == 7 or d > 1e-2:
            print(f"  {i:2d} {d:.2e} {cos:.6f} {e.float().abs().max().item():.1f}")


with torch.no_grad():
    h = target.runner.forward(x, 0, graph=False)
drift(f"engine as built (layer path {target.runner.layer_path})")
lg_e, lg_h = (h[0, -1] @ W.T).float(), (hf[-1][0, -1] @ W.T).float()
print("logits top2 engine", lg_e.topk(2), "hf", lg_h.topk(2))
outs.clear()
kernels, target.runner.kernels = target.runner.kernels, None
with torch.no_grad():
    h2 = target.runner.forward(x, 0, graph=False)
drift("engine without its Triton layer kernels (norm modules, SDPA)")
print("logits top2", (h2[0, -1] @ W.T).float().topk(2))
