"""Experiment (issue 25, thirty-ninth session): the draft step with no attention kernel. The q/k/v GEMV's last program
of each KV group to finish (an atomic count a group) does that group's attention: q/k norms, RoPE, the cache write and
single-query attention over every position in tiles of S (one program folds them in order), writing the attention
output that the o-projection reads. One token a call; the step's other kernels are the library's.
  check (CPU, TRITON_INTERPRET=1):  python3 devtmp/qkv_attn.py check
  A/B (GPU):                        python3 devtmp/qkv_attn.py ab [profile]   (AT=38,100,200 VARIANTS=4:64,4:32)
"""
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from lib.engine import decode as D  # noqa: E402
from lib.engine.decode_attention import _cache_tile, _fold, _split, _unit  # noqa: E402
from lib.engine.kernels import _launch_next, _qkv_heads, _wait, launches  # noqa: E402


@triton.jit
def _qkv_attention(x_ptr, g_ptr, w_ptr, qkv_ptr, ids_ptr, res_ptr, eps, N, K: tl.constexpr, BK: tl.constexpr,
                   BN: tl.constexpr, EMBED: tl.constexpr, PDL: tl.constexpr,
                   qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, count_ptr, out_ptr, scale,
                   HQ: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, S: tl.constexpr, L, QKNORM: tl.constexpr):
    _launch_next(PDL)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BK)
    ok = (rows < N)[:, None] & (cols < K)[None, :]
    w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=ok, other=0.0)
    g = tl.load(g_ptr + cols, mask=cols < K, other=0.0)
    d = tl.arange(0, HD)
    rot = (d + HD // 2) % HD
    pos = tl.load(pos_ptr)
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    qn, qn_rot = tl.load(qn_ptr + d), tl.load(qn_ptr + rot)
    kn, kn_rot = tl.load(kn_ptr + d), tl.load(kn_ptr + rot)
    _wait(PDL)
    x, res = D._gemv_input(x_ptr, ids_ptr, res_ptr, qkv_ptr, rows, cols, 0, N, K, False, EMBED)
    DT: tl.constexpr = qkv_ptr.dtype.element_ty
    tl.store(qkv_ptr + rows, D._gemv_output(x, res, w, w, g, eps, K, True, False, False, DT), mask=rows < N)
    HKV: tl.constexpr = HQ // G
    r0 = tl.program_id(0) * BN
    grp = tl.where(r0 < HQ * HD, r0 // HD // G,
                   tl.where(r0 < (HQ + HKV) * HD, (r0 - HQ * HD) // HD, (r0 - (HQ + HKV) * HD) // HD))
    PER: tl.constexpr = (G + 2) * HD // BN                        # programs a KV group
    tl.debug_barrier()                                            # our rows stored before we count ourselves
    if tl.atomic_add(count_ptr + grp, 1) == PER - 1:              # acq_rel: the last sees the group's rows
        tl.store(count_ptr + grp, 0)
        kc, vc = kc_ptr + grp.to(tl.int64) * L * HD, vc_ptr + grp.to(tl.int64) * L * HD
        p = tl.arange(0, S)
        for a in tl.static_range(G):
            head = grp * G + a
            k, v, q = _qkv_heads(qkv_ptr, (HQ + grp) * HD, (HQ + HKV + grp) * HD, head * HD, kn, kn_rot, qn,
                                 qn_rot, cos, sin, eps, HD, QKNORM)
            kt, vt = _cache_tile(kc, vc, p, pos, d, HD)
            if a == 0:                                            # after the first tile's reads (it masks pos)
                tl.store(kc + pos * HD + d, k)
                tl.store(vc + pos * HD + d, v)
            qf, vf = q.to(tl.float32), v.to(tl.float32)
            sn = tl.sum(k.to(tl.float32) * qf, 0) * scale
            qf = qf * _unit(kt)
            m, l, acc = _split(kt, vt, 0, pos, sn, qf, vf, scale, S)
            for b in range(S, pos + 1, S):
                k1, v1 = _cache_tile(kc, vc, b + p, pos, d, HD)
                m, l, acc = _fold(m, l, acc, k1, v1, b, pos, sn, qf, vf, scale, S)
            tl.store(out_ptr + head * HD + d, (acc / l).to(out_ptr.dtype.element_ty))


class NoAttentionKernel(D.FusedDecode):
    """FusedDecode whose one-token step runs _qkv_attention instead of the q/k/v GEMV and the attention kernel."""

    def __init__(self, runner, qa_warps: int = 4, qa_split: int = 64, **kw):
        super().__init__(runner, **kw)
        e = runner.layers[0].self_attn.o_proj.weight.element_size()
        D_ = runner.model.config.hidden_size
        self.qa_bn = min(D._rows(D_, D.TILE_BYTES * qa_warps, e), self.hd)
        self.qa_split, self.qa_opts = qa_split, launches(runner.device, qa_warps)[1]
        self.group_count = torch.zeros(self.hkv, dtype=torch.int32, device=runner.device)

    def _step(self, ids, start):
        if ids.shape[1] != 1:
            return super()._step(ids, start)
        r = self.runner
        for i, layer in enumerate(r.layers):
            att, mlp = layer.self_attn, layer.mlp
            x, first = (r.body.embed_tokens.weight, ids) if i == 0 else (self.x, None)
            w, (kc, vc) = r.fused[i]["qkv"], r.cache.layer(i)
            qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (self.x, self.x)
            N, K = w.shape
            _qkv_attention[(triton.cdiv(N, self.qa_bn),)](
                x, layer.input_layernorm.weight, w, self.qkv, x if first is None else first, self.x, self.eps, N, K,
                triton.next_power_of_2(K), self.qa_bn, first is not None, self.pdl,
                qn, kn, r.cos, r.sin, kc, vc, start, self.group_count, self.attn, self.hd ** -0.5, self.hq,
                self.hq // self.hkv, self.hd, self.qa_split, kc.shape[2], self.qk_norm, **self.qa_opts)
            self._gemv(self.attn, None, att.o_proj.weight, self.x, "o", 1)
            self._gemv(self.x, layer.post_attention_layernorm.weight, r.fused[i]["gate_up"], self.act, "gate_up", 1)
            self._gemv(self.act, None, mlp.down_proj.weight, self.x, "down", 1)
        Dm = self.x.shape[1]
        D._decode_norm[(1,)](self.x, r.body.norm.weight, self.out, self.eps, Dm, triton.next_power_of_2(Dm),
                             self.pdl, **self.opts)
        return self.out[:, :1]


def check():
    """fp32 on the CPU: the new step equals the library's fused step to fp32 rounding at every position."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from lib.engine.runner import Acceleration, Runner
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=True, initializer_range=0.3)
    model = Qwen3ForCausalLM(cfg).eval()
    LEN = 80
    ids = torch.randint(3, 200, (LEN,), generator=torch.Generator().manual_seed(1))
    for split in (16, 32):
        a, b = Runner(model, LEN, Acceleration(fused=True)), Runner(model, LEN, Acceleration(fused=True))
        assert a.decode_path == "fused"
        b.decode = NoAttentionKernel(b, qa_split=split)
        for r in (a, b):
            r.prefill(ids[None, :5])
        worst = 0.0
        for p in range(5, 60):
            x, y = a.forward(ids[None, p:p + 1], p), b.forward(ids[None, p:p + 1], p)
            worst = max(worst, ((x - y).abs().max() / x.abs().max()).item())
        cache = max((a.cache.k - b.cache.k).abs().max().item(), (a.cache.v - b.cache.v).abs().max().item())
        print(f"split {split}: worst relative difference {worst:.2e}, cache {cache:.2e}", flush=True)
        assert worst < 1e-5 and cache < 1e-5


def ab(profile: str):
    """One H200: the body step (one token, graphed) of the library against the new step, three instances each,
    interleaved, at positions AT; outputs compared with the library's (max relative difference)."""
    from lib import bench, modes
    from lib.study import common, microbench as M
    P = common.setup(profile)
    drafts, _, _ = M.step_drafts(P)
    runner = drafts[modes.DENSE].runner
    dev = runner.device
    print("device", bench.device_name(dev), flush=True)
    ids = torch.tensor([[7]], device=dev)
    variants = os.environ.get("VARIANTS", "4:64,4:32,1:16").split(",")
    for at in [int(a) for a in os.environ.get("AT", "38,100,200").split(",")]:
        start = torch.tensor(at, device=dev)
        steps = {f"library#{i}": D.FusedDecode(runner) for i in range(3)}
        for v in variants:
            w, s = (int(t) for t in v.split(":"))
            steps.update({f"{v}#{i}": NoAttentionKernel(runner, qa_warps=w, qa_split=s) for i in range(3)})
        ref = steps["library#0"](ids, start).clone()
        diff, graphs = {}, {}
        for name, st in steps.items():
            out = st(ids, start)
            diff[name] = ((out - ref).abs().max() / ref.abs().max()).item()
            torch.cuda.synchronize()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            graphs[name] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[name], stream=s):
                st(ids, start)
        times = {name: [] for name in steps}
        for rep in range(310):
            for name in (list(steps) if rep % 2 else list(steps)[::-1]):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graphs[name].replay()
                b.record()
                b.synchronize()
                if rep >= 10:
                    times[name].append(1e3 * a.elapsed_time(b))
        for v in ["library", *variants]:
            p50 = [statistics.median(times[f"{v}#{i}"]) for i in range(3)]
            mean = [statistics.mean(times[f"{v}#{i}"]) for i in range(3)]
            d = max(diff[f"{v}#{i}"] for i in range(3))
            print(f"body @{at} {v:8s} p50 us " + " ".join(f"{t:.1f}" for t in p50)
                  + f"  mean {statistics.mean(mean):.1f}  max rel diff vs library {d:.2e}", flush=True)


if __name__ == "__main__":
    check() if sys.argv[1] == "check" else ab(sys.argv[2] if len(sys.argv) > 2 else "h100")
