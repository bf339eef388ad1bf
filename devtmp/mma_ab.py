"""Device (thirty-first session: mma_ab.py, a copy of attn_long.py: the draft attention's further splits on the CUDA
cores (decode.MMA False, the default before) or the tensor cores, 32-128 programs a query head, at 2,048, 8,192 and
32,768 positions). Thirtieth session's text:
Device (thirtieth session, issue 25 at long contexts): the fused draft step's attention with at most PROGRAMS
programs a query head (each folding several splits) against one program a split (programs = all splits: the grid
before), and 1 or 2 attention warps; the dense h100 draft's K-token block (one graph replay), caches sized for the
position (as notebook 03's context study) and one long cache read at a short position. Also the step's output
per variant against the all-splits grid on a random cache (bitwise where a program has at most one split).
Usage: python3 devtmp/attn_programs.py [profile] [positions...]"""
import json, os, sys, time, faulthandler
faulthandler.dump_traceback_later(400, repeat=True)
sys.path.insert(0, ".")
from dataclasses import replace
import torch
from lib import bench, modes
from lib.study import common, microbench as M
from lib.models import build
from lib.engine import decode as D

P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
cases = [(int(a.split(":")[0]), int(a.split(":")[1])) for a in sys.argv[2:]] or \
        [(2048, 2048), (8192, 8192), (32768, 32768)]            # (cache sized for, position)
k = P.decode.k
VARIANTS = {"cuda64": (64, False), "mma64": (64, True), "mma32": (32, True), "mma128": (128, True),
            "cuda64b": (64, False)}
out = {"device": None, "k": k, "cases": []}
t0 = time.time()
for size, pos in cases:
    at = replace(P, decode=replace(P.decode, max_prompt_tokens=size))
    d = build.build_drafts(at, [modes.DENSE])[modes.DENSE]
    r = d.runner
    out["device"] = bench.device_name(r.device)
    x = torch.zeros((1, 1), dtype=torch.long, device=r.device)
    steps = {}
    for name, (p, mma) in VARIANTS.items():
        D.MMA = mma
        steps[name] = D.FusedDecode(r, programs=p)
    # exactness on a random cache: one step a variant at pos (each writes the same entry)
    g = torch.Generator(device=r.device).manual_seed(0)
    r.cache.k.normal_(generator=g); r.cache.v.normal_(generator=g)
    start = torch.tensor(pos, device=r.device)
    ref = steps["cuda64"](x, start).float().clone()
    exact = {}
    for name, s in steps.items():
        h = s(x, start).float()
        exact[name] = {"equal": bool(torch.equal(h, ref)), "max_rel": ((h - ref).abs().max() / ref.pow(2).mean().sqrt()).item()}
    print(f"cache {r.cache.k.shape[3]} pos {pos} exact:", {n: (e['equal'], round(e['max_rel'], 6)) for n, e in exact.items()}, flush=True)
    if r.device.type != "cuda":
        continue
    fns = {name: M.instance_block(r, s, d.head.head, x, pos, k) for name, s in steps.items()}
    raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
    row = {"cache": r.cache.k.shape[3], "position": pos, "programs": {n: s.programs for n, s in steps.items()},
           "exact": exact, "per_token_ms": {}}
    for name, ms in raw.items():
        st = bench.stats(ms)
        row["per_token_ms"][name] = {m: v / k for m, v in st.items() if m.endswith("_ms")}
    out["cases"].append(row)
    print(f"cache {row['cache']} pos {pos} ({time.time() - t0:.0f}s)", flush=True)
    for name in steps:
        t = row["per_token_ms"][name]
        print(f"  {name:7s} programs {row['programs'][name]:5d}  mean {t['mean_ms']:.4f} p50 {t['p50_ms']:.4f} "
              f"p95 {t['p95_ms']:.4f}  equal {exact[name]['equal']} rel {exact[name]['max_rel']:.2e}", flush=True)
    del d, r, steps, fns
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "mma_ab.json"), "w"), indent=1)
