"""Device (issue 26, ninth session): what the int4 target step's small kernels cost on its critical path, by
leaving them out (outputs wrong by design). One runner a variant, each compiled and captured with its own
layer-kernel class; single-token steps (8 rows, as every target call) interleaved. Variants:
  base        the library's TritonLayer
  no_norm     both RMSNorms a layer left out (norm -> x; add_norm -> (y, y): no kernel)
  no_attn     the attention left out (its output: q)
  no_both     both
  gemms_only  the four W4A16 projections a layer alone (and the head)
Writes $OUT/target_ablate.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.engine import layer_kernels
from lib.engine import runner as R
from lib.engine.layer import project
from lib.models import build as engines
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls
from lib.study.speculative import load_target
OUT, t0 = os.environ.get("OUT", "/tmp"), time.time()
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100awq")
model = load_target(P)
print("loaded", round(time.time() - t0), flush=True)
T = layer_kernels.TritonLayer


class NoNorm(T):
    norm = staticmethod(lambda module, x: x)
    add_norm = staticmethod(lambda module, x, y: (y, y))


class NoAttn(T):
    attend = staticmethod(lambda q, k_cache, v_cache, pos: q.transpose(1, 2))


class NoBoth(NoNorm):
    attend = NoAttn.attend


def gemms_only(layer, fused, x, at, kv, kernels=None):
    """The layer's four W4A16 projections alone (q's columns feed o; gate's feed down), residuals in their epilogues."""
    att, mlp = layer.self_attn, layer.mlp
    q = project(fused["qkv"], x)[..., :att.o_proj.in_features]
    x = project(att.o_proj, q, residual=x)
    g = project(fused["gate_up"], x)[..., :mlp.down_proj.in_features]
    return project(mlp.down_proj, g, residual=x)


prompt = encoded_prompts(P)[0][1]
fns = {}
variants = {"base": T, "no_norm": NoNorm, "no_attn": NoAttn, "no_both": NoBoth, "gemms_only": T}
keep = R.layer_forward
for name, kernels in variants.items():
    R.layer_forward = gemms_only if name == "gemms_only" else keep
    runner = engines.build_target(P, model).runner
    runner.kernels = kernels
    fns[name] = target_calls(runner, prompt, [1])["1"]
    fns[name]()
    bench.sync(runner.device)
    print(name, "captured", round(time.time() - t0), flush=True)
raw = bench.interleaved(fns, 5, 40, torch.device(P.target_device))
res = {"device": bench.device_name(torch.device(P.target_device)), "variants": {n: bench.stats(ms) for n, ms in raw.items()}}
for n, s in res["variants"].items():
    print("%-8s p50 %.3f ms mean %.3f p95 %.3f" % (n, s["p50_ms"], s["mean_ms"], s["p95_ms"]), flush=True)
for name in ("base", "gemms_only"):
    bd = bench.breakdown(fns[name], torch.device(P.target_device))
    res[name + "_breakdown"] = {k: bd[k] for k in ("total_us", "launches", "by_kind_us")}
    print(name, bd["launches"], round(bd["total_us"], 1), {k: round(v, 1) for k, v in bd["by_kind_us"].items()}, flush=True)
json.dump(res, open(f"{OUT}/target_ablate.json", "w"), indent=1)
