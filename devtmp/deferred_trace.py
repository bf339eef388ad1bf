"""Device (issue 25/26, prepared in the eighth session, not run): where the deferred schedule's extra 0.45 ms a round
goes (h100awq e2e at b367605: the graphed proposal call 4.41 ms a round deferred, 3.90 ordinary). Builds the
engines as a run does, warms every mode, then profiles 3 prompts of each of dense/flash x ordinary/deferred
(torch profiler, CUDA activity): per mode the GPU time by kernel, the launches, and the GPU's idle time between
kernels. Writes $OUT/deferred_trace.json and a gzipped Chrome trace per mode."""
import collections, gzip, json, os, shutil, sys, time
sys.path.insert(0, ".")
import torch
from torch.profiler import ProfilerActivity, profile
from lib import modes
from lib.models import build as engines
from lib.models.checkpoints import load_target
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.runs import generate, mode_order
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
from lib.models.flash_checkpoint import ensure_flash_checkpoint
ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, target_model=load_target(P))
enc = encoded_prompts(P)
for mode in [m for m in mode_order(P) if m[2] in (None, modes.FIXED)]:                                      # warm-up: graphs captured, kernels compiled
    generate(target, drafts, P, enc[0][1], mode)
print("warm", round(time.time() - t0), flush=True)
res = {}
for draft in (modes.DENSE, modes.FLASH):
    for schedule in (modes.ORDINARY, modes.DEFERRED):
        mode = (draft, schedule, modes.FIXED)
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            results = [generate(target, drafts, P, enc[i][1], mode) for i in (1, 2, 3)]
            sync()
        name = modes.name(*mode)
        kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
        idle, before_draft, end, prev_draft = 0.0, 0.0, None, False
        by = collections.Counter()
        for e in kernels:
            s, f = e.time_range.start, e.time_range.end
            by[e.name[:90]] += (f - s)
            draft_kernel = e.name.startswith(("_decode", "_dense_argmax", "_flash"))   # the draft's fused step and heads
            if end is not None and s > end:
                idle += s - end
                if draft_kernel and not prev_draft:               # the GPU idle between a target call and the draft
                    before_draft += s - end
            end = f if end is None else max(end, f)
            prev_draft = draft_kernel
        rounds = sum(r.rounds for r in results)
        res[name] = {"rounds": rounds, "launches": len(kernels), "idle_us_per_round": idle / rounds,
                     "idle_before_draft_us_per_round": before_draft / rounds,
                     "spans_ms_per_round": {k: v / rounds for k, v in collections.Counter(
                         {k: sum(r.spans_ms.get(k, 0) for r in results) for k in results[0].spans_ms}).items()},
                     "top_kernels_us_per_round": {k: v / rounds for k, v in by.most_common(12)}}
        print(name, json.dumps({k: v for k, v in res[name].items() if k != "top_kernels_us_per_round"}), flush=True)
        if schedule != modes.DEFERRED:
            continue
        prof.export_chrome_trace(f"/tmp/{name}.json")                # the deferred modes' timelines (a few MB gzipped)
        with open(f"/tmp/{name}.json", "rb") as f, gzip.open(f"{OUT}/{name}.trace.json.gz", "wb") as g:
            shutil.copyfileobj(f, g)
json.dump(res, open(f"{OUT}/deferred_trace.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
