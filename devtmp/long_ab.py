"""Device (thirty-first session): where a cache turns long for the layer attention. The h100 target in caches sized
for prompts of 600, 1,100 and 2,100 positions (3, 5 and 9 splits of 256 with the generation's room), each launched
as a short cache (a program a row, its last program combining: LONG past the cache) and as a long one (ROWS 8 rows a
program, a kernel of their own combining: LONG 0), two runners over one model, interleaved, calls of 1 and K + 1
tokens at position 64 and near the prompt's end; tokens compared. Usage: python3 devtmp/long_ab.py [sizes...]"""
import sys, json, os, faulthandler
faulthandler.dump_traceback_later(280, repeat=True)
sys.path.insert(0, ".")
from dataclasses import replace
import torch
from lib import bench
from lib.study import common
from lib.study.speculative import load_target
from lib.models import build
from lib.engine import layer_attention as la

P = common.setup("h100")
model = load_target(P)
k = P.decode.k
variants = {"short": 10**9, "long": 0}
out = {"cases": []}
for size in [int(a) for a in sys.argv[1:]] or (600, 1100, 2100):
    at = replace(P, decode=replace(P.decode, max_prompt_tokens=size))
    runners = {}
    for name, long in variants.items():
        la.LONG = long
        r = build.build_target(at, model).runner
        r.warm("greedy", [1, k + 1])
        g = torch.Generator(device=r.device).manual_seed(0)
        r.cache.k.normal_(generator=g); r.cache.v.normal_(generator=g)
        runners[name] = r
    dev = r.device
    out["device"] = bench.device_name(dev)
    ids = {n: torch.randint(3, 1000, (1, n), device=dev) for n in (1, k + 1)}
    def call(name, n, pos):
        la.LONG = variants[name]
        return runners[name].greedy(ids[n], pos).clone()
    for pos in (64, size - 80):
        same = {n: torch.equal(call("short", n, pos), call("long", n, pos)) for n in ids}
        fns = {f"{name}/{n}": (lambda name=name, n=n: call(name, n, pos)) for name in variants for n in ids}
        raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), dev)
        row = {"cache": r.max_len, "position": pos, "tokens_equal": same, **{key: bench.stats(ms) for key, ms in raw.items()}}
        out["cases"].append(row)
        print(f"cache {r.max_len} pos {pos}: tokens equal {same}", flush=True)
        for key in fns:
            s = row[key]
            print(f"   {key:8s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} p95 {s['p95_ms']:.3f} ms", flush=True)
    del runners, r
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "long_ab.json"), "w"), indent=1, default=str)
