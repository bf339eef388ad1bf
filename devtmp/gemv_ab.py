"""Device (thirty-third session): the draft's K-token block with kernels._widen in the GEMVs and heads (lib) against
HEAD's 522fe44 plain conversion (devtmp/oldsrc/lib_old), same profile, dtypes fp16 and bf16, interleaved in one
process; bitwise check of the fused step's output and of the heads' tokens between the two. Args: PROFILE size:pos..."""
import json, os, sys, time, faulthandler
faulthandler.dump_traceback_later(500, repeat=True)
sys.path.insert(0, "."); sys.path.insert(0, "devtmp/oldsrc")
from dataclasses import replace
import torch
import lib_old
from lib import bench, modes
from lib.study import common, microbench as M
from lib.models import build
from lib_old.models import build as build_old
from lib_old.study import microbench as M_old

P = common.setup(sys.argv[1])
from lib.models import flash_checkpoint
cases = [(int(a.split(":")[0]), int(a.split(":")[1])) for a in sys.argv[2:]] or [(0, 38), (0, 300)]
dtypes = os.environ.get("DTYPES", "float16,bfloat16").split(",")
k = P.decode.k
out = {"k": k, "device": torch.cuda.get_device_name(), "cases": []}
t0 = time.time()
for size, pos in cases:
    at = replace(P, decode=replace(P.decode, max_prompt_tokens=size)) if size else P
    drafts = {}
    for dt in dtypes:                      # a dtype's synthetic checkpoints apart (a dtype change remakes them)
        os.environ["STUDY_MODELS"] = f"/tmp/models_{dt}"
        flash_checkpoint.ensure_flash_checkpoint(replace(at, dtype=dt))
        for tag, b in (("new", build), ("old", build_old)):
            for mode, d in b.build_drafts(replace(at, dtype=dt), [modes.DENSE, modes.FLASH]).items():
                drafts[f"{dt}_{mode}_{tag}"] = d
    x = torch.zeros((1, 1), dtype=torch.long, device="cuda")
    fns, same = {}, {}
    for name, d in drafts.items():
        r = d.runner
        print(name, r.dtype, tuple(r.cache.k.shape), r.decode_path, flush=True)
        fns[name] = (M if name.endswith("new") else M_old).instance_block(r, r.decode, d.head.head, x, pos, k)
    for name in [n for n in drafts if n.endswith("new")]:
        a, b = drafts[name], drafts[name[:-3] + "old"]
        ha = a.runner.forward(x, pos)[:, -1].clone()
        hb = b.runner.forward(x, pos)[:, -1].clone()
        same[name[:-4]] = {"hidden_bitwise": bool(torch.equal(ha, hb)),
                           "token": [int(a.head(ha)), int(b.head(hb))]}
        g = torch.Generator(device="cuda").manual_seed(3)
        hs = torch.randn(64, ha.shape[-1], device="cuda", generator=g).to(ha.dtype)
        same[name[:-4]]["tokens_64_equal"] = all(int(a.head(hs[i:i + 1])) == int(b.head(hs[i:i + 1])) for i in range(64))
    print(json.dumps(same), flush=True)
    raw = bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), x.device)
    row = {"cache": drafts[next(iter(drafts))].runner.cache.k.shape[3], "position": pos, "same": same,
           "per_token_ms": {n: {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")} for n, ms in raw.items()}}
    out["cases"].append(row)
    print(f"cache {row['cache']} pos {pos} ({time.time() - t0:.0f}s)", flush=True)
    for n, t in row["per_token_ms"].items():
        print(f"  {n:28s} mean {t['mean_ms']:.4f} p50 {t['p50_ms']:.4f} p95 {t['p95_ms']:.4f}", flush=True)
    del drafts, fns
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "gemv_ab.json"), "w"), indent=1)
