"""Device (thirtieth session): where the h100 target's one-token call spends its time in a cache sized for 8,192
positions, at positions 64 and 8,192 (kernel breakdown, top kernels by time). Usage: python3 devtmp/target_long.py"""
import sys, json, os, faulthandler
faulthandler.dump_traceback_later(200, repeat=True)
sys.path.insert(0, ".")
from dataclasses import replace
import torch
from lib import bench
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build

P = common.setup("h100")
model = load_target(P)
at = replace(P, decode=replace(P.decode, max_prompt_tokens=8192))
target = build.build_target(at, model).runner
target.warm("greedy", [1])
x = torch.zeros((1, 1), dtype=torch.long, device=target.device)
out = {}
for pos in (64, 8192):
    b = bench.breakdown(lambda: target.greedy(x, pos), target.device, iters=10)
    out[pos] = b
    print(f"pos {pos}: total {b['total_us']:.0f} us, launches {b['launches']}, by kind",
          {k: round(v) for k, v in b["by_kind_us"].items()}, flush=True)
    for r in sorted(b["kernels"], key=lambda r: -r["us"])[:8]:
        print(f"   {r['us']:9.1f} us  x{r["launches"]:6.0f}  {r['kernel'][:110]}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "target_long.json"), "w"), indent=1, default=str)
