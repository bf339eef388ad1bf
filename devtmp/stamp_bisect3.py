"""Device (issue 25, twenty-second session): stamp_bisect2's "t1" (a globaltimer read after each GEMV's wait, stored at
the program's end) took 3-4 % off the body step on four H200s. Which GEMV kinds carry it (t1@qkv, @o, @gate_up,
@down), and is it the timer or any volatile read after the wait: the SM clock (clk), a nanosleep (ns0, ns200), the
timer made an address dependency of the activations instead of stored (dep), the timer stored at once (early).
Usage: WHATS=... python3 devtmp/stamp_bisect3.py"""
import json, linecache, os, statistics, sys
import torch, triton
sys.path.insert(0, ".")
from lib import modes
from lib.study import common
from lib.models import build, checkpoints
from lib.engine import decode as D

SRC = open(D.__file__).read()
AFTER = {"t1": "    t1 = tl.extra.cuda.globaltimer()\n",
         "early": "    t1 = tl.extra.cuda.globaltimer()\n    tl.store(trace_ptr + tl.program_id(0) * 4 + 1, t1)\n",
         "dep": "    t1 = tl.extra.cuda.globaltimer()\n    x_ptr = x_ptr + ((t1 >> 63) * 16).to(tl.int32)\n",
         "clk": "    t1 = tl.inline_asm_elementwise('mov.u32 $0, %clock;', '=r', [], dtype=tl.int32, is_pure=False, pack=1).to(tl.int64)\n",
         "ns0": "    t1 = tl.inline_asm_elementwise('{ nanosleep.u32 0; mov.u32 $0, 0; }', '=r', [], dtype=tl.int32, is_pure=False, pack=1).to(tl.int64)\n",
         "ns200": "    t1 = tl.inline_asm_elementwise('{ nanosleep.u32 200; mov.u32 $0, 0; }', '=r', [], dtype=tl.int32, is_pure=False, pack=1).to(tl.int64)\n"}


RES = "res = tl.load(out_ptr + t * N + rows, mask=rows < N)"
INPUT = {"nores": "res = (rows * 0).to(tl.float32)",                 # no residual read (output wrong: an upper bound)
         "resvol": RES[:-1] + ", volatile=True)"}                    # the residual read volatile (issued at once)


def gemv_variant(what):
    k = SRC[SRC.index("@triton.jit\ndef _decode_gemv("):SRC.index("@triton.jit\ndef _gemv_input")]
    if what in INPUT:
        g = SRC[SRC.index("@triton.jit\ndef _gemv_input("):SRC.index("@triton.jit\ndef _gemv_output")]
        assert RES in g
        g = g.replace(RES, INPUT[what])
        linecache.cache[f"<gi_{what}>"] = (len(g), None, g.splitlines(True), f"<gi_{what}>")
        ns = dict(vars(D))
        exec(compile(g, f"<gi_{what}>", "exec"), ns)
        linecache.cache[f"<dg_{what}>"] = (len(k), None, k.splitlines(True), f"<dg_{what}>")
        exec(compile(k, f"<dg_{what}>", "exec"), ns)
        return ns["_decode_gemv"]
    k = k.replace("def _decode_gemv(x_ptr", f"def _gemv_{what}(trace_ptr, x_ptr", 1)
    i = k.index("    _wait(PDL)"); j = k.index("\n", i)
    k = k[:j + 1] + AFTER[what] + k[j + 1:]
    store = "" if what in ("early", "dep") else "    tl.store(trace_ptr + tl.program_id(0) * 4 + 1, t1)\n"
    code = "import triton.language.extra.cuda\n" + k.rstrip() + "\n" + store
    fname = f"<gemv_{what}>"
    linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
    ns = dict(vars(D))
    exec(compile(code, fname, "exec"), ns)
    return ns[f"_gemv_{what}"]


def stepped(what, only=None):
    kernel = gemv_variant(what)

    class Step(D.FusedDecode):
        def __init__(self, runner):
            super().__init__(runner)
            self.trace = torch.zeros(4096 * 4, dtype=torch.int64, device=runner.device)

        def _gemv(self, x, g, w, out, name, T, ids=None):
            if only and name != only:
                return super()._gemv(x, g, w, out, name, T, ids)
            if what in INPUT:
                k0, D._decode_gemv = D._decode_gemv, kernel
                try:
                    return super()._gemv(x, g, w, out, name, T, ids)
                finally:
                    D._decode_gemv = k0
            norm, glu, residual = D.GEMVS[name]
            N, K = w.shape[0] // (2 if glu else 1), w.shape[1]
            bn = self.bn[name]
            kernel[(triton.cdiv(N, bn),)](self.trace, x, g if norm else x, w, out, x if ids is None else ids, self.x,
                                          self.eps, N, K, triton.next_power_of_2(K), bn, norm, glu, residual,
                                          ids is not None, self.pdl, T, **self.gemv_opts[name])
    return Step


if __name__ == "__main__":
    P = common.setup("h100")
    checkpoints.ensure_synthetic(P)
    runner = build.build_drafts(P, (modes.DENSE,))[modes.DENSE].runner
    dev = runner.device
    prompt = common.encoded_prompts(P)[0][1]
    runner.prefill(torch.tensor([prompt], device=dev))
    ids = torch.tensor([[prompt[-1]]], device=dev)
    N = int(os.environ.get("INSTANCES", "1"))                      # instances a variant (own buffers, own graph)
    VARIANTS = {f"plain#{i}": lambda: D.FusedDecode(runner) for i in range(max(N, 2))}
    for what in os.environ.get("WHATS", "t1,t1@qkv,t1@o,t1@gate_up,t1@down,clk,ns0,ns200,dep,early,nores,nores@o,nores@down,resvol").split(","):
        w, _, only = what.partition("@")
        for i in range(N):
            VARIANTS[f"{what}#{i}"] = (lambda w=w, only=only: stepped(w, only or None)(runner))
    out = {"device": torch.cuda.get_device_name(dev)}
    for at in [len(prompt)] + [int(a) for a in os.environ.get("AT", "250").split(",")]:
        start = torch.tensor(at, device=dev)
        steps = {name: make() for name, make in VARIANTS.items()}
        ref = steps["plain#0"](ids, start).clone()
        graphs, equal = {}, {}
        for name, st in steps.items():
            equal[name] = bool(torch.equal(st(ids, start), ref))
            torch.cuda.synchronize()
            s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name], stream=s):
                st(ids, start)
        times = {name: [] for name in steps}
        for rep in range(int(os.environ.get("REPS", "160"))):
            for name in (list(steps) if rep % 2 else list(steps)[::-1]):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); graphs[name].replay(); b.record(); b.synchronize()
                if rep >= 10:
                    times[name].append(1e3 * a.elapsed_time(b))
        out[at] = {name: {"p50_us": statistics.median(v), "mean_us": statistics.mean(v), "equal": equal[name]}
                   for name, v in times.items()}
        for name, r in out[at].items():
            print(f"@{at} {name:14s} p50 {r['p50_us']:.1f} mean {r['mean_us']:.1f} us equal {r['equal']}", flush=True)
        by = {}
        for name, r in out[at].items():
            by.setdefault(name.split("#")[0], []).append(r["p50_us"])
        for v, p in by.items():
            print(f"@{at} {v:14s} p50 over {len(p)} instances: mean {statistics.mean(p):.1f} min {min(p):.1f} max {max(p):.1f}", flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "stamp_bisect3.json"), "w"), indent=1)
