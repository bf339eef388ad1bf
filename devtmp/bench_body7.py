"""Device-only (issue 25, fifth pass): each fused kernel starting the weights of the kernel A ahead into L2 (bulk
prefetch), A = 0 (none), 1, 2, 3, 4, 5, 8. Body alone, Runner.chain, k=6, position 300, cache 340, h100 draft;
outputs compared bitwise with A = 0. Writes $OUT/body7.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, getattr(r.decode, "checked", None), flush=True)
ahead = [int(a) for a in (sys.argv[1] if len(sys.argv) > 1 else "0,1,2,3,4,5,8").split(",")]
bodies = {f"A={a}": decode.FusedDecode(r, prefetch=a) for a in ahead}
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
x = prompt[:, -1:]
const = x.view(1).clone()
r.prefill(prompt)
outs = {n: v(x, torch.tensor(pos - 1, device=dev)).clone() for n, v in bodies.items()}
ref = outs[f"A={ahead[0]}"]
equal = {n: bool(torch.equal(o, ref)) for n, o in outs.items()}
print("bitwise equal to first:", equal, flush=True)
fns = {}
for bname, v in bodies.items():
    r.decode = v
    pick = (lambda c: (lambda hh: c))(const)
    r.warm_chain(pick, 1, k)
    fns[bname] = (lambda pick=pick: r.chain(pick, x, pos, k))
raw = bench.interleaved(fns, 20, 200, dev)
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "L": L, "equal": equal, "block": {}}
for n, ms in raw.items():
    res["block"][n] = s = bench.stats(ms)
    print("%-10s body per token p50 %.4f mean %.4f p95 %.4f" % (n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k),
          flush=True)
json.dump(res, open(f"{OUT}/body7.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
