"""Device (issue 25, fourteenth session): the cluster q/k/v+attention CUDA kernel (lib/engine/qkv_attention.cu) in
the fused draft step against the two Triton kernels: check against the reference path, then a K-block (Runner.chain,
one graph replay, head included) per token, dense and FlashHead drafts, three instances a variant, interleaved.
Usage: python3 devtmp/cl_bench.py [PROFILE] [POS...]; writes $OUT/cl_bench.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench, modes
from lib.study import common
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine import decode, cluster_step
from pathlib import Path
# QA_SOURCES="v3=devtmp/cl/qkv_attention_v3.cu,v5=devtmp/cl/qkv_attention_v5.cu": each a variant, beside the Triton pair
SOURCES = dict(kv.split("=") for kv in os.environ.get("QA_SOURCES", "").split(",") if kv) or {"c16": None}
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
t0 = time.time()
ensure_flash_checkpoint(P)
drafts = engines.build_drafts(P, (modes.DENSE, modes.FLASH))
dev = drafts[modes.DENSE].runner.device
r0 = drafts[modes.DENSE].runner
path, checked = getattr(r0.decode, "cluster_path", None), getattr(r0.decode, "checked", None)
print("built", round(time.time() - t0), r0.decode_path, path, checked, flush=True)
res = {"device": bench.device_name(dev), "profile": P.name, "decode_path": r0.decode_path, "cluster_path": path,
       "checked": checked}
def fused(r, cluster, source):
    if source:
        cluster_step.SOURCE = Path(source)
    return decode.FusedDecode(r, cluster=cluster)
VARIANTS = {f"{n}#{i}": dict(cluster=c, source=src) for i in range(3)
            for n, c, src in [("triton", 0, None)] + [(n, 16, src) for n, src in SOURCES.items()]}
for n, cfg in VARIANTS.items():
    if n.endswith("#0"):
        st = fused(r0, **cfg)
        why = decode.check(r0, st)
        print(n, st.cluster_path, "check:", why or "ok", st.checked, flush=True)
        res[f"check_{n}"] = dict(why=why, path=st.cluster_path, **st.checked)
prompt = common.encoded_prompts(P)[0][1]
k = P.decode.k
res["k"], res["variants"] = k, VARIANTS
for pos in [int(a) or len(prompt) for a in sys.argv[2:]] or [len(prompt)]:
    fns, outs = {}, {}
    x = torch.tensor([[prompt[-1]]], device=dev)
    for name, d in drafts.items():
        r = d.runner
        r.prefill(torch.tensor([(prompt * 8)[:pos]], device=dev))
        installed = r.decode
        for v, cfg in VARIANTS.items():
            r.decode = fused(r, **cfg)
            pick = (lambda f: (lambda h: f(h)))(d.head.head)          # its own graph
            r.graphs and r.warm_chain(pick, 1, k)
            h = r.decode(x, torch.tensor(pos, device=dev)).clone()
            outs[f"{name}/{v}"] = (r.chain(pick, x, pos, k).clone(), h)
            fns[f"{name}/{v}"] = (lambda r=r, pick=pick: r.chain(pick, x, pos, k))
        r.decode = installed
    ref = lambda n: outs[n.split("/")[0] + "/triton#0"]
    same = {n: dict(tokens=bool(torch.equal(o[0], ref(n)[0])),
                    hidden_max_diff=(o[1].float() - ref(n)[1].float()).abs().max().item()) for n, o in outs.items()}
    raw = bench.interleaved(fns, 20, 200, dev)
    row = res[f"pos{pos}"] = {"equal": same}
    for n, ms in raw.items():
        row[n] = s = bench.stats(ms)
        print("pos %4d %-22s per token p50 %.4f mean %.4f p95 %.4f %s" % (
            pos, n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k, same[n]), flush=True)
json.dump(res, open(f"{OUT}/cl_bench.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
