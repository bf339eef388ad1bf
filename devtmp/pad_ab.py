"""Device (thirtieth session): the h100 target's calls of 1 and K + 1 tokens in a cache sized for 8,192 positions,
padding rows attending nothing (6fe0131, `new`) against padding rows attending like real ones (the ids' -1 padding
clamped to 0 before the call: the behaviour before, `old`), two runners over one model, interleaved, at positions
64, 2,048 and 8,192; and their tokens on a random cache. Usage: python3 devtmp/pad_ab.py [cache size, 0: the profile's] [positions...]"""
import sys, json, os, faulthandler
faulthandler.dump_traceback_later(250, repeat=True)
sys.path.insert(0, ".")
from dataclasses import replace
import torch
from lib import bench
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build

P = common.setup("h100")
model = load_target(P)
size = int(sys.argv[1]) if len(sys.argv) > 1 else 8192            # 0: the profile's own cache (the e2e run's)
at = replace(P, decode=replace(P.decode, max_prompt_tokens=size)) if size else P
runners = {"new": build.build_target(at, model).runner, "old": build.build_target(at, model).runner}
old_call = runners["old"]._call
runners["old"]._call = lambda kind, ids, start, graph: old_call(kind, ids.clamp_min(0), start, graph)
k = P.decode.k
for r in runners.values():
    r.warm("greedy", [1, k + 1])
    g = torch.Generator(device=r.device).manual_seed(0)
    r.cache.k.normal_(generator=g); r.cache.v.normal_(generator=g)
out = {"device": bench.device_name(runners["new"].device), "rows": runners["new"].rows, "k": k, "cases": []}
ids = {n: torch.randint(3, 1000, (1, n), device=runners["new"].device) for n in (1, k + 1)}
for pos in [int(a) for a in sys.argv[2:]] or (64, 2048, 8192):
    same = {n: torch.equal(runners["new"].greedy(ids[n], pos), runners["old"].greedy(ids[n], pos)) for n in ids}
    fns = {f"{name}/{n}": (lambda r=r, n=n: r.greedy(ids[n], pos)) for name, r in runners.items() for n in ids}
    raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), runners["new"].device)
    row = {"position": pos, "tokens_equal": same, **{key: bench.stats(ms) for key, ms in raw.items()}}
    out["cases"].append(row)
    print(f"pos {pos}: tokens equal {same}", flush=True)
    for key in fns:
        s = row[key]
        print(f"   {key:6s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} p95 {s['p95_ms']:.3f} ms", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "pad_ab.json"), "w"), indent=1, default=str)
