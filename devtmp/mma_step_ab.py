"""Device (thirty-sixth session, issue 26): h100awq's target with the mma W4A16 kernel (the new default on sm_90)
against the Triton one (STUDY_W4A16_MMA=0 at load), two loads of the same checkpoint: graphed calls of 1 and K + 1
tokens interleaved (prompt end, and at 300 positions), tokens compared; a profile of the mma step; then speculative
decoding with the mma target equal to its greedy decoding (dense draft, both schedules, 4 prompts x 48 tokens).
Writes $OUT/mma_step_ab.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench, modes
from lib.engine.speculative import Request, generate_baseline, generate_speculative
from lib.models import build as engines
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.models.checkpoints import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup("h100awq")
os.environ["STUDY_W4A16_MMA"] = "0"
models = {"triton": load_target(P)}
del os.environ["STUDY_W4A16_MMA"]
models["mma"] = load_target(P)
paths = {n: m.model.layers[0].mlp.down_proj.path for n, m in models.items()}
print("loaded", round(time.time() - t0), paths, flush=True)
k = P.decode.k
first = encoded_prompts(P)[0][1]
res = {"device": bench.device_name(torch.device(P.target_device)), "paths": paths, "k": k, "cases": {}}
runners = {}
for where, prompt in {"first": first, "long": (first * (300 // len(first) + 1))[:300]}.items():
    fns, toks = {}, {}
    for label, m in models.items():
        runner = runners[label] = engines.build_target(P, m).runner
        for n, fn in target_calls(runner, prompt, [1, k + 1]).items():
            fns[f"{label}/{n}"] = fn
            toks[f"{label}/{n}"] = fn().tolist()
    dev = runner.device
    raw = bench.interleaved(fns, 5, 60, dev)
    case = res["cases"][where] = {"position": len(prompt), **{key: bench.stats(ms) for key, ms in raw.items()},
                                  "tokens_equal": {n: toks[f"triton/{n}"] == toks[f"mma/{n}"] for n in ("1", str(k + 1))}}
    for key in fns:
        s = case[key]
        print(f"{where} pos {len(prompt)} {key:9s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} p95 {s['p95_ms']:.3f}",
              flush=True)
    print(where, "tokens equal", case["tokens_equal"], round(time.time() - t0), flush=True)
    json.dump(res, open(f"{OUT}/mma_step_ab.json", "w"), indent=1, default=str)
    if where == "first":
        bd = bench.breakdown(fns["mma/1"], dev)
        res["mma_breakdown"] = {x: bd.get(x) for x in ("total_us", "launches", "by_kind_us", "exposed_us")}
        print("mma/1", bd["launches"], round(bd["total_us"], 1), {x: round(v, 1) for x, v in bd["by_kind_us"].items()},
              flush=True)
target = engines.build_target(P, models["mma"])
drafts = engines.build_drafts(P, ["dense"])
same = {}
for schedule in (modes.ORDINARY, modes.DEFERRED):
    for i, (_, prompt) in enumerate(encoded_prompts(P)[:4]):
        base = generate_baseline(target, Request(tuple(prompt), 48)).tokens
        spec = generate_speculative(target, drafts["dense"], Request(tuple(prompt), 48, schedule, k)).tokens
        same[f"{schedule}/{i}"] = base == spec
print("speculative == greedy (mma target):", same, round(time.time() - t0), flush=True)
res["speculative_equals_greedy"] = same
json.dump(res, open(f"{OUT}/mma_step_ab.json", "w"), indent=1, default=str)
