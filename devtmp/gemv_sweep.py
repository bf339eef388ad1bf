"""Device (issue 25, fourteenth session): the cluster q/k/v+attention CUDA kernel (lib/engine/qkv_attention.cu) in
the fused draft step against the two Triton kernels: check against the reference path, then a K-block (Runner.chain,
one graph replay, head included) per token, dense and FlashHead drafts, three instances a variant, interleaved.
Usage: python3 devtmp/cl_bench.py [PROFILE] [POS...]; writes $OUT/gemv_sweep.json."""
import json, os, sys, time
sys.path.insert(0, ".")
import torch
from lib import bench, modes
from lib.study import common
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine import decode
OUT = os.environ.get("OUT", "/tmp")
P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
t0 = time.time()
ensure_flash_checkpoint(P)
drafts = engines.build_drafts(P, (modes.DENSE, modes.FLASH))
dev = drafts[modes.DENSE].runner.device
r0 = drafts[modes.DENSE].runner
print("built", round(time.time() - t0), r0.decode_path, r0.decode.checked, flush=True)
res = {"device": bench.device_name(dev), "profile": P.name, "decode_path": r0.decode_path,
       "checked": r0.decode.checked}
for cs in ():
    st = decode.FusedDecode(r0, cluster=cs)
    why = decode.check(r0, st)
    print("cluster", cs, st.cluster_path, "check:", why or "ok", st.checked, flush=True)
    res[f"check{cs}"] = dict(why=why, path=st.cluster_path, **st.checked)
VARIANTS = {f"{n}#{i}": dict(tile_bytes=tb, warps=w) for i in range(2) for n, tb, w in (("t8w1", 8192, 1), ("t16w1", 16384, 1), ("t16w2", 16384, 2), ("t32w2", 32768, 2), ("t32w4", 32768, 4), ("t64w4", 65536, 4), ("t64w8", 65536, 8))}
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
            r.decode = decode.FusedDecode(r, **cfg)
            pick = (lambda f: (lambda h: f(h)))(d.head.head)          # its own graph
            r.graphs and r.warm_chain(pick, 1, k)
            h = r.decode(x, torch.tensor(pos, device=dev)).clone()
            outs[f"{name}/{v}"] = (r.chain(pick, x, pos, k).clone(), h)
            fns[f"{name}/{v}"] = (lambda r=r, pick=pick: r.chain(pick, x, pos, k))
        r.decode = installed
    ref = lambda n: outs[n.split("/")[0] + "/t8w1#0"]
    same = {n: dict(tokens=bool(torch.equal(o[0], ref(n)[0])),
                    hidden_max_diff=(o[1].float() - ref(n)[1].float()).abs().max().item()) for n, o in outs.items()}
    raw = bench.interleaved(fns, 20, 200, dev)
    row = res[f"pos{pos}"] = {"equal": same}
    for n, ms in raw.items():
        row[n] = s = bench.stats(ms)
        print("pos %4d %-22s per token p50 %.4f mean %.4f p95 %.4f %s" % (
            pos, n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k, same[n]), flush=True)
json.dump(res, open(f"{OUT}/gemv_sweep.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
