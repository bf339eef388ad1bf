"""Device: h100awq target step through triton_w4a16 and through gptqmodel's marlin, both padded to the profile's
batch-invariant rows, same checkpoint, interleaved CUDA events; and whether each is row-invariant: the hidden states
of a verify call of 8 equal bitwise those of the single-token calls at the same positions. Writes $OUT/awq_backends.json."""
import sys, time, json, os
sys.path.insert(0, ".")
import torch
from lib import bench
from lib.models import build as engines
from lib.models.checkpoints import load_model, model_path
from lib.study import common
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls, time_target_calls
t0 = time.time()
P = common.setup("h100awq")
from lib.models.checkpoints import ensure_synthetic
ensure_synthetic(P)
print("checkpoint", round(time.time() - t0), flush=True)
prompt = encoded_prompts(P)[0][1]
out = {"device": bench.device_name(torch.device("cuda")), "prompt_tokens": len(prompt)}
fns, runners = {}, {}
for backend in ("triton_w4a16", "marlin"):
    model = load_model(str(model_path(P, "target")), P.dtype, P.target_device, backend)
    runner = engines.build_target(P, model).runner
    runners[backend] = runner
    for n, f in target_calls(runner, prompt, [1, 8]).items():
        f()
        fns[f"{backend}/{n}"] = f
    torch.cuda.synchronize()
    print("built", backend, type(model.model.layers[0].self_attn.o_proj).__name__, round(time.time() - t0), flush=True)
L = len(prompt)
ids = torch.tensor([prompt], device="cuda")
for backend, r in runners.items():
    r.prefill(ids)
    verify = r.forward(ids[:, L - 8:], L - 8)[0].clone()
    singles = torch.stack([r.forward(ids[:, L - 8 + i:L - 7 + i], L - 8 + i)[0, 0].clone() for i in range(8)])
    out[f"{backend}_verify_equals_singles"] = bool(torch.equal(verify, singles))
    out[f"{backend}_max_abs_diff"] = float((verify.float() - singles.float()).abs().max())
    print(backend, "verify(8) == 8 single-token calls:", out[f"{backend}_verify_equals_singles"], out[f"{backend}_max_abs_diff"], flush=True)
a, b = (runners[k].forward(ids[:, L - 1:], L - 1)[0, 0].float() for k in runners)
out["triton_vs_marlin_rel_diff"] = float((a - b).norm() / a.norm())
raw = time_target_calls(P, fns, torch.device("cuda"))
out["step"] = {k: bench.stats(v) for k, v in raw.items()}
for k, v in out["step"].items():
    print(k, "mean %.3f p50 %.3f p95 %.3f" % (v["mean_ms"], v["p50_ms"], v["p95_ms"]), flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "awq_backends.json"), "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
