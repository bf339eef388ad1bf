"""Device (thirty-seventh session, block AT, issue 26): the mma W4A16 kernel with rows past M reading row 0's
activations (the working tree's lib/models/w4a16_mma.cu) against HEAD's zero-filled predicated loads
(devtmp/w4cu3/head.cu). Kernel: the 32B decode shapes at 1, 2, 4, 8, 16 rows, fp16, outputs compared bitwise
(also 20 rows and bf16 at one shape), p50 of graphed calls over weight copies past L2, interleaved. Step: h100awq's
target loaded twice, graphs captured with each build, 1 and K + 1 tokens interleaved at the prompt's end and at 300
positions, tokens compared. Writes $OUT/at_ab.json."""
import json, math, os, sys, time
sys.path.insert(0, ".")
import torch
from pathlib import Path
from lib import bench
from lib.models import w4a16 as W, w4a16_mma as MM
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
OUT, dev, t0 = os.environ.get("OUT", "/tmp"), torch.device("cuda"), time.time()
LIBS = {}
for label, src in (("head", Path("devtmp/w4cu3/head.cu")), ("unmasked", MM.SOURCE)):
    MM.SOURCE = src
    MM._library.cache_clear()
    LIBS[label] = MM._library()
ORIGINAL = MM._library


def use(label):
    MM._library = lambda: LIBS[label]


SHAPES = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
print(res, flush=True)
for name, (K, N) in SHAPES.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
    ws = []
    for _ in range(copies):
        p = W.pack_awq(*awq)
        ws.append(MM.pack(W.codes(p), p.groups))
        del p
    out = res["shapes"][name] = {"floor_us": kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3}
    extra = [(20, torch.float16), (3, torch.bfloat16)] if name == "qkv" else []
    for rows, dt in [(r, torch.float16) for r in (1, 2, 4, 8, 16)] + extra:
        x = torch.randn(rows, K, device=dev, dtype=dt)
        ys = {}
        for label in LIBS:
            use(label)
            ys[label] = MM.mma_matmul(x, ws[0])
        out[f"{rows}/{dt}/equal"] = bool(torch.equal(ys["head"], ys["unmasked"]))
        if dt != torch.float16 or rows == 20:
            print(name, rows, dt, "equal", out[f"{rows}/{dt}/equal"], flush=True)
            continue
        graphs = {}
        for label in LIBS:
            use(label)
            fn = lambda x=x: [MM.mma_matmul(x, ws[i % copies]) for i in range(CALLS)]
            fn()
            g, _ = bench.capture(fn)
            graphs[label] = g.replay
        for label, ms in bench.interleaved(graphs, 3, 30, dev).items():
            out[f"{label}/{rows}"] = 1000 * bench.stats([m / CALLS for m in ms])["p50_ms"]
        print(name, rows, "floor %.1f" % out["floor_us"], {l: round(out[f"{l}/{rows}"], 2) for l in graphs},
              "equal", out[f"{rows}/{dt}/equal"], flush=True)
    del ws, graphs
    torch.cuda.empty_cache()
json.dump(res, open(f"{OUT}/at_ab.json", "w"), indent=1)
MM._library = ORIGINAL

if len(sys.argv) > 1 and sys.argv[1] == "step":
    from lib.models import build as engines
    from lib.study import common
    from lib.study.common import encoded_prompts
    from lib.study.microbench import target_calls
    from lib.models.checkpoints import load_target
    P = common.setup("h100awq")
    models = {label: load_target(P) for label in LIBS}
    print("loaded", round(time.time() - t0), flush=True)
    k, first = P.decode.k, encoded_prompts(P)[0][1]
    res["step"] = {}
    for where, prompt in {"first": first, "long": (first * (300 // len(first) + 1))[:300]}.items():
        fns, toks = {}, {}
        for label, m in models.items():
            use(label)                                          # the graphs capture this build's kernel
            runner = engines.build_target(P, m).runner
            for n, fn in target_calls(runner, prompt, [1, k + 1]).items():
                fns[f"{label}/{n}"] = fn
                toks[f"{label}/{n}"] = fn().tolist()
        raw = bench.interleaved(fns, 5, 60, runner.device)
        case = res["step"][where] = {"position": len(prompt), **{key: bench.stats(ms) for key, ms in raw.items()},
                                     "tokens_equal": {n: toks[f"head/{n}"] == toks[f"unmasked/{n}"]
                                                      for n in ("1", str(k + 1))}}
        for key in fns:
            s = case[key]
            print(f"{where} pos {len(prompt)} {key:12s} mean {s['mean_ms']:.3f} p50 {s['p50_ms']:.3f} "
                  f"p95 {s['p95_ms']:.3f}", flush=True)
        print(where, "tokens equal", case["tokens_equal"], round(time.time() - t0), flush=True)
        json.dump(res, open(f"{OUT}/at_ab.json", "w"), indent=1, default=str)
