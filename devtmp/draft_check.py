"""Device: the h100 draft's runner with the fused step and the Triton layer kernels both on (the CUDA default): which
paths run, the fused step's check against the reference path (now through the layer kernels), and a prefill."""
import sys, torch
sys.path.insert(0, ".")
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.build import acceleration
from lib.engine.runner import Runner
P = load_profile("h100")
_, model = make_pair(P.models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
accel = acceleration(P, "draft")
r = Runner(model, 340, accel)
print("accel", accel, "decode", r.decode_path, "layers", r.layer_path, "checked", getattr(r.decode, "checked", None))
ids = (torch.arange(1, 200, device="cuda")[None] * 37) % 150000
print("prefill", r.prefill(ids)[-5:].tolist())
