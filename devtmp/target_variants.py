"""Device (issue 26, eleventh session): the int4 target step (8 rows, single token) with the layer's q/k norms + RoPE
+ cache write as one Triton kernel (rope) and SiLU(gate)*up in gate/up's W4A16 epilogue (glu), each on and off.
One runner a variant, compiled and captured with its own setting; interleaved graphed calls. Writes
$OUT/target_variants.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.engine import layer_kernels
from lib.models import build as engines, w4a16 as W
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
from lib.engine.layer import rotate_half
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)
T = layer_kernels.TritonLayer


def torch_rope(att, qkv, cos, sin, kv, pos):
    """What the layer did before (compiled around the projection): split, q/k norms, RoPE, index_copy."""
    n, hd = qkv.shape[1], kv[0].shape[-1]
    hq, hkv = att.config.num_attention_heads, att.config.num_key_value_heads
    q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
    q, k, v = q.view(1, n, -1, hd), k.view(1, n, -1, hd), v.view(1, n, -1, hd)
    q, k = att.q_norm(q), att.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    kv[0].index_copy_(2, pos, k)
    kv[1].index_copy_(2, pos, v)
    return q


class NoRope(T):
    rope_cache = staticmethod(torch_rope)


prompt = encoded_prompts(P)[0][1]
fns, toks = {}, {}
glu = W.Int4Linear.silu_glu
for name, (kernels, use_glu) in {"before": (NoRope, False), "rope": (T, False), "glu": (NoRope, True),
                                 "both": (T, True)}.items():
    if use_glu:
        W.Int4Linear.silu_glu = glu
    elif hasattr(W.Int4Linear, "silu_glu"):
        del W.Int4Linear.silu_glu
    runner = engines.build_target(P, model).runner
    runner.kernels = kernels
    fns[name] = target_calls(runner, prompt, [1])["1"]
    toks[name] = int(fns[name]()[0])
    bench.sync(runner.device)
    print(name, "captured", toks[name], round(time.time() - t0), flush=True)
W.Int4Linear.silu_glu = glu
dev = torch.device(P.target_device)
raw = bench.interleaved(fns, 5, 60, dev)
res = {"device": bench.device_name(dev), "tokens": toks, "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-8s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
for name in ("before", "rope", "glu", "both"):
    bd = bench.breakdown(fns[name], dev)
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us", "kernels")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
    for k in (bd["kernels"][:10] if name in ("before", "both") else []):
        print("   %.1f %d %s" % (k["us"], k["launches"], k["kernel"][:90]), flush=True)
json.dump(res, open(f"{OUT}/target_variants.json", "w"), indent=1)
