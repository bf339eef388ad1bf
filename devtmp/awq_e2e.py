"""Device: h100awq's target step (target_step.json, step_breakdown.json's target) and its e2e run (every mode)."""
import sys, time, collections
sys.path.insert(0, ".")
from lib.study import common
from lib.study.speculative import run_speculative, target_step_bench, load_target
from lib.results import read_records
t0 = time.time()
P = common.setup(sys.argv[1])
target = load_target(P)
print("target loaded", round(time.time() - t0), type(target.model.layers[0].mlp.down_proj).__name__, flush=True)
for _ in range(sys.argv[2:].count("step")):                   # "step step": twice, the second kept
    ts = target_step_bench(P, target)
    print("target step", {k: round(ts["single"][k], 3) for k in ("mean_ms", "p50_ms")}, {n: round(v, 3) for n, v in ts["verify_ms"].items()}, ts["projection"], round(time.time() - t0), flush=True)
if "run" not in sys.argv[2:]:
    sys.exit(0)
run = run_speculative(P, "local", target)
recs = read_records(run)
print("done", round(time.time() - t0), run, len(recs), flush=True)
agg = collections.defaultdict(lambda: [0, 0.0, 0, 0])
for r in recs:
    a = agg[r["mode"]]; a[0] += r["decode_tokens"]; a[1] += r["decode_ms"]; a[2] += bool(r.get("exact_match")); a[3] += 1
for m, a in agg.items():
    print(m, "tok/s %.1f" % (1000 * a[0] / a[1]), "exact %d/%d" % (a[2], a[3]))
