"""Why the fused draft step fails its check on SmolLM2 in bf16 (outputs/smollm2_gpu: rel error 0.173 > 0.15):
fused bf16 and reference bf16 each against an fp32 reference of the same positions. Runs on a CPU under
TRITON_INTERPRET=1 or on a GPU. Usage: python devtmp/fused_err.py [n_layers] [steps]"""
import os, sys, time
import torch
from lib.models.checkpoints import load_model
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode

dev = "cuda" if torch.cuda.is_available() else "cpu"
n_layers = int(sys.argv[1]) if len(sys.argv) > 1 else 28
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
path = os.environ.get("SMOLLM2", "models/smollm2")
hs = {}
for dt in ("float32", "bfloat16"):
    model = load_model(path, dt, dev)
    t = time.time()
    r = Runner(model, 128, Acceleration(triton_layers=dev == "cuda"), n_layers=n_layers)
    print(dt, r.decode_path, r.layer_path, f"{time.time() - t:.0f}s", flush=True)
    step = decode.FusedDecode(r) if dt == "bfloat16" else None
    if step is not None and dev == "cuda":
        print("check:", decode.check(r, step, steps) or "passed", step.checked, flush=True)
    start = max(0, min(5 * decode.SPLIT // 2, r.max_len - steps))
    ids = (torch.arange(start + steps, device=r.device) * 7919 + 11) % r.body.embed_tokens.weight.shape[0]
    r.decode = None
    hs[dt, "ref"] = decode._hidden(r, lambda x, p: r._forward(x, p, compiled=False), ids, start, steps, 1)
    if dt == "bfloat16":
        hs[dt, "fused"] = decode._hidden(r, step, ids, start, steps, 1)
    W = model.get_output_embeddings().weight.float()
f32 = hs["float32", "ref"]
for key, h in hs.items():
    d = h - f32
    maxrel = (d.abs().amax(-1) / f32.pow(2).mean(-1).sqrt())
    l2 = d.norm(dim=-1) / f32.norm(dim=-1)
    am = ((h @ W.T).argmax(-1) == (f32 @ W.T).argmax(-1)).float().mean()
    print(key, "new metric vs fp32", f"{decode._error(h, f32):.4f}", "max|d|/rms per pos", [f"{x:.3f}" for x in maxrel.tolist()], "L2 rel", f"{l2.max():.4f}",
          "argmax agree", f"{am:.2f}")
b = hs["bfloat16", "fused"] - hs["bfloat16", "ref"]
print("fused vs bf16 ref: new metric", f"{decode._error(hs['bfloat16', 'fused'], hs['bfloat16', 'ref']):.4f}", "max|d|/rms", f"{(b.abs().amax(-1) / hs['bfloat16', 'ref'].pow(2).mean(-1).sqrt()).max():.3f}",
      "L2 rel", f"{(b.norm(dim=-1) / hs['bfloat16', 'ref'].norm(dim=-1)).max():.4f}")
i = b.abs().argmax(-1)
print("dims of the largest |d|:", i.tolist(), "ref values there:", [f"{hs['bfloat16','ref'][j, k]:.1f}" for j, k in enumerate(i.tolist())],
      "rms", [f"{x:.2f}" for x in hs['bfloat16','ref'].pow(2).mean(-1).sqrt().tolist()])
