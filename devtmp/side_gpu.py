"""Device (forty-second session): notebook 03's side studies argv[2:] (comma-separated names) for profile argv[1],
with one loaded target, each saved as notebook 03 saves it (lib.study.speculative.side_study)."""
import sys, time, faulthandler
faulthandler.dump_traceback_later(560, repeat=True)
sys.path.insert(0, ".")
from lib.study import common
from lib.study.speculative import load_target, side_study

t0 = time.time()
P = common.setup(sys.argv[1])
target = load_target(P)
print("target loaded", round(time.time() - t0), flush=True)
for name in sys.argv[2].split(","):
    data = side_study(P, name, target)
    print(name, "saved", round(time.time() - t0), flush=True)
    if name == "sampling":
        for r in data["rows"]:
            print(" ", r["temperature"], f'{r["mode"]:28s}', round(r["acceptance"] or 0, 3), round(r["decode_tok_s"], 1))
        ttft = sorted(s["ttft_ms"] for s in data["samples"])
        print("  ttft ms min / median / max", round(ttft[0]), round(ttft[len(ttft) // 2]), round(ttft[-1]))
