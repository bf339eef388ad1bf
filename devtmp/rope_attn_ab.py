"""Device (thirty-sixth session, issue 26): the target's step with the q/k norms + RoPE + cache write and the
attention as one kernel (layer_attention.rope_attention, the new default) against the two kernels before
(rope_cache, then cached_attention), one runner each over one model, interleaved graphed calls of 1 and K + 1
tokens at the first prompt's end and at a longer prompt's; tokens compared; a profile of each. Then the attention
alone: 64 calls (a step's layers) at the 32B heads in one graph, fused against the two kernels.
Usage: python3 devtmp/rope_attn_ab.py PROFILE   Writes $OUT/rope_attn_ab_PROFILE.json"""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.engine import layer_attention as la, layer_kernels
from lib.models import build as engines
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
name = sys.argv[1] if len(sys.argv) > 1 else "h100"
P = common.setup(name)
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)


class TwoKernels(layer_kernels.TritonLayer):
    ROPE_ROWS = 0                                    # every call: rope_cache, then cached_attention


k = P.decode.k
first = encoded_prompts(P)[0][1]
room = engines.build_target(P, model).runner.max_len - k - 9
prompts = {"first": first, "long": (first * (300 // len(first) + 1))[:min(300, room)]}
res = {"device": bench.device_name(torch.device(P.target_device)), "profile": name, "k": k, "cases": {}}
for where, prompt in prompts.items():
    fns, toks = {}, {}
    for label, kernels in {"two": TwoKernels, "fused": layer_kernels.TritonLayer}.items():
        runner = engines.build_target(P, model).runner
        runner.kernels = kernels
        calls = target_calls(runner, prompt, [1, k + 1])
        for n, fn in calls.items():
            fns[f"{label}/{n}"] = fn
            toks[f"{label}/{n}"] = fn().tolist()
        bench.sync(runner.device)
        print(where, label, "captured", round(time.time() - t0), flush=True)
    dev = runner.device
    same = {n: toks[f"two/{n}"] == toks[f"fused/{n}"] for n in ("1", str(k + 1))}
    raw = bench.interleaved(fns, 5, 60, dev)
    case = {"position": len(prompt), "tokens_equal": same, **{key: bench.stats(ms) for key, ms in raw.items()}}
    for key in fns:
        s = case[key]
        print(f"{where} pos {len(prompt)} {key:8s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} p95 {s['p95_ms']:.3f}",
              flush=True)
    print(where, "tokens equal", same, flush=True)
    if where == "first":
        for key in ("two/1", "fused/1"):
            bd = bench.breakdown(fns[key], dev)
            case[key + "_breakdown"] = {x: bd.get(x) for x in ("total_us", "launches", "by_kind_us", "exposed_us")}
            print(key, bd["launches"], round(bd["total_us"], 1), round(bd.get("exposed_us") or 0, 1),
                  {x: round(v, 1) for x, v in bd["by_kind_us"].items()}, flush=True)
    res["cases"][where] = case
    json.dump(res, open(f"{OUT}/rope_attn_ab_{name}.json", "w"), indent=1, default=str)

# the attention alone, 64 calls in one graph at the 32B heads (64 over 8, head_dim 128, q/k norms), 8 rows (1 or
# K + 1 real): fused against rope_cache + cached_attention
dev, dt = torch.device(P.target_device), model.dtype
g = torch.Generator(device=dev).manual_seed(1)
L = 342
kc, vc = (torch.randn(1, 8, L, 128, device=dev, dtype=dt, generator=g) for _ in range(2))
qkv = torch.randn(1, 8, 80 * 128, device=dev, dtype=dt, generator=g)
cos, sin = (torch.randn(8, 128, device=dev, dtype=dt, generator=g) for _ in range(2))
norms = [torch.rand(128, device=dev, dtype=dt, generator=g) + 0.5 for _ in range(2)]
alone = {}
for pos0 in (38, 300):
    for real in (1, k + 1):
        wpos = pos0 + torch.arange(8, device=dev)
        mask = torch.where(torch.arange(8, device=dev) < real, wpos, -1)
        def two():
            q = layer_kernels.rope_cache(qkv, norms, [cos, sin], [kc, vc], wpos, 1e-6)
            return la.cached_attention(q, kc, vc, mask)
        def fused():
            return la.rope_attention(qkv, norms, [cos, sin], [kc, vc], wpos, mask, 1e-6)
        fns = {}
        for label, fn in {"two": two, "fused": fused}.items():
            fn()
            gr, _ = bench.capture(lambda fn=fn: [fn() for _ in range(64)])
            fns[label] = gr.replay
        raw = bench.interleaved(fns, 5, 40, dev)
        for label in fns:
            s = bench.stats(raw[label]); alone[f"{pos0}/{real}/{label}"] = s
            print(f"attention x64 pos {pos0} real {real} {label:5s} mean {s['mean_ms']:.4f} p50 {s['p50_ms']:.4f} "
                  f"p95 {s['p95_ms']:.4f} ms", flush=True)
res["attention_alone_x64"] = alone
json.dump(res, open(f"{OUT}/rope_attn_ab_{name}.json", "w"), indent=1, default=str)
print("done", round(time.time() - t0), flush=True)
