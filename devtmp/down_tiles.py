"""Device (issue 25, twentieth session): the draft's down projection streams its weights after its wait (timeline:
period 4.96 us against a 2.15 us floor; its programs become resident only as gate/up's leave). Variants of the GEMV
tiles by projection (rows a program, warps), the body step (one fused step, graphed) interleaved, p50 and mean;
outputs against the default's. Usage: python3 devtmp/down_tiles.py [profile]."""
import json, os, sys
import torch, triton
sys.path.insert(0, ".")
from lib import bench, modes
from lib.study import common
from lib.models import build, checkpoints
from lib.engine import decode as D
from lib.engine.kernels import launches


class Tiled(D.FusedDecode):
    """FusedDecode with rows a program and warps chosen per projection: tiles = {name: (rows, warps)}."""

    def __init__(self, runner, tiles):
        super().__init__(runner)
        self.tiles = tiles
        for name, t in tiles.items():
            self.bn[name] = t[0]

    def _gemv(self, x, g, w, out, name, T, ids=None):
        norm, glu, residual = D.GEMVS[name]
        N, K = w.shape[0] // (2 if glu else 1), w.shape[1]
        bn = self.bn[name]
        opts = launches(x.device, self.tiles[name][1])[1] if name in self.tiles else self.gemv_opts[name]
        if name in self.tiles and len(self.tiles[name]) > 2:                 # (rows, warps, maxnreg)
            opts = dict(opts, maxnreg=self.tiles[name][2])
        D._decode_gemv[(triton.cdiv(N, bn),)](x, g if norm else x, w, out, x if ids is None else ids, self.x, self.eps,
                                              N, K, triton.next_power_of_2(K), bn, norm, glu, residual,
                                              ids is not None, self.pdl, T, **opts)


P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
checkpoints.ensure_synthetic(P)
draft = build.build_drafts(P, (modes.DENSE,))[modes.DENSE]
runner, dev = draft.runner, draft.runner.device
prompt = common.encoded_prompts(P)[0][1]
runner.prefill(torch.tensor([prompt], device=dev))
ids = torch.tensor([[prompt[-1]]], device=dev)
start = torch.tensor(len(prompt), device=dev)
base = D.FusedDecode(runner)
print("default rows a program", base.bn, flush=True)
B2 = {"gate_up": (4, 2), "down": (2, 2)}
if os.environ.get("REGS"):   # next session (block AI): register caps, so that more kernels' programs are resident at once
    r = int(os.environ["REGS"])
    VARIANTS = {"default": {}, f"all{r}": {"qkv": (4, 1, r), "o": (2, 1, r), "gate_up": (4, 2, r), "down": (2, 2, r)},
                "default_b": {}, f"gu_down{r}": {"gate_up": (4, 2, r), "down": (2, 2, r)}}   # offline at 96: q/k/v
                # spills 84 loads/stores, o 20, gate/up 2 (ptxas's own choice: 121-128 registers, none)
VARIANTS = VARIANTS if os.environ.get("REGS") else {"default": {}, "best1": B2, "default_b": {},
            "best1+qkv8r2w": {**B2, "qkv": (8, 2)}, "best1+o4r2w": {**B2, "o": (4, 2)},
            "all2w": {**B2, "qkv": (8, 2), "o": (4, 2)}, "all4w": {"qkv": (16, 4), "o": (8, 4), "gate_up": (8, 4), "down": (4, 4)},
            "gu8r4w_down4r4w": {"gate_up": (8, 4), "down": (4, 4)}, "gu4r2w_down4r2w": {"gate_up": (4, 2), "down": (4, 2)},
            "gu8r2w_down2r2w": {"gate_up": (8, 2), "down": (2, 2)}, "best1_b": B2}
ref = base(ids, start).clone()
fns, res = {}, {"device": torch.cuda.get_device_name(dev), "profile": P.name, "position": len(prompt), "default_rows": base.bn}
for name, tiles in VARIANTS.items():
    step = Tiled(runner, tiles)
    out = step(ids, start)
    res[name] = {"tiles": tiles, "max_abs_diff": (out.float() - ref.float()).abs().max().item(), "equal": bool(torch.equal(out, ref))}
    g, _ = bench.capture(lambda step=step: step(ids, start))
    fns[name] = g.replay
times = bench.interleaved(fns, 20, 300, dev)
for name, ms in times.items():
    res[name].update(bench.stats(ms))
    print(name, res[name]["tiles"], "mean %.4f p50 %.4f ms" % (res[name]["mean_ms"], res[name]["p50_ms"]),
          "equal", res[name]["equal"], "diff %.1e" % res[name]["max_abs_diff"], flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "down_tiles.json"), "w"), indent=1)
