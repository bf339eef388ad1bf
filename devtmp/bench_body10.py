"""Device-only (issue 25, fifth pass): the attention kernel reading this step's k, q (and v) in one L2 round trip
after its wait (_qkv_heads) against the kernels before (devtmp/_decode_base8.py = lib/engine/decode.py at 05be626).
Body alone, Runner.chain, k=6, positions 100 and 300, cache 340, h100 draft; outputs compared bitwise. $OUT/body10.json"""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "devtmp"))
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode
import _decode_base10 as base
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
L, k = 340, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, getattr(r.decode, "checked", None), flush=True)
bodies = {"before": base.FusedDecode(r), "new apart": decode.FusedDecode(r)}
print("check new:", decode.check(r, bodies["new apart"]) or "ok", bodies["new apart"].checked, flush=True)
res = {"device": bench.device_name(dev), "k": k, "L": L, "positions": {}}
for pos in (300, 100):
    prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
    x = prompt[:, -1:]
    const = x.view(1).clone()
    r.prefill(prompt)
    outs = {n: v(x, torch.tensor(pos - 1, device=dev)).clone() for n, v in bodies.items()}
    equal = bool(torch.equal(outs["before"], outs["new apart"]))
    diff = (outs["before"].float() - outs["new apart"].float()).abs().max().item()
    fns = {}
    for bname, v in bodies.items():
        r.decode = v
        pick = (lambda c: (lambda hh: c))(const)
        r.warm_chain(pick, 1, k)
        fns[bname] = (lambda pick=pick: r.chain(pick, x, pos, k))
    raw = bench.interleaved(fns, 20, 200, dev)
    res["positions"][pos] = {"equal": equal, "max_abs_diff": diff, "block": {n: bench.stats(ms) for n, ms in raw.items()}}
    print("pos", pos, "bitwise equal:", equal, "max diff", diff, flush=True)
    for n, st in res["positions"][pos]["block"].items():
        print("  %-16s body per token p50 %.4f mean %.4f p95 %.4f" % (n, st["p50_ms"] / k, st["mean_ms"] / k,
                                                                      st["p95_ms"] / k), flush=True)
    r.decode = bodies["new apart"]
json.dump(res, open(f"{OUT}/body10.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
