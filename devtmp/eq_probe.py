"""Device (twenty-third session): late_ab.py h100awq printed 'bitwise equal False' for the new default at position 38
(fp16 draft). Is it a NaN in the output, a config-dependent rounding, or a run-to-run difference? Eager calls of the
old (o1d2/) and new default steps, repeated, at a few positions, compared with the first old call."""
import os, sys, torch
sys.path.insert(0, ".")
sys.argv = sys.argv[:1] + ["h100awq"]
exec(open("devtmp/late_ab.py").read().split("VARIANTS =")[0])          # spec(), made()
from lib import modes
P = common.setup("h100awq")
drafts, x, pos = M.step_drafts(P)
runner = drafts[modes.DENSE].runner
dev = runner.device
print("dtype", runner.dtype, "prefill pos", pos, flush=True)
ids = torch.tensor([[7]], device=dev)
steps = {n: made(runner, n) for n in ["o1d2/", "o", "o1d2/", "o"]} if False else None
old = [made(runner, "o1d2/") for _ in range(2)]
new = [made(runner, "o") for _ in range(3)]
for at in [38, 39, 40, 100, 250]:
    start = torch.tensor(at, device=dev)
    ref = old[0](ids, start).clone()
    line = [f"@{at} nan {int(ref.isnan().sum())} inf {int(ref.isinf().sum())} amax {ref.float().abs().max().item():.3g}"]
    for rep in range(5):
        for name, group in (("old", old), ("new", new)):
            for i, st in enumerate(group):
                y = st(ids, start)
                if not torch.equal(y, ref):
                    d = (y.float() - ref.float()).abs()
                    line.append(f"{name}{i}r{rep}: {int((d > 0).sum())} differ, max {d.max().item():.3g}, nan {int(y.isnan().sum())}")
    print(" | ".join(line[:12]), flush=True)
