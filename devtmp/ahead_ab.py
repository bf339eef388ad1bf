"""Device (issue 25, twelfth session): the deferred schedule with the next proposal block launched ahead against the
same drafts without it (a Draft subclass: Rounds launches ahead only for plain Drafts), interleaved prompt by prompt on
one machine, the profile's prompts, 2 passes; every output checked equal. Usage: python3 devtmp/ahead_ab.py PROFILE."""
import json, os, sys, time, collections
sys.path.insert(0, ".")
import torch
from lib import modes
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine.rounds import Draft
from lib.engine.speculative import Request, generate_speculative, generate_baseline
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
t0 = time.time()
tm = load_target(P); ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, target_model=tm)
NotAhead = type("NotAhead", (Draft,), {})
variants = {}
for name in (modes.DENSE, modes.FLASH):
    d = drafts[name]
    variants[f"{name}_ahead"], variants[f"{name}_plain"] = d, NotAhead(d.runner, d.head)
enc = common.encoded_prompts(P)
k, max_new, stop = P.decode.k, P.decode.max_new_tokens, common.stop_tokens(P)
print("built", round(time.time() - t0), type(drafts[modes.DENSE]).__name__, flush=True)
agg = collections.defaultdict(lambda: collections.Counter())
rows = []
for it in range(3):                                             # pass 0: warm-up, not counted
    for i, (p, ids) in enumerate(enc):
        base = generate_baseline(target, Request(ids, max_new, stop=stop)).tokens if it == 0 else None
        order = list(variants) if (i + it) % 2 == 0 else list(variants)[::-1]
        for v in order:
            r = generate_speculative(target, variants[v], Request(ids, max_new, modes.DEFERRED, k, stop=stop))
            if it == 0:
                assert r.tokens == base, (v, i)
                continue
            a = agg[v]; a["ms"] += r.decode_ms; a["tok"] += r.decode_tokens; a["rounds"] += r.rounds
            a["ahead"] += r.launched_ahead
            rows.append({"variant": v, "prompt": i, "pass": it, "decode_ms": r.decode_ms, "tokens": r.decode_tokens,
                         "rounds": r.rounds, "launched_ahead": r.launched_ahead, "spans_ms": r.spans_ms})
res = {v: {"tok_s": 1000 * a["tok"] / a["ms"], "ms_per_round": a["ms"] / a["rounds"], "rounds": a["rounds"],
           "launched_ahead": a["ahead"]} for v, a in agg.items()}
for v, r in res.items():
    print("%-12s %.1f tok/s  %.3f ms/round  rounds %d  ahead %d" % (v, r["tok_s"], r["ms_per_round"], r["rounds"],
                                                                 r["launched_ahead"]), flush=True)
json.dump({"device": torch.cuda.get_device_name(), "summary": res, "samples": rows}, open(f"{OUT}/ahead_ab.json", "w"))
print("done", round(time.time() - t0))
