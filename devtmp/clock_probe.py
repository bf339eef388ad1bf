"""Device (eighteenth session): is the step bench's slower second reading the card's clocks? The h100awq target's
single-token step timed back to back in 4 blocks of 200 replays, then 200 calls with a 3 ms host gap between
them (as a run's calls are gapped by the draft), then back to back again; the GPU's SM/memory clocks, power,
temperature and throttle reasons sampled by nvidia-smi every 50 ms in the background (smi.csv), and what
torch.cuda's NVML readers give (clock_rate, power_draw, temperature) before/after each block."""
import json, os, subprocess, sys, time
sys.path.insert(0, ".")
import numpy as np, torch
from lib import bench
from lib.models import build as engines
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
                        "clocks_throttle_reasons.active", "--format=csv,nounits", "-lms", "50"],
                       stdout=open(f"{OUT}/smi_{os.environ.get('TAG', '')}.csv", "w"), stderr=subprocess.STDOUT)
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
runner = engines.build_target(P, model).runner
dev = runner.device
prompt = encoded_prompts(P)[0][1]
one = target_calls(runner, prompt, [1])["1"]
def nvml():
    try:
        return {"sm_MHz": torch.cuda.clock_rate(dev), "W": torch.cuda.power_draw(dev) / 1000, "C": torch.cuda.temperature(dev)}
    except Exception as e:                                         # pynvml missing
        return {"error": repr(e)[:120]}
def gapped(n, gap_s):
    out = []
    for _ in range(n):
        time.sleep(gap_s)
        out += bench.time_calls(one, 0, 1, dev)
    return out
res = {"device": bench.device_name(dev), "blocks": []}
print("loaded", round(time.time() - t0), nvml(), flush=True)
bench.time_calls(one, 5, 0, dev)
def fresh():                                                       # a new runner, graphs captured again
    global one
    runner = engines.build_target(P, model).runner
    one = target_calls(runner, prompt, [1])["1"]
    bench.time_calls(one, 5, 0, dev)
plan2 = ([("back_to_back", None)] * 2 + [("breakdown", None)] + [("back_to_back", None)] * 2 + [("breakdown", None)]
         + [("back_to_back", None)] * 2 + [("gap_3ms", 0.003)])
plan = plan2 if os.environ.get("PLAN") == "2" else ([("back_to_back", None)] * 3 + [("gap_3ms", 0.003), ("gap_20ms", 0.02), ("back_to_back", None), ("breakdown", None)]
        + [("back_to_back", None)] * 2 + [("fresh_runner", None), ("back_to_back", None)] + [("long_2000", None)]
        + [("gap_3ms", 0.003), ("back_to_back", None)])
for name, gap in plan:
    if name in ("breakdown", "fresh_runner"):
        if name == "breakdown":
            bd = bench.breakdown(one, dev)
            print("breakdown", bd["launches"], round(bd["total_us"], 1), flush=True)
        else:
            fresh()
        print(name, round(time.time() - t0, 1), nvml(), flush=True)
        continue
    before, tb = nvml(), time.time()
    n = 2000 if name == "long_2000" else 200
    ms = bench.time_calls(one, 0, n, dev) if gap is None else gapped(n, gap)
    s = bench.stats(ms)
    res["blocks"].append({"name": name, "t_s": round(tb - t0, 2), "before": before, "after": nvml(), **s,
                          "first20_ms": float(np.mean(ms[:20])), "last20_ms": float(np.mean(ms[-20:]))})
    print("%-13s t=%.1f p50 %.3f mean %.3f first20 %.3f last20 %.3f" % (name, tb - t0, s["p50_ms"], s["mean_ms"],
          np.mean(ms[:20]), np.mean(ms[-20:])), before, res["blocks"][-1]["after"], flush=True)
smi.terminate()
res["TEARDOWN_CUPTI"] = os.environ.get("TEARDOWN_CUPTI")
json.dump(res, open(f"{OUT}/clock_probe_{os.environ.get('TAG', '')}.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
