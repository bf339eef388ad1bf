"""Device (issue 25, thirteenth session): L2 bulk prefetch from chosen kernels of the fused draft step (decode.py's
`prefetch`: kernel -> weights of its layer), a K-block (Runner.chain, one graph replay, head included) per token,
dense and FlashHead drafts of PROFILE, interleaved. Tokens and hidden states compared with no prefetch.
Usage: python3 devtmp/pf_bench.py [PROFILE] [POS...]; writes $OUT/pf_bench.json."""
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
print("built", round(time.time() - t0), drafts[modes.DENSE].runner.decode_path, flush=True)
VARIANTS = {"none": {}, "att:gu": {"attention": ("gate_up",)}, "att:gu+down": {"attention": ("gate_up", "down")},
            "att:gu,o:down": {"attention": ("gate_up",), "o": ("down",)},
            "qkv:gu,att:down": {"qkv": ("gate_up",), "attention": ("down",)},
            "att:gu+down,o:nextqkv": {"attention": ("gate_up", "down"), "o": ("next_qkv",)}}
prompt = common.encoded_prompts(P)[0][1]
k = P.decode.k
res = {"device": bench.device_name(dev), "k": k, "profile": P.name, "variants": {n: {a: list(b) for a, b in v.items()}
                                                                                   for n, v in VARIANTS.items()}}
for pos in [int(a) or len(prompt) for a in sys.argv[2:]] or [len(prompt)]:
    fns, outs = {}, {}
    x = torch.tensor([[prompt[-1]]], device=dev)
    for name, d in drafts.items():
        r = d.runner
        r.prefill(torch.tensor([(prompt * 8)[:pos]], device=dev))
        installed = r.decode
        for v, cfg in VARIANTS.items():
            r.decode = decode.FusedDecode(r, prefetch=cfg)
            pick = (lambda f: (lambda h: f(h)))(d.head.head)          # its own graph
            r.graphs and r.warm_chain(pick, 1, k)
            h = r.decode(x, torch.tensor(pos, device=dev)).clone()
            outs[f"{name}/{v}"] = (r.chain(pick, x, pos, k).clone(), h)
            fns[f"{name}/{v}"] = (lambda r=r, pick=pick: r.chain(pick, x, pos, k))
        r.decode = installed
    same = {n: bool(torch.equal(o[0], outs[n.split("/")[0] + "/none"][0]) and
                    torch.equal(o[1], outs[n.split("/")[0] + "/none"][1])) for n, o in outs.items()}
    raw = bench.interleaved(fns, 20, 300, dev)
    row = res[f"pos{pos}"] = {"equal": same}
    for n, ms in raw.items():
        row[n] = s = bench.stats(ms)
        print("pos %4d %-28s per token p50 %.4f mean %.4f p95 %.4f equal %s" % (
            pos, n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k, same[n]), flush=True)
json.dump(res, open(f"{OUT}/pf_bench.json", "w"), indent=1)
print("done", round(time.time() - t0), flush=True)
