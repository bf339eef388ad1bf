"""Device (issue 25, twenty-second session): the o-projection's activation reads after its first weights
(LATE_ACTIVATIONS = {"o"}, kernels._after_wait) against none late and against every GEMV late: the body step (three
instances a variant, positions 38, 250, 600, outputs bitwise) and the K = 6 block with heads (two instances, dense
and FlashHead), interleaved. Usage: python3 devtmp/late_ab.py [profile]"""
import json, os, statistics, sys
import torch
sys.path.insert(0, ".")
from lib import bench, modes
from lib.engine import decode as D
from lib.study import common, microbench as M

SETS = {"none": set(), "o": {"o"}, "all": set(D.GEMVS)}
NAMES = {"q": "qkv", "o": "o", "g": "gate_up", "d": "down"}


def spec(late):
    """'o2q2/oq': o and q/k/v in 2-warp programs, their activations late; 'none', 'o', 'all': default warps."""
    if late in SETS:
        return D.GEMV_WARPS, SETS[late]
    w, _, l = late.partition("/")
    warps = dict(D.GEMV_WARPS, **{NAMES[w[i]]: int(w[i + 1]) for i in range(0, len(w), 2)})
    return warps, {NAMES[c] for c in l}


def made(runner, late):
    late, _, mode = late.partition("@")                   # 'o@2': LATE_MODE 2 (the last row's weights first)
    warps, lates = spec(late)
    keep, D.LATE_ACTIVATIONS = D.LATE_ACTIVATIONS, lates
    keep_mode, D.LATE_MODE = D.LATE_MODE, int(mode or D.LATE_MODE)
    try:
        return D.FusedDecode(runner, warps=warps)
    finally:
        D.LATE_ACTIVATIONS, D.LATE_MODE = keep, keep_mode


VARIANTS = os.environ.get("SETS", "none,o,all").split(",")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
drafts, x, pos = M.step_drafts(P)
out = {"device": bench.device_name(x.device), "default": sorted(D.LATE_ACTIVATIONS)}
runner = drafts[modes.DENSE].runner
dev = runner.device
ids = torch.tensor([[7]], device=dev)
for at in [int(a) for a in os.environ.get("AT", "38,250,600").split(",")]:
    start = torch.tensor(at, device=dev)
    steps = {f"{late}#{i}": made(runner, late) for late in VARIANTS for i in range(3)}
    ref = steps[next(iter(steps))](ids, start).clone()
    graphs, equal = {}, {}
    for name, st in steps.items():
        equal[name] = bool(torch.equal(st(ids, start), ref))
        torch.cuda.synchronize()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name], stream=s):
            st(ids, start)
    times = {name: [] for name in steps}
    for rep in range(310):
        for name in (list(steps) if rep % 2 else list(steps)[::-1]):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graphs[name].replay(); b.record(); b.synchronize()
            if rep >= 10:
                times[name].append(1e3 * a.elapsed_time(b))
    rows = {name: {"p50_us": statistics.median(v), "mean_us": statistics.mean(v), "equal": equal[name]}
            for name, v in times.items()}
    out[f"body@{at}"] = rows
    for late in VARIANTS:
        p = [r["p50_us"] for n, r in rows.items() if n.startswith(late + "#")]
        eq = all(r["equal"] for n, r in rows.items() if n.startswith(late + "#"))
        print(f"body @{at} {late:10s} p50 us, instances: " + " ".join(f"{v:.1f}" for v in p)
              + f"  mean {statistics.mean(p):.1f}  bitwise equal {eq}", flush=True)
if os.environ.get("NO_BLOCK"):
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "late_ab.json"), "w"), indent=1); sys.exit(0)
k = P.decode.k
fns = {}
for name in (modes.DENSE, modes.FLASH):
    d = drafts[name]
    for late in os.environ.get("BLOCK_SETS", "none,o").split(","):
        for i in range(2):
            fns[f"{name}/{late}#{i}"] = M.instance_block(d.runner, made(d.runner, late), d.head.head, x, pos, k)
raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
for key, ms in raw.items():
    out[key] = {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")}
    print(f"block K={k} @{pos} {key:14s} ms a token: mean {out[key]['mean_ms']:.4f} p50 {out[key]['p50_ms']:.4f}",
          flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "late_ab.json"), "w"), indent=1)
