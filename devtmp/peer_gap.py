"""Device (forty-second session): h100awq's HF peers leave this engine's greedy tokens at the 8th new token of both
prompts (their continuations are the same from the first token: the synthetic language's attractor). The logits
there, through HF's forward and through this engine's target runner (eager, and its graphed single-token calls as
the baseline makes them): the two candidates' logits and the gap between them."""
import sys
sys.path.insert(0, ".")
import torch
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build as engines
from lib.engine.speculative import Request, generate_baseline

P = common.setup(sys.argv[1])
model = load_target(P)
target = engines.build_target(P, model)
W = model.get_output_embeddings().weight
for prompt, ids in common.side_prompts(P):
    base = generate_baseline(target, Request(ids, 12)).tokens
    x = torch.tensor([ids + base[:7]], device=W.device)
    with torch.no_grad():
        hf = model(x).logits[0, -1].float()
        eng = (target.runner.forward(x, 0, graph=False)[0, -1] @ W.T).float()
    for name, lg in (("hf", hf), ("engine eager", eng)):
        top = lg.topk(3)
        print(prompt.question_id, f"{name:13s}", "top3", top.indices.tolist(), [round(v, 4) for v in top.values.tolist()],
              "gap", round((top.values[0] - top.values[1]).item(), 4), "max |logit|", round(lg.abs().max().item(), 2))
    print(prompt.question_id, "engine baseline tokens", base[:10], "hf - engine max |diff|", round((hf - eng).abs().max().item(), 4))
