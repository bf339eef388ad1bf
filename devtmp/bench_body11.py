"""Device-only (issue 25, fifth pass): the embedding lookup folded into layer 0's q/k/v GEMV (no index_select kernel
between the head and the body; the heads' last kernels let the next one launch at once) against the step before
(index_select, then the GEMV). Dense and FlashHead h100 drafts, a round's K = 6 proposals with the real heads
(Runner.chain, one replay), interleaved on one GPU; the chains' tokens compared. Writes $OUT/body11.json."""
import json, os, sys, time
import torch, triton
sys.path.insert(0, os.getcwd())
from lib import bench, modes
from lib.study import common
from lib.study.common import encoded_prompts
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib.engine import decode
OUT = os.environ.get("OUT", "/tmp")
t0 = time.time()


class Lookup(decode.FusedDecode):
    """The step before: index_select into the residual stream, then layer 0's GEMV reading it."""
    def _step(self, ids, start):
        r = self.runner
        torch.index_select(r.body.embed_tokens.weight, 0, ids[0], out=self.x.view(1, -1))
        for i, layer in enumerate(r.layers):
            att, mlp = layer.self_attn, layer.mlp
            self._gemv(self.x, layer.input_layernorm.weight, r.fused[i]["qkv"], self.qkv, "qkv")
            self._attention(att, r.cache.layer(i), start)
            self._gemv(self.attn, None, att.o_proj.weight, self.x, "o")
            self._gemv(self.x, layer.post_attention_layernorm.weight, r.fused[i]["gate_up"], self.act, "gate_up")
            self._gemv(self.act, None, mlp.down_proj.weight, self.x, "down")
        D = self.x.numel()
        decode._decode_norm[(1,)](self.x, r.body.norm.weight, self.out, self.eps, D, triton.next_power_of_2(D),
                                  self.pdl, **self.opts)
        return self.out


P = common.setup("h100")
ensure_flash_checkpoint(P)
drafts = engines.build_drafts(P, (modes.DENSE, modes.FLASH))
dev = drafts[modes.DENSE].runner.device
print("built", round(time.time() - t0, 1), {k: d.runner.decode_path for k, d in drafts.items()}, flush=True)
prompt = encoded_prompts(P)[0][1]
x, pos, k = torch.tensor([[prompt[-1]]], device=dev), len(prompt), P.decode.k
fns, toks = {}, {}
for name, d in drafts.items():
    d.runner.prefill(torch.tensor([prompt], device=dev))
    variants = {"embed in GEMV": d.runner.decode, "index_select": Lookup(d.runner)}
    for vname, v in variants.items():
        d.runner.decode = v
        pick = (lambda f: (lambda hh: f(hh)))(d.head.head)                 # its own object: its own graph
        d.runner.warm_chain(pick, 1, k)
        toks[f"{name}, {vname}"] = d.runner.chain(pick, x, pos, k).clone()
        fns[f"{name}, {vname}"] = (lambda d=d, pick=pick: d.runner.chain(pick, x, pos, k))
same = {n: bool(torch.equal(toks[f"{n}, embed in GEMV"], toks[f"{n}, index_select"])) for n in drafts}
print("same tokens:", same, flush=True)
raw = bench.interleaved(fns, 20, 200, dev)
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "same_tokens": same, "block": {}}
for n, ms in raw.items():
    res["block"][n] = s = bench.stats(ms)
    print("%-28s per token p50 %.4f mean %.4f p95 %.4f" % (n, s["p50_ms"] / k, s["mean_ms"] / k, s["p95_ms"] / k),
          flush=True)
json.dump(res, open(f"{OUT}/body11.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
