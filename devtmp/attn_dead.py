"""Device (issue 25, twenty-first session): attention programs of splits past the new position exit at once (no wait,
no count; the last of the live splits combines) against the library's (every split waits and counts). Body step
(graphed) interleaved at two positions, outputs against the default's; then the K = 6 block (heads included).
Usage: python3 devtmp/attn_dead.py [profile]."""
import json, os, sys
import torch, triton, triton.language as tl
sys.path.insert(0, ".")
from lib import bench, modes
from lib.study import common, microbench as M
from lib.engine import decode as D
from lib.engine.kernels import _combine_splits, _launch_next, _qkv_heads, _wait


@triton.jit
def _attention_live(qkv_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, part_ptr, ml_ptr,
                    count_ptr, out_ptr, eps, scale, HQ: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                    HD: tl.constexpr, S: tl.constexpr, NS: tl.constexpr, NSP: tl.constexpr, L,
                    NORM: tl.constexpr, PDL: tl.constexpr, ROW: tl.constexpr, DEADWAIT: tl.constexpr = False):
    _launch_next(PDL)
    a, s = tl.program_id(0), tl.program_id(1)
    pos = tl.load(pos_ptr) + ROW
    if DEADWAIT:
        if s * S > pos:                                           # dead (and padding) programs hold their slot
            _wait(PDL)
    if s * S <= pos:                                              # dead splits: nothing, not even the wait
        h = a * GP // G
        d = tl.arange(0, HD)
        rot = (d + HD // 2) % HD
        cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
        sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
        qn, qn_rot = tl.load(qn_ptr + d), tl.load(qn_ptr + rot)
        kn, kn_rot = tl.load(kn_ptr + d), tl.load(kn_ptr + rot)
        cache = h.to(tl.int64) * L * HD
        p = s * S + tl.arange(0, S)
        old = (p < pos)[:, None]
        if ROW == 0:
            kt = tl.load(kc_ptr + cache + p[:, None] * HD + d[None, :], mask=old, other=0.0).to(tl.float32)
            vt = tl.load(vc_ptr + cache + p[:, None] * HD + d[None, :], mask=old, other=0.0).to(tl.float32)
        _wait(PDL)
        if ROW == 1:
            kt = tl.load(kc_ptr + cache + p[:, None] * HD + d[None, :], mask=old, other=0.0).to(tl.float32)
            vt = tl.load(vc_ptr + cache + p[:, None] * HD + d[None, :], mask=old, other=0.0).to(tl.float32)
        k, v, q = _qkv_heads(qkv_ptr, (HQ + h) * HD, (HQ + HQ // G + h) * HD, a * GP * HD, kn, kn_rot, qn, qn_rot,
                             cos, sin, eps, HD, NORM)
        if ((a * GP) % G == 0) & (pos < s * S + S):
            tl.store(kc_ptr + cache + pos * HD + d, k)
            tl.store(vc_ptr + cache + pos * HD + d, v)
        ok, here = p <= pos, pos < s * S + S
        for j in tl.static_range(GP):
            qh = a * GP + j
            if j > 0:
                _, _, q = _qkv_heads(qkv_ptr, qh * HD, qh * HD, qh * HD, kn, kn_rot, qn, qn_rot, cos, sin, eps, HD,
                                     NORM)
            qf = q.to(tl.float32)
            sn = tl.sum(k.to(tl.float32) * qf, 0) * scale
            sc = tl.where(p == pos, sn, tl.sum(kt * qf[None, :], 1) * scale)
            sc = tl.where(ok, sc, -float("inf"))
            m = tl.max(sc, 0)
            e = tl.where(ok, tl.exp(sc - m), 0.0)
            acc = tl.sum(e[:, None] * vt, 0) + tl.where(here, tl.exp(sn - m), 0.0) * v.to(tl.float32)
            tl.store(ml_ptr + (qh * NS + s) * 2, m)
            tl.store(ml_ptr + (qh * NS + s) * 2 + 1, tl.sum(e, 0))
            tl.store(part_ptr + (qh * NS + s) * HD + d, acc)
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + a, 1) == pos // S:          # pos // S + 1 live splits
            tl.store(count_ptr + a, 0)
            sp = tl.arange(0, NSP)
            live = (sp < NS) & (sp * S <= pos)
            for j in tl.static_range(GP):
                qh = a * GP + j
                o = _combine_splits(ml_ptr, part_ptr, qh * NS + sp, live, d)
                tl.store(out_ptr + qh * HD + d, o.to(out_ptr.dtype.element_ty))


class Live(D.FusedDecode):
    """deadwait: dead splits wait (hold their slot until q/k/v ends) but do not count; pad: extra such programs."""

    def __init__(self, runner, deadwait=False, pad=0, **kw):
        super().__init__(runner, **kw)
        self.deadwait, self.pad = deadwait, pad

    def _attention(self, att, kv, start, t):
        r, (k_cache, v_cache) = self.runner, kv
        qn, kn = (att.q_norm.weight, att.k_norm.weight) if self.qk_norm else (self.x, self.x)
        _attention_live[(self.hq // self.heads, self.ns + self.pad)](
            self.qkv[t], qn, kn, r.cos, r.sin, k_cache, v_cache, start, self.part, self.ml, self.count, self.attn[t],
            self.eps, self.hd ** -0.5, self.hq, self.hq // self.hkv, self.heads, self.hd, self.split, self.ns,
            triton.next_power_of_2(self.ns), k_cache.shape[2], self.qk_norm, self.pdl, t, self.deadwait, **self.attention_opts)


def main():
    P = common.setup(sys.argv[1] if len(sys.argv) > 1 else "h100")
    drafts, x, pos = M.step_drafts(P)
    runner, dev = drafts[modes.DENSE].runner, x.device
    res = {"device": torch.cuda.get_device_name(dev), "profile": P.name, "cache_len": runner.cache.k.shape[3]}
    for at in (pos, 250):                                             # body step at two positions (cache beyond: prompt's)
        start = torch.tensor(at, device=dev)
        steps = {"default": D.FusedDecode(runner), "live": Live(runner), "default_b": D.FusedDecode(runner),
                 "live_b": Live(runner)} if os.environ.get("THROTTLE") is None else {
                 "default": D.FusedDecode(runner), "waitdead": Live(runner, True), "pad22": Live(runner, True, 22),
                 "pad66": Live(runner, True, 66), "default_b": D.FusedDecode(runner), "waitdead_b": Live(runner, True),
                 "pad200": Live(runner, True, 200)}
        ref = steps["default"](x, start).clone()
        fns = {}
        for name, st in steps.items():
            out = st(x, start)
            two = st(torch.cat([x, x], 1), start).clone()
            res[f"{name}@{at}"] = {"equal": bool(torch.equal(out, ref)), "two_equal": bool(torch.equal(two[:, :1], ref))}
            g, _ = bench.capture(lambda st=st, start=start: st(x, start))
            fns[name] = g.replay
        for name, ms in bench.interleaved(fns, 20, 300, dev).items():
            res[f"{name}@{at}"].update(bench.stats(ms))
            print(f"body {name}@{at}", "mean %.4f p50 %.4f ms" % (res[f"{name}@{at}"]["mean_ms"], res[f"{name}@{at}"]["p50_ms"]),
                  "equal", res[f"{name}@{at}"]["equal"], res[f"{name}@{at}"]["two_equal"], flush=True)
    if os.environ.get("THROTTLE"):
        json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "attn_throttle.json"), "w"), indent=1)
        return
    k = P.decode.k
    fns = {}
    for name in (modes.DENSE, modes.FLASH):
        d = drafts[name]
        for label, cls in (("default", D.FusedDecode), ("live", Live)):
            for i in range(2):
                fns[f"{name}/{label}#{i}"] = M.instance_block(d.runner, cls(d.runner), d.head.head, x, pos, k)
    for key, ms in bench.interleaved(fns, P.bench.warmup, max(10, P.bench.iters // 4), dev).items():
        res["block " + key] = {m: v / k for m, v in bench.stats(ms).items() if m.endswith("_ms")}
        print("block", key, "ms a token: mean %.4f p50 %.4f" % (res["block " + key]["mean_ms"], res["block " + key]["p50_ms"]), flush=True)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "attn_dead.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
