"""Device-only (issue 25, fourth pass, last call): what each dependent stage of a layer costs in the pipelined body.
Bodies with the attention kernel left out (4 stages a layer), with attention and the o-projection left out (3), and
the same without weight reads (the chain alone); the full body beside them. Outputs are wrong by design (timing
only). Runner.chain, k=6, position 300, cache 340, h100 draft, body alone. Writes $OUT/body5.json."""
import importlib, json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "devtmp"))
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.engine.runner import Runner, Acceleration
from lib.engine import decode
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
src = open("lib/engine/decode.py").read().replace("from .kernels import", "from lib.engine.kernels import")
open("devtmp/_decode_nw5.py", "w").write(src.replace("mask=ok, other=0.0)", "mask=ok & (rows < 0)[:, None], other=0.0)"))
nw = importlib.import_module("_decode_nw5")


def staged(base, stages):
    class Staged(base.FusedDecode):
        def _step(self, ids, start):
            r = self.runner
            torch.index_select(r.body.embed_tokens.weight, 0, ids[0], out=self.x.view(1, -1))
            for i, layer in enumerate(r.layers):
                att, mlp = layer.self_attn, layer.mlp
                self._gemv(self.x, layer.input_layernorm.weight, r.fused[i]["qkv"], self.qkv, "qkv")
                if "attention" in stages:
                    self._attention(att, r.cache.layer(i), start)
                if "o" in stages:
                    self._gemv(self.attn, None, att.o_proj.weight, self.x, "o")
                self._gemv(self.x, layer.post_attention_layernorm.weight, r.fused[i]["gate_up"], self.act, "gate_up")
                self._gemv(self.act, None, mlp.down_proj.weight, self.x, "down")
            D = self.x.numel()
            base._decode_norm[(1,)](self.x, r.body.norm.weight, self.out, self.eps, D, base.triton.next_power_of_2(D),
                                    self.pdl, **self.opts)
            return self.out
    return Staged


_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("built", round(time.time() - t0, 1), r.decode_path, flush=True)
full, four, three = ("attention", "o"), ("o",), ()
bodies = {"5 stages": staged(decode, full)(r), "4 stages (no attention)": staged(decode, four)(r),
          "3 stages (no attention, no o)": staged(decode, three)(r),
          "5 stages, no weights": staged(nw, full)(r), "4 stages, no weights": staged(nw, four)(r),
          "3 stages, no weights": staged(nw, three)(r)}
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
x = prompt[:, -1:]
const = x.view(1).clone()
r.prefill(prompt)
fns = {}
for bname, v in bodies.items():
    r.decode = v
    pick = (lambda c: (lambda hh: c))(const)
    r.warm_chain(pick, 1, k)
    fns[bname] = (lambda pick=pick: r.chain(pick, x, pos, k))
raw = bench.interleaved(fns, 20, 200, dev)
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "L": L, "block": {}}
for n, ms in raw.items():
    res["block"][n] = s = bench.stats(ms)
    print("%-32s per token p50 %.4f mean %.4f p95 %.4f" % (n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k),
          flush=True)
json.dump(res, open(f"{OUT}/body5.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
