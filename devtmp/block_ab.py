"""Device (issue 25, for the twenty-first session): the K = 6 block (Runner.chain, heads included) with the GEMV tiles
of 94e5950 (gate/up, down in 2-warp programs) against the ones before (every GEMV 1 warp), two instances of each,
interleaved on one machine: what notebook 02's block measures, as an A/B. Usage: python3 devtmp/block_ab.py [profile]."""
import json, os, sys
sys.path.insert(0, ".")
from lib import bench, modes
from lib.study import common, microbench as M
from lib.engine import decode as D

P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
drafts, x, pos = M.step_drafts(P)
k = P.decode.k
TILES = {"old": {"qkv": 1, "o": 1, "gate_up": 1, "down": 1}, "new": dict(D.GEMV_WARPS)}
fns = {}
for name in (modes.DENSE, modes.FLASH):
    d = drafts[name]
    for label, warps in TILES.items():
        for i in range(2):
            step = D.FusedDecode(d.runner, warps=warps)
            fns[f"{name}/{label}#{i}"] = M.instance_block(d.runner, step, d.head.head, x, pos, k)
raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
out = {"device": bench.device_name(x.device), "k": k, "position": pos}
for key, ms in raw.items():
    out[key] = {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")}
    print(key, "ms a token: mean %.4f p50 %.4f" % (out[key]["mean_ms"], out[key]["p50_ms"]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "block_ab.json"), "w"), indent=1)
