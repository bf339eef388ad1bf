"""Device-only: the fused step's attention settings against the reference path on the h100 draft (bf16): the
construction check (from 2.5 splits) and one step at position 300 after a 300-token prefill. Writes $OUT/splits.json."""
import json, os, sys
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
r = Runner(model, 340, Acceleration(graphs=True, fused=True))
print("default", r.decode_path, r.decode.checked, flush=True)
pos = 300
prompt = torch.arange(1, pos + 2, device=dev)[None] * 37 % 150000
res = {"device": bench.device_name(dev), "variants": {}}
for tile, w, aw, s in [(16384, 2, 2, 32), (16384, 2, 1, 16), (16384, 2, 2, 16), (8192, 1, 1, 16), (8192, 1, 2, 16),
                       (8192, 1, 1, 8), (8192, 1, 2, 8), (8192, 1, 4, 8), (16384, 2, 1, 32)]:
    v = decode.FusedDecode(r, tile_bytes=tile, warps=w, split=s, attention_warps=aw)
    why = decode.check(r, v)
    out = {}
    for name, fn in (("reference", lambda x, p: r._forward(x, p, compiled=False)), ("fused", v)):
        r._forward(prompt[:, :pos], torch.tensor(0, device=dev), compiled=False)
        out[name] = fn(prompt[:, pos:pos + 1], torch.tensor(pos, device=dev))[0, -1].float().clone()
    ref, got = out["reference"], out["fused"]
    err = ((got - ref).abs().max() / ref.pow(2).mean().sqrt()).item()
    name = f"tile{tile // 1024}k_w{w}_aw{aw}_S{s}"
    res["variants"][name] = {"check": why or "ok", "checked": v.checked, "rel_error_at_300": err,
                             "nan": bool(torch.isnan(got).any())}
    print(name, why or "ok", "check err %.3g" % v.checked["rel_error"], "at 300: %.3g" % err,
          "nan" if torch.isnan(got).any() else "", flush=True)
json.dump(res, open(f"{OUT}/splits.json", "w"), indent=1)
