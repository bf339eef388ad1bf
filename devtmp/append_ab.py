"""Device (issue 26/25, fifteenth session): the ordinary schedule with the final token's append launched ahead of the
host's read of the verify result (Rounds.launch_append) against the same drafts appending from the host (AHEAD_DEVICES
emptied), interleaved prompt by prompt on one machine, the profile's prompts, 2 timed passes after a checked warm-up
pass; every output equal to the baseline's. Usage: python3 devtmp/append_ab.py PROFILE."""
import json, os, sys, time, collections
sys.path.insert(0, ".")
import torch
from lib import modes
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine import rounds
from lib.engine.speculative import Request, generate_speculative, generate_baseline
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
t0 = time.time()
tm = load_target(P); ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, target_model=tm)
variants = {f"{d}_{w}": (drafts[d], w) for d in (modes.DENSE, modes.FLASH) for w in ("ahead", "host")}
enc = common.encoded_prompts(P)
k, max_new, stop = P.decode.k, P.decode.max_new_tokens, common.stop_tokens(P)
print("built", round(time.time() - t0), flush=True)
agg = collections.defaultdict(collections.Counter)
rows = []
for it in range(3):                                             # pass 0: warm-up and check, not counted
    for i, (p, ids) in enumerate(enc):
        base = generate_baseline(target, Request(ids, max_new, stop=stop)).tokens if it == 0 else None
        order = list(variants) if (i + it) % 2 == 0 else list(variants)[::-1]
        for v in order:
            draft, way = variants[v]
            rounds.AHEAD_DEVICES = ("cuda",) if way == "ahead" else ()
            r = generate_speculative(target, draft, Request(ids, max_new, modes.ORDINARY, k, stop=stop))
            if it == 0:
                assert r.tokens == base, (v, i)
                continue
            a = agg[v]; a["ms"] += r.decode_ms; a["tok"] += r.decode_tokens; a["rounds"] += r.rounds
            a["ahead"] += r.appended_ahead; a["verify"] += r.verify_calls
            for ph in ("draft", "verify", "finalize", "call_target"):
                a[ph] += r.spans_ms.get(ph, 0.0)
            rows.append({"variant": v, "prompt": i, "pass": it, "decode_ms": r.decode_ms, "tokens": r.decode_tokens,
                         "rounds": r.rounds, "appended_ahead": r.appended_ahead, "spans_ms": r.spans_ms})
res = {v: {"tok_s": 1000 * a["tok"] / a["ms"], "ms_per_round": a["ms"] / a["rounds"], "rounds": a["rounds"],
           "appended_ahead": a["ahead"], "verify_calls": a["verify"],
           **{f"{ph}_ms_per_round": a[ph] / a["rounds"] for ph in ("draft", "verify", "finalize", "call_target")}}
       for v, a in agg.items()}
for v, r in res.items():
    print("%-12s %.1f tok/s  %.3f ms/round  rounds %d  ahead %d/%d verify  draft %.3f verify %.3f finalize %.3f "
          "target calls %.3f" % (v, r["tok_s"], r["ms_per_round"], r["rounds"], r["appended_ahead"], r["verify_calls"],
                                 r["draft_ms_per_round"], r["verify_ms_per_round"], r["finalize_ms_per_round"],
                                 r["call_target_ms_per_round"]), flush=True)
json.dump({"device": torch.cuda.get_device_name(), "summary": res, "samples": rows}, open(f"{OUT}/append_ab.json", "w"))
print("done", round(time.time() - t0))
