"""Device: does launching the next block ahead read anything on the host? Tiny pair on the GPU, graphs and the fused
draft, a deferred generation with CUDA's sync debug mode set to error inside Rounds.launch_next up to its wait."""
import sys; sys.path.insert(0, "."); sys.path.insert(0, "tests")
import torch
from conftest import tiny_synthetic
from lib.models.synthetic import make_pair
from lib.engine import rounds as R
from lib.engine.heads import DenseHead
from lib.engine.runner import Acceleration
from lib.models.build import make_draft, make_target
from lib.engine.speculative import Request, generate_baseline, generate_speculative
t, d = make_pair(tiny_synthetic(), 0, "float16", "cuda")
accel = Acceleration(graphs=True, fused=True, rows=8, triton_layers=True)
target = make_target(t, 200, accel)
draft = make_draft(d, DenseHead(d.get_output_embeddings().weight), 200, accel)
draft.warm(4)
prompt = tuple(range(3, 40))
base = generate_baseline(target, Request(prompt, 40)).tokens
keep = R.Rounds._to_host
def strict(self, got):
    torch.cuda.set_sync_debug_mode("error")
    return keep(self, got)
orig = R.Rounds.launch_next
def wrapped(self, *a):
    try:
        return orig(self, *a)
    finally:
        torch.cuda.set_sync_debug_mode("default")
R.Rounds.launch_next = wrapped
R.Rounds._to_host = strict
# ready.synchronize() and tolist() are the intended host reads: let them through
ev_sync = torch.cuda.Event.synchronize
def relaxed(self):
    torch.cuda.set_sync_debug_mode("default")
    return ev_sync(self)
torch.cuda.Event.synchronize = relaxed
res = generate_speculative(target, draft, Request(prompt, 40, "deferred", 4))
print("equal", res.tokens == base, "rounds", res.rounds, "ahead", res.launched_ahead)
