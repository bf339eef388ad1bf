"""Forty-fourth session, device: the draft's prompt fill (Runner.fill) through the round's call lengths only (1..7, as
every e2e run filled until now) against those plus FILL_CHUNK (64, the last call padded), the `h100` draft shape in
bf16 and fp16 (the int4 profiles' draft), prompts of 17-124 tokens (the e2e prompts' range); two runners on one
model, fills interleaved, CUDA events; each fill's prompt K/V against the eager one-call prefill's."""
import json, os, sys
import torch
sys.path.insert(0, ".")
from lib.bench import device_name, interleaved, stats
from lib.config import load_profile
from lib.engine.runner import FILL_CHUNK, Runner
from lib.models.build import acceleration, cache_len
from lib.models.synthetic import make_pair

dev, prof = torch.device("cuda"), load_profile("h100")
rows = {}
for dtype in ("bfloat16", "float16"):
    _, model = make_pair(prof.models.synthetic, prof.seed, dtype, "cuda", which=("draft",))
    n, accel = cache_len(prof), acceleration(prof, "draft")
    old, new, eager = Runner(model, n, accel, "draft"), Runner(model, n, accel, "draft"), Runner(model, n)
    old.warm("hidden", range(1, 8))
    new.warm("hidden", [*range(1, 8), FILL_CHUNK])
    print(dtype, model.dtype, "paths", old.layer_path, old.decode_path, flush=True)
    g = torch.Generator(device=dev).manual_seed(3)
    for P in (17, 38, 63, 85, 124):
        ids = torch.randint(3, 1000, (1, P), device=dev, generator=g)
        eager.prefill(ids)
        err = {}
        for name, r in (("rounds", old), ("chunk64", new)):
            r.fill(ids)
            err[name] = max(float((a[..., :P, :].float() - b[..., :P, :].float()).abs().max())
                            for a, b in ((r.cache.k, eager.cache.k), (r.cache.v, eager.cache.v)))
        ms = interleaved({"rounds": lambda: old.fill(ids), "chunk64": lambda: new.fill(ids)}, 3, 40, dev)
        rows[f"{dtype}/{P}"] = {k: {**stats(v), "max_abs_err_vs_eager": err[k]} for k, v in ms.items()}
        a, b = rows[f"{dtype}/{P}"]["rounds"], rows[f"{dtype}/{P}"]["chunk64"]
        print(f"{dtype} P={P:4d} rounds' lengths mean {a['mean_ms']:.3f} p50 {a['p50_ms']:.3f} p95 {a['p95_ms']:.3f} | "
              f"+64 mean {b['mean_ms']:.3f} p50 {b['p50_ms']:.3f} p95 {b['p95_ms']:.3f} ms | err {err}", flush=True)
    del old, new, eager, model
    torch.cuda.empty_cache()
json.dump({"device": device_name(dev), "fill_chunk": FILL_CHUNK, "rows": rows},
          open(os.environ.get("OUT", ".") + "/fill_ab.json", "w"), indent=1)
