"""Device-only (issue 25): the h100 draft's proposal block (Runner.chain, k=6, one graph replay) with the dense and
FlashHead heads, their kernels with and without programmatic dependent launch, FlashHead's launch-1 settings, and
the body alone (a constant pick); then the attention kernel at 1/2/4 warps and 16/32/64 positions a split.
Writes $OUT/step25.json."""
import json, os, sys, time
import torch
sys.path.insert(0, os.getcwd())
from lib import bench
from lib.config import load_profile
from lib.models.synthetic import make_pair
from lib.models.clustering import spherical_kmeans, centroids_of, unit
from lib.engine.runner import Runner, Acceleration, capture
from lib.engine import decode, kernels as K
from lib.engine.heads import FlashHead, DenseHead, exact_fp32, probe_states
OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
t0 = time.time()
_, model = make_pair(load_profile("h100").models.synthetic, 0, "bfloat16", "cuda", which=("draft",))
W = model.get_output_embeddings().weight
assign = spherical_kmeans(W, 9496, 3, progress=False)
cents = centroids_of(unit(W.float()), assign, 9496).to(W.dtype)
fh = FlashHead(W, cents, assign, 16, kernel="triton")
dh = DenseHead(W, "triton")
print("heads built", round(time.time() - t0, 1), fh.kernel_ran, dh.kernel_ran, flush=True)
special = torch.full_like(fh.c2t[0], -1)
c2t_ext = torch.cat([fh.c2t, special[None]]).contiguous()
probe = probe_states(W)
want = exact_fp32(fh, probe)
L, pos, k = 340, 300, 6
r = Runner(model, L, Acceleration(graphs=True, fused=True))
print("decode path", r.decode_path, flush=True)
prompt = torch.arange(1, pos + 1, device=dev)[None] * 37 % 150000
r.prefill(prompt)
x = prompt[:, -1:]
res = {"device": bench.device_name(dev), "k": k, "pos": pos, "decode_path": r.decode_path, "checks": {}, "block": {},
       "attention": {}}
const = x.view(1).clone()
picks = {"body_only": lambda h: const}
for pdl in (True, False):
    tag = "pdl" if pdl else "nopdl"
    picks[f"dense_{tag}"] = lambda h, pdl=pdl: K.dense_greedy_triton(h.contiguous(), W, pdl=pdl)
    for R, wp in ((16, 8), (32, 8), (16, 4), (64, 8)) if pdl else ((16, 8),):
        picks[f"flash_R{R}w{wp}_{tag}"] = lambda h, R=R, wp=wp, pdl=pdl: K.flash_greedy_triton(
            h.contiguous(), W, cents, c2t_ext, 16, R=R, warps=wp, pdl=pdl)
for name, fn in picks.items():                                 # each pick against the exact reference
    if name != "body_only":
        got = torch.stack([fn(probe[i:i + 1]).view(()) for i in range(probe.shape[0])])
        ref = want if name.startswith("flash") else (probe.float() @ W.float().T).argmax(-1)
        res["checks"][name] = int((got == ref).sum()), probe.shape[0]
print("checks", res["checks"], flush=True)
outs = {}
for name, fn in picks.items():
    r.warm_chain(fn, 1, k)
    outs[name] = r.chain(fn, x, pos, k).clone()
res["same_tokens"] = {n: bool(torch.equal(o, outs["dense_nopdl"])) for n, o in outs.items() if n != "body_only"}
print("same tokens as dense_nopdl", res["same_tokens"], flush=True)
raw = bench.interleaved({n: (lambda fn=fn: r.chain(fn, x, pos, k)) for n, fn in picks.items()}, 20, 200, dev)
for n, ms in raw.items():
    res["block"][n] = bench.stats(ms)
    print("block %-22s p50 %.4f ms  per step %.4f" % (n, res["block"][n]["p50_ms"], res["block"][n]["p50_ms"] / k),
          flush=True)
body = res["block"]["body_only"]["p50_ms"]
res["head_added_per_step_ms"] = {n: (v["p50_ms"] - body) / k for n, v in res["block"].items()}
json.dump(res, open(f"{OUT}/step25.json", "w"), indent=1)
# The attention kernel's launch settings: the step alone (graph of one body step) and 28 attention launches.
st = torch.tensor(pos, device=dev)
graphs = {}
for aw, split in [(2, 32), (1, 32), (4, 32), (1, 16), (2, 16), (4, 16), (2, 64), (4, 64)]:
    v = decode.FusedDecode(r, split=split, attention_warps=aw)
    name = f"aw{aw}_S{split}"
    why = decode.check(r, v)
    r.prefill(prompt)
    res["attention"][name] = {"check": why or "ok"}
    graphs[name], _ = capture(lambda v=v: v(x, st))
    def a(v=v):
        for i, layer in enumerate(r.layers):
            v._attention(layer.self_attn, r.cache.layer(i), st)
    graphs[name + "/attention_x28"], _ = capture(a)
raw = bench.interleaved({n: (lambda g=g: g.replay()) for n, g in graphs.items()}, 20, 200, dev)
for n, ms in raw.items():
    res["attention"].setdefault(n, {})["step"] = bench.stats(ms)
    print("%-26s p50 %.4f ms" % (n, res["attention"][n]["step"]["p50_ms"]), res["attention"][n].get("check", ""),
          flush=True)
json.dump(res, open(f"{OUT}/step25.json", "w"), indent=1)
print("done", round(time.time() - t0, 1))
