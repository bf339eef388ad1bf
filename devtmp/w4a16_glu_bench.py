"""Device (issue 26, eighth session, prepared): the 32B gate/up projection + SiLU-mul as the target runs them
(lib W4A16 matmul, then the compiled silu(gate) * up) against devtmp/w4a16_glu.py's epilogue (default registers,
capped at 80 and 72, split 2), 1 and 8 rows, graphed over copies of the weights, interleaved. Checks each against the
two-step result. Writes $OUT/w4a16_glu.json. DRYRUN=1 TRITON_INTERPRET=1: the logic on a tiny shape on the CPU."""
import json, math, os, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from lib import bench
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, int4_bytes, CALLS
import w4a16_glu as G
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda" if torch.cuda.is_available() else "cpu")
K, H, ITERS, calls = 5120, 25600, 30, CALLS
silu_mul = torch.compile(lambda y: F.silu(y[:, :y.shape[1] // 2]) * y[:, y.shape[1] // 2:])
if os.environ.get("DRYRUN"):
    K, H, ITERS, calls = 256, 64, 1, 2
    silu_mul = lambda y: F.silu(y[:, :y.shape[1] // 2]) * y[:, y.shape[1] // 2:]
    bench.capture = lambda fn: (type("Eager", (), {"replay": staticmethod(fn)})(), fn())
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "rows": {}}
torch.manual_seed(0)
awq = [random_awq(K, H, dev) for _ in range(2)]
nbytes = 2 * int4_bytes(K, H)
copies = max(1, min(calls, math.ceil(256e6 / nbytes)))
packs = [W.concat([W.pack_awq(*a) for a in awq]) for _ in range(copies)]
VARIANTS = {"lib+silu": lambda x, p: silu_mul(W.w4a16_matmul(x, p)),
            "glu": lambda x, p: G.glu_matmul(x, p),
            "glu_r80": lambda x, p: G.glu_matmul(x, p, maxnreg=80),
            "glu_r72": lambda x, p: G.glu_matmul(x, p, maxnreg=72),
            "glu_split2": lambda x, p: G.glu_matmul(x, p, W.Tiles(split_k=2))}
for m in (1, 8):
    x = torch.randn(m, K, device=dev, dtype=torch.float16)
    ref = VARIANTS["lib+silu"](x, packs[0]).float()
    out = res["rows"][m] = {"floor_us": nbytes / (res["copy_GBps"] * 1e3)}
    fns = {}
    for name, f in VARIANTS.items():
        try:
            y = f(x, packs[0]).float()
            out[name] = {"max_rel_diff": float(((y - ref).abs() / ref.abs().clamp_min(1e-3)).max())}
            g, _ = bench.capture(lambda f=f: [f(x, packs[i % copies]) for i in range(calls)])
            fns[name] = g.replay
        except Exception as e:                                    # e.g. maxnreg unknown to this Triton
            out[name] = {"error": str(e)[:200]}
    for name, ms in bench.interleaved(fns, 1 if ITERS == 1 else 3, ITERS, dev).items():
        st = bench.stats([t / calls for t in ms])
        out[name].update(p50_us=1000 * st["p50_ms"], p95_us=1000 * st["p95_ms"])
    print(m, {k: (round(v["p50_us"], 1), "%.1e" % v["max_rel_diff"]) if "p50_us" in v else v for k, v in out.items()
              if isinstance(v, dict)}, "floor %.1f" % out["floor_us"], flush=True)
json.dump(res, open(f"{OUT}/w4a16_glu.json", "w"), indent=1)
