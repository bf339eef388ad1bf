"""Device (thirty-first session): the h100 target's calls of 1 and K + 1 tokens in a cache sized for 8,192 positions
with the layer attention taking 1 (the default before), 2, 4 or 8 query rows a program, the splits combined by the
last program or a kernel of their own (s), one
runner a variant over one model, interleaved, at positions 64, 2,048 and 8,192; their tokens on a random cache.
Usage: python3 devtmp/rows_ab.py [cache size, 0: the profile's] [positions...]"""
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
size = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
at = replace(P, decode=replace(P.decode, max_prompt_tokens=size)) if size else P
variants = {"r1": (1, 4, False), "r2": (2, 4, False), "r2s": (2, 4, True), "r4s": (4, 4, True), "r8s": (8, 4, True),
            "r8sw8": (8, 8, True)}
k = P.decode.k
runners = {}
for name, (rows, warps, sep) in variants.items():
    la.ROWS, la.WARPS, la.SEPARATE = rows, warps, sep
    r = build.build_target(at, model).runner
    r.warm("greedy", [1, k + 1])
    g = torch.Generator(device=r.device).manual_seed(0)
    r.cache.k.normal_(generator=g); r.cache.v.normal_(generator=g)
    runners[name] = r
    print("built", name, flush=True)

def call(name, ids, pos):
    la.ROWS, la.WARPS, la.SEPARATE = variants[name]
    return runners[name].greedy(ids, pos).clone()

dev = runners["r1"].device
out = {"device": bench.device_name(dev), "rows": runners["r1"].rows, "k": k, "variants": variants, "cases": []}
ids = {n: torch.randint(3, 1000, (1, n), device=dev) for n in (1, k + 1)}
for pos in [int(a) for a in sys.argv[2:]] or (64, 2048, 8192):
    base = {n: call("r1", ids[n], pos) for n in ids}
    same = {f"{name}/{n}": torch.equal(call(name, ids[n], pos), base[n]) for name in variants for n in ids}
    fns = {f"{name}/{n}": (lambda name=name, n=n: call(name, ids[n], pos)) for name in variants for n in ids}
    raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), dev)
    row = {"position": pos, "tokens_equal_r1": same, **{key: bench.stats(ms) for key, ms in raw.items()}}
    out["cases"].append(row)
    print(f"pos {pos}: tokens equal to r1 {all(same.values())} {same if not all(same.values()) else ''}", flush=True)
    for key in fns:
        s = row[key]
        print(f"   {key:8s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} p95 {s['p95_ms']:.3f} ms", flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"rows_ab_{size}.json"), "w"), indent=1, default=str)

# The attention alone: 64 calls (a step's layers) of cached_attention captured in one graph, the 32B target's heads,
# 8 rows (1 or 7 real, the rest padding), per variant, at each position; ms a step's 64 calls.
HQ, HKV, HD, L = 64, 8, 128, (size or 342) + 64
g = torch.Generator(device=dev).manual_seed(1)
kc, vc = (torch.randn(1, HKV, L, HD, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
q = torch.randn(1, HQ, 8, HD, device=dev, dtype=torch.bfloat16, generator=g)
alone = {}
for pos0 in [int(a) for a in sys.argv[2:]] or (64, 2048, 8192):
    for real in (1, 7):
        pos = torch.tensor([pos0 + i if i < real else -1 for i in range(8)], device=dev)
        fns = {}
        for name, (rows, warps, sep) in variants.items():
            la.ROWS, la.WARPS, la.SEPARATE = rows, warps, sep
            la.cached_attention(q, kc, vc, pos)
            gr, _ = bench.capture(lambda: [la.cached_attention(q, kc, vc, pos) for _ in range(64)])
            fns[name] = gr.replay
        raw = bench.interleaved(fns, 5, 30, dev)
        for name in variants:
            s = bench.stats(raw[name]); alone[f"{pos0}/{real}/{name}"] = s
            print(f"attention x64 pos {pos0} real {real} {name:5s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} "
                  f"p95 {s['p95_ms']:.3f} ms", flush=True)
out["attention_alone_x64"] = alone
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"rows_ab_{size}.json"), "w"), indent=1, default=str)
