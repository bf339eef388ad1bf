"""Device (issue 25, twentieth session): the fused draft step's chain, kernel by kernel. decode.py's GEMV and
attention kernels with three globaltimer stamps a program (entry, after its PDL wait, end) and a graph of one body
step of the dense draft (as Runner.chain replays it). For each launch i after the first: release = median wait
end - the last end of launch i-1; post = launch i's last end - its median wait end; period = its last end - the last
end of i-1 (= release + post). By kernel kind, mean over the layers and replays. Writes $OUT/draft_timeline.json.
Usage: python3 devtmp/draft_timeline.py [profile] (default h100)."""
import json, linecache, os, statistics, sys
import torch, triton
sys.path.insert(0, ".")
from lib import modes
from lib.study import common
from lib.models import build, checkpoints
from lib.engine import decode as D

src = open(D.__file__).read()


def traced(name, nxt, pid):
    k = src[src.index(f"@triton.jit\ndef {name}("):src.index(f"@triton.jit\ndef {nxt}")]
    k = k.replace(f"def {name}(x_ptr" if "gemv" in name else f"def {name}(qkv_ptr",
                  f"def {name}_t(trace_ptr, x_ptr" if "gemv" in name else f"def {name}_t(trace_ptr, qkv_ptr", 1)
    k = k.replace("    _launch_next(PDL)\n", "    t0 = tl.extra.cuda.globaltimer()\n    _launch_next(PDL)\n", 1)
    i = k.index("    _wait(PDL)")
    j = k.index("\n", i)
    k = k[:j + 1] + "    t1 = tl.extra.cuda.globaltimer()\n" + k[j + 1:]
    k = k.rstrip() + "\n" + (f"    t2 = tl.extra.cuda.globaltimer()\n    pid = {pid}\n"
                             "    tl.store(trace_ptr + pid * 4, t0)\n    tl.store(trace_ptr + pid * 4 + 1, t1)\n"
                             "    tl.store(trace_ptr + pid * 4 + 2, t2)\n"
                             "    tl.store(trace_ptr + pid * 4 + 3, tl.extra.cuda.smid().to(tl.int64))\n")
    ns = dict(vars(D))
    fname = f"<{name}_t>"
    code = "import triton.language.extra.cuda\n" + k
    linecache.cache[fname] = (len(code), None, code.splitlines(True), fname)
    exec(compile(code, fname, "exec"), ns)
    return ns[f"{name}_t"]


GEMV = traced("_decode_gemv", "_gemv_input", "tl.program_id(0)")
ATT = traced("_decode_attention", "_decode_norm", "tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)")
MAXP = 4096


class Traced(D.FusedDecode):
    """FusedDecode whose GEMVs and attentions write stamps: launch n at trace[n * MAXP * 4 ...]."""

    def begin(self, trace):
        self.trace, self.n, self.kinds = trace, 0, []

    def _slot(self, kind):
        self.kinds.append(kind)
        self.n += 1
        return self.trace[(self.n - 1) * MAXP * 4:]

    def _gemv(self, x, g, w, out, name, T, ids=None):
        norm, glu, residual = D.GEMVS[name]
        N, K = w.shape[0] // (2 if glu else 1), w.shape[1]
        bn = self.bn[name]
        assert triton.cdiv(N, bn) <= MAXP
        GEMV[(triton.cdiv(N, bn),)](self._slot(name), x, g if norm else x, w, out, x if ids is None else ids, self.x,
                                    self.eps, N, K, triton.next_power_of_2(K), bn, norm, glu, residual,
                                    ids is not None, self.pdl, T, name in self.late, **self.gemv_opts[name])

    def _attention(self, att, kv, start, t):
        r, (k_cache, v_cache) = self.runner, kv
        qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (self.x, self.x)
        assert self.hq // self.heads * self.ns <= MAXP
        ATT[(self.hq // self.heads, self.ns)](
            self._slot("attention"), self.qkv[t], qn, kn, r.cos, r.sin, k_cache, v_cache, start, self.part, self.ml,
            self.count, self.attn[t], self.eps, self.hd ** -0.5, self.hq, self.hq // self.hkv, self.heads, self.hd,
            self.split, self.ns, triton.next_power_of_2(self.ns), k_cache.shape[2], self.qk_norm, self.pdl, t,
            **self.attention_opts)


P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
checkpoints.ensure_synthetic(P)
draft = build.build_drafts(P, (modes.DENSE,))[modes.DENSE]
runner, dev = draft.runner, draft.runner.device
prompt = common.encoded_prompts(P)[0][1]
runner.prefill(torch.tensor([prompt], device=dev))
ids = torch.tensor([[prompt[-1]]], device=dev)
start = torch.tensor(len(prompt), device=dev)
step = Traced(runner)
trace = torch.zeros(200 * MAXP * 4, dtype=torch.int64, device=dev)
step.begin(trace)
step(ids, start)                                     # compile, and check it runs
torch.cuda.synchronize()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, stream=s):
    step.begin(trace)
    step(ids, start)
kinds, n = step.kinds, step.n
rows = {}
for rep in range(12):
    g.replay()
    torch.cuda.synchronize()
    if rep < 2:
        continue
    tr = trace[:n * MAXP * 4].view(n, MAXP, 4).cpu()
    launches = []
    for i in range(n):
        a = tr[i]
        a = a[a[:, 0] > 0].double()
        launches.append(a)
    for i in range(1, n):
        prev_end = launches[i - 1][:, 2].max().item()
        a = launches[i]
        wait_med = a[:, 1].median().item()
        r = rows.setdefault(kinds[i], {"release": [], "post": [], "period": [], "early": [], "programs": int(len(a))})
        r["release"].append((wait_med - prev_end) / 1e3)
        r["post"].append((a[:, 2].max().item() - wait_med) / 1e3)
        r["period"].append((a[:, 2].max().item() - prev_end) / 1e3)
        r["early"].append((a[:, 0].min().item() - prev_end) / 1e3)
    total = (launches[-1][:, 2].max().item() - launches[0][:, 0].min().item()) / 1e3
    rows.setdefault("_total", []).append(total)
out = {"device": torch.cuda.get_device_name(dev), "profile": P.name, "position": len(prompt), "launches": n,
       "step_us_first_entry_to_last_end": statistics.median(rows.pop("_total")), "kinds": {}}
for kind, r in rows.items():
    out["kinds"][kind] = {"programs": r["programs"], "count_a_step": kinds[1:].count(kind),
                          **{k: statistics.mean(v) for k, v in r.items() if k != "programs"}}
    print(kind, out["kinds"][kind], flush=True)
print("step (first entry to last end, us)", round(out["step_us_first_entry_to_last_end"], 1),
      "sum of periods", round(sum(v["period"] * v["count_a_step"] for v in out["kinds"].values()), 1))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "draft_timeline.json"), "w"), indent=1)
