"""Is the smollm2_gpu target call's isolated time (notebook 03: 1.09 ms, GPU idle at each launch) longer than the
same graph replay queued behind other work (the rounds: 0.96-1.03 ms a call)? Three timings of the same calls,
interleaved: (a) as bench.time_calls (sync, event, replay, event); (b) the replay queued behind a ~1 ms busy kernel
(torch.cuda._sleep) so its launch is hidden; (c) 20 replays back to back between two events (per call)."""
import sys
import torch
from lib import bench
from lib.config import load_profile
from lib.models import build as engines
from lib.study.common import encoded_prompts
from lib.study.microbench import target_calls

profile = load_profile(sys.argv[1] if len(sys.argv) > 1 else "smollm2_gpu")
runner = engines.build_target(profile).runner
dev = runner.device
prompt = encoded_prompts(profile)[0][1]
fns = target_calls(runner, prompt, [1, 5, 7])
s = torch.cuda.current_stream(dev)


def timed(fn, busy):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(2_000_000)                      # ~1 ms of a busy GPU at ~2 GHz
    a.record(s)
    fn()
    b.record(s)
    b.synchronize()
    return a.elapsed_time(b)


def burst(fn, n=20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000)
    a.record(s)
    for _ in range(n):
        fn()
    b.record(s)
    b.synchronize()
    return a.elapsed_time(b) / n


for fn in fns.values():
    for _ in range(5):
        fn()
res = {(n, m): [] for n in fns for m in ("isolated", "queued", "burst")}
for i in range(40):
    for n, fn in (fns.items() if i % 2 == 0 else list(fns.items())[::-1]):
        res[n, "isolated"].append(timed(fn, False))
        res[n, "queued"].append(timed(fn, True))
        res[n, "burst"].append(burst(fn))
for (n, m), v in res.items():
    st = bench.stats(v)
    print(f"call of {n}: {m:9s} mean {st['mean_ms']:.4f} p50 {st['p50_ms']:.4f} p95 {st['p95_ms']:.4f} ms")
