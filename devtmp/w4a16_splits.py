"""Device (issue 26, tenth session): the library W4A16 kernel (scale-and-zero word, 72 registers, 7 programs an SM)
at the four 32B decode shapes, 1 and 8 rows, over split-K choices, interleaved in one process (p50 of graphed cycles
over copies of the weights). Writes $OUT/w4a16_splits.json."""
import json, math, os, sys
import torch
sys.path.insert(0, ".")
from lib import bench
from lib.models import w4a16 as W
from lib.study.int4_kernels import random_awq, kernel_bytes, CALLS
OUT, dev = os.environ.get("OUT", "/tmp"), torch.device("cuda")
SPLITS = {"qkv": (5120, 10240, [2, 3, 4, 6, 8]), "o": (8192, 5120, [4, 6, 8, 12, 16]),
          "gate_up": (5120, 51200, [1, 2]), "down": (25600, 5120, [4, 6, 8, 10, 12, 16])}
res = {"device": bench.device_name(dev), "copy_GBps": bench.copy_bandwidth(dev) / 1e9, "shapes": {}}
for name, (K, N, splits) in SPLITS.items():
    torch.manual_seed(K + N)
    awq = random_awq(K, N, dev)
    copies = max(1, min(CALLS, math.ceil(256e6 / kernel_bytes("w4a16", K, N))))
    packs = [W.pack_awq(*awq) for _ in range(copies)]
    out = res["shapes"][name] = {"floor_us": kernel_bytes("w4a16", K, N) / res["copy_GBps"] / 1e3,
                                 "default_split": W.split_plan(K, N, W.Tiles())[0]}
    for m in (1, 8):
        x = torch.randn(m, K, device=dev, dtype=torch.float16)
        ref = W.w4a16_matmul(x, packs[0])
        fns = {}
        tiles = {f"split{s}": W.Tiles(split_k=s) for s in splits}
        tiles.update(stages2=W.Tiles(num_stages=2), stages4=W.Tiles(num_stages=4), noreg=W.Tiles(maxnreg=None))
        for label, t in tiles.items():
            g, _ = bench.capture(lambda t=t: [W.w4a16_matmul(x, packs[i % copies], t) for i in range(CALLS)])
            fns[label] = g.replay
        got = {s: round(1000 * bench.stats([v / CALLS for v in ms])["p50_ms"], 2)
               for s, ms in bench.interleaved(fns, 3, 30, dev).items()}
        out[str(m)] = got
        print(name, m, "floor %.1f" % out["floor_us"], "default", out["default_split"], got, flush=True)
    json.dump(res, open(f"{OUT}/w4a16_splits.json", "w"), indent=1)
    del packs, fns
    torch.cuda.empty_cache()
