"""Device-only: does FlashHead's launch 1 take its overflow path on the chain's hidden states (h100 draft, two body
settings)? Prints the plan (top bin, #above, #in it, overflow) per step and the time of launch 1+2 per state."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode, kernels as K
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype).contiguous()
order = torch.argsort(assign, stable=True)
c2t_ext = torch.cat([order.view(9496, 16), torch.full((1, 16), -1, device=dev)]).contiguous()
r = Runner(model, 340, Acceleration(graphs=True, fused=True))
pos = 300
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
res = {}
for name, kw in {"S16": dict(tile_bytes=8192, warps=1, split=16), "S8": dict(tile_bytes=8192, warps=1, split=8)}.items():
    r.decode = decode.FusedDecode(r, **kw)
    r.prefill(prompt)
    x, rows = prompt[:, -1:], []
    for i in range(12):
        h = r.forward(x, pos + i)[:, -1].contiguous()
        tok = K.flash_greedy_triton(h, W, cents, c2t_ext, 16)
        s = K.flash_probes_triton(h, cents, 16)
        plan = s["plan"].tolist()
        ms = bench.stats(bench.time_calls(lambda: K.flash_greedy_triton(h, W, cents, c2t_ext, 16), 5, 30, dev))["p50_ms"]
        rows.append({"token": tok.item(), "plan": plan, "ms": ms, "h_rms": h.float().pow(2).mean().sqrt().item()})
        print(name, i, rows[-1], flush=True)
        x = tok.view(1, 1)
    res[name] = rows
json.dump(res, open(f"{OUT}/overflow.json", "w"), indent=1)
