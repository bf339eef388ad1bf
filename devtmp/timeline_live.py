"""Device (issue 25, twenty-first session): why is the body step 8 % slower when the attention's dead splits exit at
once (devtmp/attn_dead.py's Live)? draft_timeline.py's stamps (entry, wait end, end a program) for the library's step
and for Live's, interleaved graphs, position of the first prompt. Writes $OUT/timeline_live.json.
Usage: python3 devtmp/timeline_live.py [profile]."""
import json, linecache, os, statistics, sys
import torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
src = open("devtmp/draft_timeline.py").read().split("P = common.setup")[0]
linecache.cache["<draft_timeline>"] = (len(src), None, src.splitlines(True), "<draft_timeline>")
ns = {"__name__": "draft_timeline_defs"}
exec(compile(src, "<draft_timeline>", "exec"), ns)
Traced, MAXP, D = ns["Traced"], ns["MAXP"], ns["D"]
import attn_dead
from lib import modes
from lib.study import common
from lib.models import build, checkpoints

k = open("devtmp/attn_dead.py").read()
k = k[k.index("@triton.jit\ndef _attention_live("):k.index("class Live(")]
k = k.replace("def _attention_live(qkv_ptr", "def _attention_live_t(trace_ptr, qkv_ptr", 1)
k = k.replace("    _launch_next(PDL)\n", "    t0 = tl.extra.cuda.globaltimer()\n    t1 = t0\n    _launch_next(PDL)\n", 1)
k = k.replace("\n        _wait(PDL)\n", "\n        _wait(PDL)\n        t1 = tl.extra.cuda.globaltimer()\n", 1)
k = k.rstrip() + ("\n        t2 = tl.extra.cuda.globaltimer()\n        pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)\n"
                  "        tl.store(trace_ptr + pid * 4, t0)\n        tl.store(trace_ptr + pid * 4 + 1, t1)\n"
                  "        tl.store(trace_ptr + pid * 4 + 2, t2)\n"
                  "        tl.store(trace_ptr + pid * 4 + 3, tl.extra.cuda.smid().to(tl.int64))\n")
g = dict(vars(attn_dead))
code = "import triton.language.extra.cuda\n" + k
linecache.cache["<live_t>"] = (len(code), None, code.splitlines(True), "<live_t>")
exec(compile(code, "<live_t>", "exec"), g)
LIVE = g["_attention_live_t"]


class LiveTraced(Traced):
    def _attention(self, att, kv, start, t):
        r, (k_cache, v_cache) = self.runner, kv
        qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (self.x, self.x)
        LIVE[(self.hq // self.heads, self.ns)](
            self._slot("attention"), self.qkv[t], qn, kn, r.cos, r.sin, k_cache, v_cache, start, self.part, self.ml,
            self.count, self.attn[t], self.eps, self.hd ** -0.5, self.hq, self.hq // self.hkv, self.heads, self.hd,
            self.split, self.ns, triton.next_power_of_2(self.ns), k_cache.shape[2], self.qk_norm, self.pdl, t, False,
            **self.attention_opts)


def graphed(step, trace, ids, start):
    step.begin(trace)
    step(ids, start)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr, stream=s):
        step.begin(trace)
        step(ids, start)
    return gr


def analyse(trace, kinds, n):
    tr = trace[:n * MAXP * 4].view(n, MAXP, 4).cpu()
    launches = [a[a[:, 0] > 0].double() for a in tr]
    rows, per_sm = {}, {}
    for i in range(1, n):
        prev_end = launches[i - 1][:, 2].max().item()
        a = launches[i]
        wait_med = a[:, 1].median().item()
        r = rows.setdefault(kinds[i], {"release": [], "post": [], "period": [], "early": [], "entered_before_prev_end": [],
                                       "programs": int(len(a))})
        r["release"].append((wait_med - prev_end) / 1e3)
        r["post"].append((a[:, 2].max().item() - wait_med) / 1e3)
        r["period"].append((a[:, 2].max().item() - prev_end) / 1e3)
        r["early"].append((a[:, 0].min().item() - prev_end) / 1e3)
        r["entered_before_prev_end"].append(float((a[:, 0] < prev_end).double().mean()))
    total = (launches[-1][:, 2].max().item() - launches[0][:, 0].min().item()) / 1e3
    return rows, total


P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
checkpoints.ensure_synthetic(P)
draft = build.build_drafts(P, (modes.DENSE,))[modes.DENSE]
runner, dev = draft.runner, draft.runner.device
prompt = common.encoded_prompts(P)[0][1]
runner.prefill(torch.tensor([prompt], device=dev))
ids = torch.tensor([[prompt[-1]]], device=dev)
out = {"device": torch.cuda.get_device_name(dev), "profile": P.name}
def event_vs_span(at):
    """Untraced and traced steps, each replay timed with CUDA events as lib.bench does; traced: also the span."""
    start = torch.tensor(at, device=dev)
    steps = {"default": D.FusedDecode(runner), "live": attn_dead.Live(runner), "default_traced": Traced(runner),
             "live_traced": LiveTraced(runner)}
    traces = {name: torch.zeros(200 * MAXP * 4, dtype=torch.int64, device=dev) for name in steps}
    graphs = {}
    for name, st in steps.items():
        if "traced" in name:
            graphs[name] = graphed(st, traces[name], ids, start)
        else:
            graphs[name] = ns["torch"].cuda.CUDAGraph()
            st(ids, start); torch.cuda.synchronize()
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.graph(graphs[name], stream=s):
                st(ids, start)
    res = {name: {"event_us": [], "span_us": [], "event2_us": []} for name in steps}
    for rep in range(60):
        for name in (list(steps) if rep % 2 else list(steps)[::-1]):
            for twice in (False, True):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); graphs[name].replay()
                if twice:
                    graphs[name].replay()
                b.record(); b.synchronize()
                if rep >= 5:
                    res[name]["event2_us" if twice else "event_us"].append(1e3 * a.elapsed_time(b))
                if rep >= 5 and "traced" in name and not twice:
                    _, total = analyse(traces[name], steps[name].kinds, steps[name].n)
                    res[name]["span_us"].append(total)
    out = {}
    for name, r in res.items():
        out[name] = {k: statistics.median(v) for k, v in r.items() if v}
        print(f"@{at} {name}", {k: round(v, 1) for k, v in out[name].items()}, flush=True)
    return out


for at in (len(prompt), 250):
    out[f"events@{at}"] = event_vs_span(at)
for at in (len(prompt), 250):
    start = torch.tensor(at, device=dev)
    steps = {"default": Traced(runner), "live": LiveTraced(runner)}
    traces = {name: torch.zeros(200 * MAXP * 4, dtype=torch.int64, device=dev) for name in steps}
    graphs = {name: graphed(st, traces[name], ids, start) for name, st in steps.items()}
    acc = {name: ({}, []) for name in steps}
    for rep in range(14):
        for name in (list(steps) if rep % 2 else list(steps)[::-1]):
            graphs[name].replay()
            torch.cuda.synchronize()
            if rep < 2:
                continue
            rows, total = analyse(traces[name], steps[name].kinds, steps[name].n)
            acc[name][1].append(total)
            for kind, r in rows.items():
                a = acc[name][0].setdefault(kind, {key: [] for key in r if key != "programs"})
                a["programs"] = r["programs"]
                for key, v in r.items():
                    if key != "programs":
                        a[key] += v
    for name, (rows, totals) in acc.items():
        res = {"step_us": statistics.median(totals), "kinds": {}}
        for kind, r in rows.items():
            res["kinds"][kind] = {"programs": r["programs"], **{key: statistics.mean(v) for key, v in r.items() if key != "programs"}}
        out[f"{name}@{at}"] = res
        print(f"{name}@{at} step {res['step_us']:.1f} us", flush=True)
        for kind, v in res["kinds"].items():
            print("   %-9s programs %4d release %.2f post %.2f period %.2f early %.2f entered-before %.2f" % (
                kind, v["programs"], v["release"], v["post"], v["period"], v["early"], v["entered_before_prev_end"]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "timeline_live.json"), "w"), indent=1)
