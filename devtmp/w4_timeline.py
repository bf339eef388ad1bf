"""Device (issue 26, twentieth session): where a W4A16 call's fixed cost goes. The library kernel's source with four
globaltimer stamps a program (entry, after its PDL wait, after its K loop, at its end) and its SM; a graph of CALLS
chained calls over weight copies (as the int4 table runs them), rows 1 and 8, the four 32B shapes. Per call (the
middle ones), relative to the previous call's last program end (prev): first entry, wait release (min/median/max),
loop ends (min/median/p90/max), the call's own end; period = end - prev. Writes $OUT/w4_timeline.json.
DRYRUN=1 TRITON_INTERPRET=1 on a CPU checks the patching on a tiny shape."""
import json, math, os, sys, statistics
import torch, triton
sys.path.insert(0, ".")
from lib import bench
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, kernel_bytes
from lib.engine.kernels import launches

src = open(W.__file__).read()
k = src[src.index("@triton.jit(do_not_specialize"):src.index("@triton.jit\ndef _store")]
k = k.replace("def _w4a16_kernel(x_ptr,", "def _w4a16_traced(trace_ptr, x_ptr,")
k = k.replace("    _wait(PDL)                                                   # x (and",
              "    t0 = tl.extra.cuda.globaltimer()\n    _wait(PDL)\n    t1 = tl.extra.cuda.globaltimer()  # x (and", 1)
k = k.replace("    _launch_next(PDL)                # the next",
              "    t2 = tl.extra.cuda.globaltimer()\n    _launch_next(PDL)                # the next", 1)
k += ("    t3 = tl.extra.cuda.globaltimer()\n"
      "    pid = (pid_m * tl.num_programs(1) + pid_k) * tl.num_programs(0) + pid_n\n"
      "    tl.store(trace_ptr + pid * 5, t0)\n    tl.store(trace_ptr + pid * 5 + 1, t1)\n"
      "    tl.store(trace_ptr + pid * 5 + 2, t2)\n    tl.store(trace_ptr + pid * 5 + 3, t3)\n"
      "    tl.store(trace_ptr + pid * 5 + 4, tl.extra.cuda.smid().to(tl.int64))\n")
assert k.count("globaltimer") == 4
ns = dict(vars(W)); ns["__name__"] = "w4_traced"
import linecache; fname = "<w4_traced>"; linecache.cache[fname] = (len(k), None, k.splitlines(True), fname)
exec(compile("import triton.language.extra.cuda\n" + k, fname, "exec"), ns)
kern = ns["_w4a16_traced"]

OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
CALLS = 12


def call(x, w, trace, tiles=W.DEFAULT_TILES):
    M, K = x.shape
    N = w.groups.shape[1]
    split, per = W.split_plan(K, N, tiles)
    grid = (triton.cdiv(N, tiles.block_n), split, triton.cdiv(M, W.ROWS))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    part = torch.empty(split, M, N, dtype=torch.float32, device=x.device) if split > 1 else y
    count = W.tile_counters(x.device, grid[0] * grid[2])
    pdl, opts = launches(x.device, tiles.num_warps)
    kern[grid](trace, x, w.words, w.groups.view(torch.int32), part, count, y, y, M, N, K, x.stride(0),
               w.words.stride(0), w.groups.stride(0) // 2, per, tiles.block_n, W._MAGIC[x.dtype], split > 1, False,
               False, pdl, num_stages=tiles.num_stages, maxnreg=tiles.maxnreg, **opts)
    return y, grid[0] * grid[1] * grid[2]


def q(v, f):
    v = sorted(v)
    return v[min(len(v) - 1, int(f * len(v)))]


res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
    packs = [W.pack_awq(*random_awq(K, N, dev)) for _ in range(copies)]
    for rows in (1, 8):
        x = torch.randn(rows, K, device=dev, dtype=torch.float16)
        ref = W.w4a16_matmul(x, packs[0])
        y, progs = call(x, packs[0], torch.zeros(10**6, dtype=torch.int64, device=dev))
        assert torch.equal(y, ref), "traced kernel differs from the library's"
        traces = [torch.zeros(progs * 5, dtype=torch.int64, device=dev) for _ in range(CALLS)]
        g, _ = bench.capture(lambda: [call(x, packs[i % copies], traces[i]) for i in range(CALLS)])
        per_rep = []
        for rep in range(6):
            g.replay(); torch.cuda.synchronize()
            t = [tr.view(progs, 5).cpu() for tr in traces]
            if rep < 2:
                continue
            for i in range(3, CALLS - 1):
                prev = t[i - 1][:, 3].max().item()
                a = t[i].double()
                rel = lambda col: [(v - prev) / 1e3 for v in a[:, col].tolist()]
                t0, t1, t2, t3 = rel(0), rel(1), rel(2), rel(3)
                loop = [e - s for s, e in zip(t1, t2)]
                per_rep.append({"entry_min": min(t0), "entry_max": max(t0), "wait_min": min(t1), "wait_med": q(t1, .5),
                                "wait_max": max(t1), "loop_min": min(loop), "loop_med": q(loop, .5), "loop_max": max(loop),
                                "loopend_min": min(t2), "loopend_med": q(t2, .5), "loopend_p90": q(t2, .9),
                                "loopend_max": max(t2), "end": max(t3), "sms": len(set(a[:, 4].tolist()))})
        if rows == 1:                                        # one middle call's programs, for the per-SM view
            mid = t[CALLS // 2]; prev = t[CALLS // 2 - 1][:, 3].max().item()
            res.setdefault("programs", {})[name] = [[int(r[4]), (r[1] - prev) / 1e3, (r[2] - prev) / 1e3,
                                                     (r[3] - prev) / 1e3] for r in mid.double().tolist()]
            by_sm = {}
            for smid, _, e, _ in res["programs"][name]:
                by_sm.setdefault(smid, []).append(e)
            cnt = {}
            for v in by_sm.values():
                cnt.setdefault(len(v), []).append(max(v))
            print(name, "programs an SM -> SMs, mean/max of the SM's last loop end:",
                  {c: (len(v), round(sum(v) / len(v), 2), round(max(v), 2)) for c, v in sorted(cnt.items())}, flush=True)
        agg = {key: statistics.median(r[key] for r in per_rep) for key in per_rep[0]}
        floor = kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3
        res["shapes"][f"{name}_{rows}"] = dict(agg, programs=progs, floor_us=floor, n=len(per_rep))
        print(name, rows, "programs", progs, "floor %.2f" % floor, " ".join(f"{k2} {v:.2f}" for k2, v in agg.items()),
              flush=True)
json.dump(res, open(os.path.join(OUT, "w4_timeline.json"), "w"), indent=1)
