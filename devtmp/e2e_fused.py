"""Device: end-to-end decode with the fused draft on h100, modes baseline/dense/flash (both schedules), in its own
run directory outputs/h100/runs/fused-draft-<time>/ (notebook 03's record format), plus the target step."""
import sys, time
from dataclasses import replace
sys.path.insert(0, ".")
from lib import modes
from lib.study import common, runs, microbench
from lib.study.common import encoded_prompts, stop_tokens, device_info
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint

t0 = time.time()
P = common.setup("h100")
P = replace(P, decode=replace(P.decode, modes=[modes.BASELINE, modes.DENSE, modes.FLASH]))
enc = encoded_prompts(P)
ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P)
print("built", time.time() - t0, {k: d.runner.decode_path for k, d in drafts.items()}, flush=True)
ts = microbench.target_step_bench(P, target.runner.model)
print("target step", ts["single"]["mean_ms"], ts["verify_ms"], flush=True)
run = runs.new_run(P.out_dir, runs.run_config(P, [p.question_id for p, _ in enc], device_info(P)), "fused-draft")
runs.record_kernels(run, engines.kernels(target, drafts))
runs.run_samples(P, run, (target, drafts, stop_tokens(P), None), enc, runs.sample_keys(P, len(enc)), progress=False)
recs = runs.finish_run(run)
print("done", time.time() - t0, run, flush=True)
import collections
agg = collections.defaultdict(lambda: [0, 0.0, 0, 0, 0])
for r in recs:
    a = agg[r["mode"]]; a[0] += r["decode_tokens"]; a[1] += r["decode_ms"]; a[2] += r["accepted"]; a[3] += r["proposed"]; a[4] += r["exact_match"]
for m, a in agg.items():
    print(m, "tok/s %.1f" % (1000 * a[0] / a[1]), "acc %.3f" % (a[2] / max(a[3], 1)), "exact", a[4])
