"""Device (thirty-second session): the h100 dense draft's K-token block in bf16 against the same draft in fp16 (the
dtype h100awq's pair runs in), interleaved in one process, caches sized for the position (size:pos, size 0: the
profile's own), and the attention kernel alone (64 calls of one layer's). h100awq's context study on one H200 read
the fp16 draft 2.1x slower at 32,768 positions than h100's bf16 one on another H200."""
import json, os, sys, time, faulthandler
faulthandler.dump_traceback_later(400, repeat=True)
sys.path.insert(0, "."); sys.path.insert(0, "devtmp")
from dataclasses import replace
import torch
from lib import bench, modes
from lib.study import common, microbench as M
from lib.models import build
from lib.engine import decode as D
import importlib; old = importlib.import_module(os.environ.get("OLD_ATTENTION", "decode_attention_old"))

P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
cases = [(int(a.split(":")[0]), int(a.split(":")[1])) for a in sys.argv[2:]] or [(0, 64), (8192, 8192), (32768, 32768)]
k = P.decode.k
out = {"k": k, "cases": []}
t0 = time.time()
for size, pos in cases:
    at = replace(P, decode=replace(P.decode, max_prompt_tokens=size)) if size else P
    drafts = {dt: build.build_drafts(replace(at, dtype=dt.split("_")[0]), [modes.DENSE])[modes.DENSE]
              for dt in ("bfloat16", "float16", "float16_old")}
    x = torch.zeros((1, 1), dtype=torch.long, device=drafts["bfloat16"].runner.device)
    fns = {}
    for dt, d in drafts.items():
        r = d.runner
        print(dt, r.dtype, r.cache.k.dtype, tuple(r.cache.k.shape), r.decode_path, getattr(r.decode, "programs", None), getattr(r.decode, "fold", None), flush=True)
        if dt.endswith("_old") and r.device.type == "cuda":       # captured with the kernel before _widen
            saved, D._decode_attention = D._decode_attention, old._decode_attention
            try:
                r.warm_chain(d.head.head, 1, k)
            finally:
                D._decode_attention = saved
        fns[dt] = M.instance_block(r, r.decode, d.head.head, x, pos, k)
    raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
    row = {"cache": drafts["bfloat16"].runner.cache.k.shape[3], "position": pos,
           "per_token_ms": {dt: {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")} for dt, ms in raw.items()}}
    out["cases"].append(row)
    print(f"cache {row['cache']} pos {pos} ({time.time() - t0:.0f}s) " + "  ".join(
        f"{dt} mean {t['mean_ms']:.4f} p50 {t['p50_ms']:.4f} p95 {t['p95_ms']:.4f}" for dt, t in row["per_token_ms"].items()), flush=True)
    del drafts, fns
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "dtype_ab.json"), "w"), indent=1)
