"""Device (thirtieth session): the dense and FlashHead drafts' K-token block with the fused step before 1297fc1
(decode_old.py copied to lib/engine/decode_old.py: a program a split) against the new attention at 64 (the default)
and 32 programs a query head, 2 (the default) or 1 further split loaded at once; BLOCK_INSTANCES instances each, interleaved. Notebook 02's cache (its prompt's
position), and caches sized for positions 2,048 and 8,192. Usage: python3 devtmp/attn_ab.py [profile]"""
import json, os, sys, time, faulthandler
faulthandler.dump_traceback_later(300, repeat=True)
sys.path.insert(0, ".")
from dataclasses import replace
import torch
from lib import bench, modes
from lib.study import common, microbench as M
from lib.models import build
from lib.engine import decode as D, decode_old as O

P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
k = P.decode.k
out = {"k": k, "cases": []}
for size in [None if a == '0' else int(a) for a in sys.argv[2:]] or (None, 2048, 8192):
    if size is None:
        drafts, x, pos = M.step_drafts(P)
        drafts = {n: drafts[n] for n in (modes.DENSE, modes.FLASH)}
    else:
        at = replace(P, decode=replace(P.decode, max_prompt_tokens=size))
        drafts = build.build_drafts(at, [modes.DENSE])
        pos, x = size, torch.zeros((1, 1), dtype=torch.long, device=drafts[modes.DENSE].runner.device)
    fns = {}
    for name, d in drafts.items():
        for i in range(M.BLOCK_INSTANCES):
            for label, make in (("old", lambda: O.FusedDecode(d.runner)), ("default", lambda: D.FusedDecode(d.runner)),
                                ("P64f1", lambda: D.FusedDecode(d.runner, fold=1))):
                fns[f"{name}/{label}#{i}"] = M.instance_block(d.runner, make(), d.head.head, x, pos, k)
    raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
    row = {"cache": drafts[modes.DENSE].runner.cache.k.shape[3], "position": pos, "device": bench.device_name(x.device)}
    pooled = {}
    for key, ms in raw.items():
        pooled.setdefault(key.split("#")[0], []).extend(ms)
    for key, ms in pooled.items():
        row[key] = {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")}
        print(f"cache {row['cache']} pos {pos} {key:12s} ms a token: mean {row[key]['mean_ms']:.4f} "
              f"p50 {row[key]['p50_ms']:.4f} p95 {row[key]['p95_ms']:.4f}", flush=True)
    out["cases"].append(row)
    del drafts, fns
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "attn_ab.json"), "w"), indent=1)
