"""Device (issue 25, twenty-first session): the stamped body step (draft_timeline.py's kernels) replayed faster than the
library's at position 38 (445 against 470 us on one H200; Live 446 against 495). Which stamps do it: stamped GEMVs only,
stamped attention only, both; events around each replay as lib.bench times them. Usage: python3 devtmp/stamp_bisect.py"""
import json, linecache, os, statistics, sys
import torch
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
src = open("devtmp/timeline_live.py").read().split("\nP = common.setup(sys.argv")[0]
linecache.cache["<tl>"] = (len(src), None, src.splitlines(True), "<tl>")
ns = {"__name__": "tl_defs"}
exec(compile(src, "<tl>", "exec"), ns)
Traced, LiveTraced, MAXP, D, attn_dead = ns["Traced"], ns["LiveTraced"], ns["MAXP"], ns["D"], ns["attn_dead"]
from lib import modes
from lib.study import common
from lib.models import build, checkpoints


class GemvOnly(Traced):
    _attention = D.FusedDecode._attention


class AttentionOnly(Traced):
    _gemv = D.FusedDecode._gemv


P = common.setup("h100")
checkpoints.ensure_synthetic(P)
runner = build.build_drafts(P, (modes.DENSE,))[modes.DENSE].runner
dev = runner.device
prompt = common.encoded_prompts(P)[0][1]
runner.prefill(torch.tensor([prompt], device=dev))
ids = torch.tensor([[prompt[-1]]], device=dev)
out = {"device": torch.cuda.get_device_name(dev)}
for at in (len(prompt), 250):
    start = torch.tensor(at, device=dev)
    steps = {"plain": D.FusedDecode(runner), "gemv_stamped": GemvOnly(runner), "attention_stamped": AttentionOnly(runner),
             "both_stamped": Traced(runner), "plain_b": D.FusedDecode(runner), "live": attn_dead.Live(runner),
             "live_both_stamped": LiveTraced(runner)}
    ref = steps["plain"](ids, start).clone()
    graphs, equal = {}, {}
    for name, st in steps.items():
        if hasattr(st, "begin"):
            st.begin(torch.zeros(200 * MAXP * 4, dtype=torch.int64, device=dev))
        equal[name] = bool(torch.equal(st(ids, start), ref))
        torch.cuda.synchronize()
        if hasattr(st, "begin"):
            st.begin(st.trace)
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name], stream=s):
            st(ids, start)
    times = {name: [] for name in steps}
    for rep in range(200):
        for name in (list(steps) if rep % 2 else list(steps)[::-1]):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graphs[name].replay(); b.record(); b.synchronize()
            if rep >= 10:
                times[name].append(1e3 * a.elapsed_time(b))
    out[at] = {name: {"p50_us": statistics.median(v), "mean_us": statistics.mean(v), "equal": equal[name]} for name, v in times.items()}
    for name, r in out[at].items():
        print(f"@{at} {name:18s} p50 {r['p50_us']:.1f} mean {r['mean_us']:.1f} us equal {r['equal']}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "stamp_bisect.json"), "w"), indent=1)
