"""Device (issue 25, for the twenty-second session; needs an H100): the K = 6 block (heads included), the library's
step against the GEMVs with a timer read after their wait (stamp_bisect2.py's "t1": -3 to -4 % off the body step on
three H200s), two instances each, interleaved, dense and FlashHead. Usage: python3 devtmp/block_t1.py [profile]."""
import json, linecache, os, sys
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
src = open("devtmp/stamp_bisect2.py").read().split("\nP = common.setup(")[0]
linecache.cache["<sb2>"] = (len(src), None, src.splitlines(True), "<sb2>")
ns = {"__name__": "sb2_defs"}
exec(compile(src, "<sb2>", "exec"), ns)
stepped, D = ns["stepped"], ns["D"]
from lib import bench, modes
from lib.study import common, microbench as M

P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
drafts, x, pos = M.step_drafts(P)
k = P.decode.k
fns = {}
for name in (modes.DENSE, modes.FLASH):
    d = drafts[name]
    variants = [("plain", lambda r: D.FusedDecode(r))] + [
        (v, lambda r, v=v: stepped(D.FusedDecode, v)(r)) for v in os.environ.get("VARIANTS", "t1").split(",")]
    for label, make in variants:
        for i in range(2):
            fns[f"{name}/{label}#{i}"] = M.instance_block(d.runner, make(d.runner), d.head.head, x, pos, k)
raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
out = {"device": bench.device_name(x.device), "k": k, "position": pos}
for key, ms in raw.items():
    out[key] = {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")}
    print(key, "ms a token: mean %.4f p50 %.4f" % (out[key]["mean_ms"], out[key]["p50_ms"]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "block_t1.json"), "w"), indent=1)
