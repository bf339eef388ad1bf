"""Device (issue 26, prepared in the sixteenth session, not run): does the target's programmatic dependent launch
(57af076) slow the ordinary schedule end to end? The same drafts with two targets on the same weights, one captured
with the library's launches (PDL) and one with plain launches (lib.models.w4a16.launches and
lib.engine.layer_kernels.launches patched while its graphs are captured), ordinary and deferred, interleaved prompt by
prompt, 2 timed passes after a checked one (every output equal to the baseline's). Usage: python3
devtmp/pdl_e2e_ab.py [PROFILE]; writes $OUT/pdl_e2e_ab.json."""
import json, os, sys, time, collections
sys.path.insert(0, ".")
import torch
from lib import modes
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build as engines, w4a16
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine import layer_kernels
from lib.engine.speculative import Request, generate_speculative, generate_baseline
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
t0 = time.time()
tm = load_target(P); ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, target_model=tm)
k, max_new, stop = P.decode.k, P.decode.max_new_tokens, common.stop_tokens(P)
launches = w4a16.launches
w4a16.launches = layer_kernels.launches = lambda device, warps, pdl=True: (False, dict(num_warps=warps))
plain = engines.build_target(P, tm, clock=target.runner.clock)
for kind in ("greedy", "hidden"):
    plain.runner.warm(kind, range(1, k + 2))
w4a16.launches = layer_kernels.launches = launches
targets = {"pdl": target, "plain": plain}
variants = {f"{d}_{s}_{t}": (drafts[d], s, t) for d in (modes.DENSE, modes.FLASH) for s in (modes.ORDINARY,
            modes.DEFERRED) for t in targets}
enc = common.encoded_prompts(P)
print("built", round(time.time() - t0), flush=True)
agg = collections.defaultdict(collections.Counter)
for it in range(3):                                             # pass 0: warm-up and check, not counted
    for i, (p, ids) in enumerate(enc):
        base = generate_baseline(target, Request(ids, max_new, stop=stop)).tokens if it == 0 else None
        order = list(variants) if (i + it) % 2 == 0 else list(variants)[::-1]
        for v in order:
            draft, schedule, t = variants[v]
            r = generate_speculative(targets[t], draft, Request(ids, max_new, schedule, k, stop=stop))
            if it == 0:
                assert r.tokens == base, (v, i)
                continue
            a = agg[v]; a["ms"] += r.decode_ms; a["tok"] += r.decode_tokens; a["rounds"] += r.rounds
            for ph in ("draft", "verify", "finalize", "call_target"):
                a[ph] += r.spans_ms.get(ph, 0.0)
res = {v: {"tok_s": 1000 * a["tok"] / a["ms"], "ms_per_round": a["ms"] / a["rounds"],
           **{f"{ph}_ms_per_round": a[ph] / a["rounds"] for ph in ("draft", "verify", "finalize", "call_target")}}
       for v, a in agg.items()}
for v, r in res.items():
    print("%-24s %.1f tok/s %.3f ms/round draft %.3f verify %.3f finalize %.3f target calls %.3f" % (
        v, r["tok_s"], r["ms_per_round"], r["draft_ms_per_round"], r["verify_ms_per_round"],
        r["finalize_ms_per_round"], r["call_target_ms_per_round"]), flush=True)
json.dump({"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "summary": res}, open(f"{OUT}/pdl_e2e_ab.json", "w"))
print("done", round(time.time() - t0))
