"""Device (fourteenth session): where the cluster kernel's time goes. A K-block of the dense h100 draft (one graph
replay) traced by the torch profiler (CUPTI kernel records inside the graph), Triton pair (cluster=0) and the cluster
kernel (cluster=16): per kernel kind, its mean duration, and the mean gap between consecutive kernels' ends (what
each adds to the chain) and between starts. Needs `git apply devtmp/cl/integration.diff` + the v3 kernel files."""
import json, os, sys, collections
sys.path.insert(0, ".")
import torch
from torch.profiler import profile, ProfilerActivity
from lib import modes
from lib.study import common
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine import decode
OUT = os.environ.get("OUT", "/tmp")
P = common.setup("h100")
ensure_flash_checkpoint(P)
d = engines.build_drafts(P, (modes.DENSE,))[modes.DENSE]
r, k = d.runner, P.decode.k
dev = r.device
prompt = common.encoded_prompts(P)[0][1]
pos = len(prompt)
x = torch.tensor([[prompt[-1]]], device=dev)
res = {}
for cl in (0, 16):
    r.prefill(torch.tensor([prompt], device=dev))
    r.decode = decode.FusedDecode(r, cluster=cl)
    pick = (lambda f: (lambda h: f(h)))(d.head.head)
    r.warm_chain(pick, 1, k)
    for _ in range(30):
        r.chain(pick, x, pos, k)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            r.chain(pick, x, pos, k)
        torch.cuda.synchronize()
    path = f"/tmp/trace{cl}.json"
    prof.export_chrome_trace(path)
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    ev.sort(key=lambda e: e["ts"])
    n = len(ev) // 3
    one = ev[n:2 * n]                                   # the middle replay
    kinds = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for a, b in zip(one, one[1:]):
        name = b["name"][:40] + (" (again)" if a["name"] == b["name"] and "qkv_attention" in a["name"] else "")
        s = kinds[name]
        s[0] += 1; s[1] += b["dur"]; s[2] += (b["ts"] + b["dur"]) - (a["ts"] + a["dur"]); s[3] += b["ts"] - a["ts"]
    span = (one[-1]["ts"] + one[-1]["dur"] - one[0]["ts"]) / k
    print(f"cluster={cl}: {len(one)} kernels a replay, {span:.1f} us a token (first start to last end)", flush=True)
    rows = {}
    for name, (c, dur, dend, dstart) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        rows[name] = dict(n=c, dur_us=dur / c, end_gap_us=dend / c, start_gap_us=dstart / c, end_gap_total_us=dend)
        print(f"  {name:40s} n {c:4d} dur {dur / c:6.2f} end-gap {dend / c:6.2f} start-gap {dstart / c:6.2f}"
              f" end-gap total {dend / k:7.1f} us a token", flush=True)
    res[f"cluster{cl}_{len(res)}"] = dict(kernels=len(one), us_a_token=span, kinds=rows,
                                         first_layers=[(e["name"][:30], e["ts"] - one[0]["ts"], e["dur"]) for e in one[:16]])
json.dump(res, open(f"{OUT}/cl_trace.json", "w"), indent=1)
