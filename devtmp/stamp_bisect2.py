"""Device (issue 25, twenty-first session): stamp_bisect.py found the body step 2-3 % faster at position 38 with
draft_timeline's stamps in the GEMVs (timer reads at entry and after the wait, four stores at the end), 7 % slower with
the attention's dead splits exiting at once (attn_dead.Live), and fastest with both. Which piece of the GEMVs' stamps
does it: the end stores alone, the entry timer alone, the post-wait timer alone, all. Events around each replay.
Usage: python3 devtmp/stamp_bisect2.py"""
import json, linecache, os, statistics, sys
import torch, triton
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
import attn_dead
from lib import modes
from lib.study import common
from lib.models import build, checkpoints
from lib.engine import decode as D

SRC = open(D.__file__).read()


def gemv_variant(what):
    k = SRC[SRC.index("@triton.jit\ndef _decode_gemv("):SRC.index("@triton.jit\ndef _gemv_input")]
    k = k.replace("def _decode_gemv(x_ptr", f"def _gemv_{what}(trace_ptr, x_ptr", 1)
    stores = ["    pid = tl.program_id(0)"]
    if what in ("t0", "all"):
        k = k.replace("    _launch_next(PDL)\n", "    t0 = tl.extra.cuda.globaltimer()\n    _launch_next(PDL)\n", 1)
        stores.append("    tl.store(trace_ptr + pid * 4, t0)")
    if what in ("t1", "all"):
        i = k.index("    _wait(PDL)"); j = k.index("\n", i)
        k = k[:j + 1] + "    t1 = tl.extra.cuda.globaltimer()\n" + k[j + 1:]
        stores.append("    tl.store(trace_ptr + pid * 4 + 1, t1)")
    if what in ("all", "t2"):
        stores += ["    t2 = tl.extra.cuda.globaltimer()", "    tl.store(trace_ptr + pid * 4 + 2, t2)"]
    if what == "all":
        stores.append("    tl.store(trace_ptr + pid * 4 + 3, tl.extra.cuda.smid().to(tl.int64))")
    if what in ("wef", "wcg"):                                   # the weights' loads: L2 evict-first, or past L1
        mod = 'eviction_policy="evict_first"' if what == "wef" else 'cache_modifier=".cg"'
        for old in ("cols[None, :], mask=ok, other=0.0)",):
            assert k.count(old) == 2
            k = k.replace(old, old[:-1] + ", " + mod + ")")
    if what in ("bar", "t1n"):                                   # no store: a barrier, or a timer read left unused
        i = k.index("    _wait(PDL)"); j = k.index("\n", i)
        k = k[:j + 1] + ("    tl.debug_barrier()\n" if what == "bar" else "    t1 = tl.extra.cuda.globaltimer()\n") + k[j + 1:]
    if what == "stores":
        stores += [f"    tl.store(trace_ptr + pid * 4 + {i}, pid.to(tl.int64))" for i in range(4)]
    code = "import triton.language.extra.cuda\n" + k.rstrip() + "\n" + "\n".join(stores) + "\n"
    fname = f"<gemv_{what}>"
    linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
    ns = dict(vars(D))
    if what == "cg":                                             # the activations read past L1 (ld.global.cg)
        g = SRC[SRC.index("@triton.jit\ndef _gemv_input("):SRC.index("@triton.jit\ndef _gemv_output")]
        g = g.replace("x = tl.load(x_ptr + t * K + cols, mask=cols < K, other=0.0)",
                      "x = tl.load(x_ptr + t * K + cols, mask=cols < K, other=0.0, cache_modifier=\".cg\")")
        assert "cache_modifier" in g
        linecache.cache["<gemv_input_cg>"] = (len(g), None, g.splitlines(True), "<gemv_input_cg>")
        exec(compile(g, "<gemv_input_cg>", "exec"), ns)
    exec(compile(code, fname, "exec"), ns)
    return ns[f"_gemv_{what}"]


def stepped(base, what):
    kernel = gemv_variant(what)

    class Step(base):
        def __init__(self, runner):
            super().__init__(runner)
            self.trace = torch.zeros(4096 * 4, dtype=torch.int64, device=runner.device)

        def _gemv(self, x, g, w, out, name, T, ids=None):
            norm, glu, residual = D.GEMVS[name]
            N, K = w.shape[0] // (2 if glu else 1), w.shape[1]
            bn = self.bn[name]
            kernel[(triton.cdiv(N, bn),)](self.trace, x, g if norm else x, w, out, x if ids is None else ids, self.x,
                                          self.eps, N, K, triton.next_power_of_2(K), bn, norm, glu, residual,
                                          ids is not None, self.pdl, T, **self.gemv_opts[name])
    return Step


P = common.setup("h100")
checkpoints.ensure_synthetic(P)
runner = build.build_drafts(P, (modes.DENSE,))[modes.DENSE].runner
dev = runner.device
prompt = common.encoded_prompts(P)[0][1]
runner.prefill(torch.tensor([prompt], device=dev))
ids = torch.tensor([[prompt[-1]]], device=dev)
VARIANTS = {"plain": lambda: D.FusedDecode(runner), "live": lambda: attn_dead.Live(runner), "plain_b": lambda: D.FusedDecode(runner)}
WHATS = os.environ.get("WHATS", "all,stores,t0,t1,t2").split(",")
for what in WHATS:
    VARIANTS[f"gemv_{what}"] = (lambda w=what: stepped(D.FusedDecode, w)(runner))
    if not os.environ.get("NO_LIVE"):
        VARIANTS[f"live+gemv_{what}"] = (lambda w=what: stepped(attn_dead.Live, w)(runner))
out = {"device": torch.cuda.get_device_name(dev)}
for at in (len(prompt), 250):
    start = torch.tensor(at, device=dev)
    steps = {name: make() for name, make in VARIANTS.items()}
    ref = steps["plain"](ids, start).clone()
    graphs, equal = {}, {}
    for name, st in steps.items():
        equal[name] = bool(torch.equal(st(ids, start), ref))
        torch.cuda.synchronize()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name], stream=s):
            st(ids, start)
    times = {name: [] for name in steps}
    for rep in range(160):
        for name in (list(steps) if rep % 2 else list(steps)[::-1]):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graphs[name].replay(); b.record(); b.synchronize()
            if rep >= 10:
                times[name].append(1e3 * a.elapsed_time(b))
    out[at] = {name: {"p50_us": statistics.median(v), "mean_us": statistics.mean(v), "equal": equal[name]} for name, v in times.items()}
    for name, r in out[at].items():
        print(f"@{at} {name:18s} p50 {r['p50_us']:.1f} mean {r['mean_us']:.1f} us equal {r['equal']}", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "stamp_bisect2.json"), "w"), indent=1)
