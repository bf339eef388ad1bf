"""Device (ninth session): the host's time between a verify call's result reaching it (the .tolist() sync inside
verify) and the next proposal's graph launch, per round, without a profiler; and the launch call's own host time.
In the deferred schedule the GPU idles through the gap (nothing is queued behind the verify call); in the ordinary
one the target's append runs meanwhile. Builds the engines as a run does, warms every mode, then 6 prompts a mode.
Writes $OUT/host_gap.json."""
import json, os, statistics, sys, time
sys.path.insert(0, ".")
import torch
from lib import modes
from lib.engine import speculative as S
from lib.engine.runner import Runner
from lib.models import build as engines
from lib.models.checkpoints import load_target
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.runs import generate, mode_order
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, target_model=load_target(P))
enc = encoded_prompts(P)
log = {"verified": None, "gaps": [], "launch": []}
_vd, _vp, _chain = S.verify_deferred, S.verify_with_pending, Runner.chain


def stamp(fn):
    def wrapped(*a, **k):
        out = fn(*a, **k)
        log["verified"] = time.perf_counter()                       # the host has the verify call's result
        return out
    return wrapped


def chain(self, *a, **k):
    t = time.perf_counter()
    if log["verified"] is not None:
        log["gaps"].append(t - log["verified"])
        log["verified"] = None
    out = _chain(self, *a, **k)
    log["launch"].append(time.perf_counter() - t)
    return out


S.verify_deferred, S.verify_with_pending, Runner.chain = stamp(_vd), stamp(_vp), chain
for mode in [m for m in mode_order(P) if m[2] in (None, modes.FIXED)]:
    generate(target, drafts, P, enc[0][1], mode)
print("warm", round(time.time() - t0), flush=True)
res = {}
for draft in (modes.DENSE, modes.FLASH):
    for schedule in (modes.ORDINARY, modes.DEFERRED):
        mode = (draft, schedule, modes.FIXED)
        log.update(verified=None, gaps=[], launch=[])
        for i in range(1, 7):
            generate(target, drafts, P, enc[i][1], mode)
        g, l = [1e3 * x for x in log["gaps"]] or [float("nan")], [1e3 * x for x in log["launch"]] or [float("nan")]
        res[modes.name(*mode)] = {"rounds": len(g), "gap_ms_p50": statistics.median(g), "gap_ms_mean": statistics.mean(g),
                                  "launch_ms_p50": statistics.median(l), "launch_ms_mean": statistics.mean(l)}
        print(modes.name(*mode), json.dumps(res[modes.name(*mode)]), flush=True)
json.dump(res, open(f"{OUT}/host_gap.json", "w"), indent=1)
