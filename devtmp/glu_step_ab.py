"""Device (thirty-seventh session, issue 26): SiLU(gate) * up in the mma W4A16 kernel's epilogue (the working tree:
Int4Linear.fuses_silu_mul, layer.gated) against the gate/up kernel followed by the Triton SiLU*mul kernel. Kernel:
the 32B gate/up shape at 1, 8, 16 rows, graphed over weight copies, interleaved, outputs compared. Step: h100awq's
target loaded twice, one runner built with the fusion turned off (the class property patched while it is built and
its graphs captured), 1 and K + 1 tokens interleaved, tokens compared, both profiled; speculative = greedy with the
fused target. Writes $OUT/glu_step_ab.json."""
import json, math, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench, modes
from lib.engine.layer_kernels import silu_mul
from lib.models import w4a16 as W, w4a16_mma as MM, int4_linear
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
OUT, dev, t0 = os.environ.get("OUT", "/tmp"), torch.device("cuda"), time.time()
res = {"device": bench.device_name(dev), "kernel": {}}
K, N = 5120, 51200
awq = random_awq(K, N, dev)
copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
ws = []
for _ in range(copies):
    p = W.pack_awq(*awq)
    ws.append(MM.pack(W.codes(p), p.groups))
    del p
for rows in (1, 8, 16):
    x = torch.randn(rows, K, device=dev, dtype=torch.float16)
    sep, glu = silu_mul(MM.mma_matmul(x, ws[0])), MM.mma_matmul(x, ws[0], glu=True)
    d = (glu.float() - sep.float()).abs()
    out = res["kernel"][rows] = {"equal": bool(torch.equal(glu, sep)), "differ": int((d > 0).sum()),
                                 "max_rel": float((d / sep.float().abs().clamp_min(1e-3)).max())}
    fns = {"sep": lambda x=x: [silu_mul(MM.mma_matmul(x, ws[i % copies])) for i in range(CALLS)],
           "glu": lambda x=x: [MM.mma_matmul(x, ws[i % copies], glu=True) for i in range(CALLS)]}
    graphs = {}
    for label, fn in fns.items():
        fn()
        g, _ = bench.capture(fn)
        graphs[label] = g.replay
    for label, ms in bench.interleaved(graphs, 3, 30, dev).items():
        out[label] = 1000 * bench.stats([m / CALLS for m in ms])["p50_ms"]
    print("gate_up+silu", rows, out, flush=True)
del ws, graphs, fns
torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/glu_step_ab.json", "w"), indent=1)

from lib.engine.speculative import Request, generate_baseline, generate_speculative
from lib.models import build as engines
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.models.checkpoints import load_target
P = common.setup("h100awq")
models = {label: load_target(P) for label in ("sep", "glu")}
print("loaded", round(time.time() - t0), flush=True)
k, first = P.decode.k, encoded_prompts(P)[0][1]
FUSES = int4_linear.Int4Linear.fuses_silu_mul
res["step"] = {}
for where, prompt in {"first": first}.items():
    fns, toks = {}, {}
    for label, m in models.items():
        int4_linear.Int4Linear.fuses_silu_mul = FUSES if label == "glu" else property(lambda self: False)
        runner = engines.build_target(P, m).runner
        for n, fn in target_calls(runner, prompt, [1, k + 1]).items():
            fns[f"{label}/{n}"] = fn
            toks[f"{label}/{n}"] = fn().tolist()
    int4_linear.Int4Linear.fuses_silu_mul = FUSES
    raw = bench.interleaved(fns, 5, 40, runner.device)
    case = res["step"][where] = {"position": len(prompt), **{key: bench.stats(ms) for key, ms in raw.items()},
                                 "tokens_equal": {n: toks[f"sep/{n}"] == toks[f"glu/{n}"] for n in ("1", str(k + 1))}}
    for key in fns:
        s = case[key]
        print(f"{where} pos {len(prompt)} {key:7s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} p95 {s['p95_ms']:.3f}",
              flush=True)
    print(where, "tokens equal", case["tokens_equal"], round(time.time() - t0), flush=True)
    if where == "first":
        for label in models:
            bd = bench.breakdown(fns[f"{label}/1"], runner.device)
            case[f"{label}_breakdown"] = {x: bd.get(x) for x in ("total_us", "launches", "by_kind_us", "exposed_us")}
            print(label, bd["launches"], round(bd["total_us"], 1), round(bd.get("exposed_us", 0), 1),
                  {x: round(v, 1) for x, v in bd["by_kind_us"].items()}, flush=True)
    json.dump(res, open(f"{OUT}/glu_step_ab.json", "w"), indent=1, default=str)
target = engines.build_target(P, models["glu"])
drafts = engines.build_drafts(P, ["dense"])
same = {}
for schedule in (modes.ORDINARY, modes.DEFERRED):
    for i, (_, prompt) in enumerate(encoded_prompts(P)[:2]):
        base = generate_baseline(target, Request(tuple(prompt), 48)).tokens
        spec = generate_speculative(target, drafts["dense"], Request(tuple(prompt), 48, schedule, k)).tokens
        same[f"{schedule}/{i}"] = base == spec
print("speculative == greedy (glu target):", same, round(time.time() - t0), flush=True)
res["speculative_equals_greedy"] = same
json.dump(res, open(f"{OUT}/glu_step_ab.json", "w"), indent=1, default=str)
