"""Device (forty-second session): where the first slow sampling samples of two_gpu_awq go. The sampling study's
first prompts (argv[2], default 4) with every mode, as lib/study/sampling.run does them, each sample watched: a
stack dump of every thread each second past 1.5 s (faulthandler), and per sample the CUDA graphs captured, dynamo
graphs compiled and the allocator's cudaMalloc calls and retries on each GPU during it."""
import sys, time, faulthandler
sys.path.insert(0, ".")
import torch
from torch._dynamo.utils import counters
from lib.study import common, sampling as ss
from lib.study.speculative import load_target
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint

P = common.setup(sys.argv[1])
n_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 4
dump = open(sys.argv[3] if len(sys.argv) > 3 else "stacks.txt", "w")
t0 = time.time()
model = load_target(P)
ensure_flash_checkpoint(P)
target, drafts = engines.build_engines(P, target_model=model)
target.runner.warm("hidden", range(1, P.decode.k + 2))
print("engines built", round(time.time() - t0), flush=True)
runners = [target.runner] + list({id(d.runner): d.runner for d in drafts.values()}.values())
devs = sorted({str(r.device) for r in runners})


def state():
    mem = {d: torch.cuda.memory_stats(d) for d in devs}
    return (sum(len(r._graphs) for r in runners), counters["stats"]["unique_graphs"],
            {d: (m.get("num_device_alloc", 0), m.get("num_alloc_retries", 0)) for d, m in mem.items()})


once, i = ss.sample_once, [0]


def watched(target_, drafts_, draft, request):
    before, t = state(), time.perf_counter()
    print(f"--- sample {i[0]} {draft} T={request.temperature} seed={request.seed}", file=dump, flush=True)
    faulthandler.dump_traceback_later(1.5, repeat=True, file=dump)
    try:
        return once(target_, drafts_, draft, request)
    finally:
        faulthandler.cancel_dump_traceback_later()
        after = state()
        print(f"sample {i[0]:3d} {draft:14s} seed {request.seed:3d} {1e3 * (time.perf_counter() - t):9.1f} ms "
              f"graphs +{after[0] - before[0]} dynamo +{after[1] - before[1]} "
              + " ".join(f"{d}: mallocs +{after[2][d][0] - before[2][d][0]} retries +{after[2][d][1] - before[2][d][1]}"
                         for d in devs), flush=True)
        i[0] += 1


ss.sample_once = watched
samples = ss.run(P, target, drafts, common.side_prompts(P)[:n_prompts], common.stop_tokens(P))
for r in samples:
    print(r["mode"], r["question_id"], round(r["decode_ms"]), r["skipped"], r["rounds"])
print("done", round(time.time() - t0), flush=True)
