"""Device (thirty-seventh session, issue 26): notebook 02's int4 table (lib.study.int4_kernels, each kernel in its own
process) on one H200 at the 32B decode shapes, with the mma kernel beside the Triton one, marlin, tinygemm, GemLite
(started from outputs/two_gpu_awq/tuned's H200 configs, copied) and dense fp16. Experiment: not a result set's
file (two_gpu_awq's notebook 02 needs two GPUs). Writes $OUT/int4_kernels_h200.json and prints a layer's sum."""
import json, os, shutil, sys, tempfile, time
sys.path.insert(0, ".")
import torch
from pathlib import Path
from lib import bench
from lib.models.quantize import int4_bytes
from lib.study import int4_kernels as I
OUT, dev, t0 = os.environ.get("OUT", "/tmp"), torch.device("cuda"), time.time()
shapes = {"qkv": (5120, 10240), "o": (8192, 5120), "gate_up": (5120, 51200), "down": (25600, 5120)}
tuned = Path(tempfile.mkdtemp()) / "tuned"
shutil.copytree("outputs/two_gpu_awq/tuned", tuned)
bw = bench.copy_bandwidth(dev)
res = {"device": bench.device_name(dev), "copy_GBps": bw / 1e9, "shapes": {n: {"K": K, "N": N,
       "floor_ms": int4_bytes(K, N) / bw * 1e3, "rows": {str(m): {} for m in I.ROWS}, "unavailable": {}}
       for n, (K, N) in shapes.items()}}
for kernel in sys.argv[1:] or I.KERNELS:
    got, error = I._in_subprocess(kernel, shapes, "cuda:0", 30, tuned)
    for name, shape in res["shapes"].items():
        if error:
            shape["unavailable"][kernel] = error
        else:
            for m, row in got[name].items():
                shape["rows"][m][kernel] = row
    layer = {m: sum(res["shapes"][n]["rows"][str(m)].get(kernel, {}).get("p50_ms", float("nan"))
                    for n in shapes) * 1e3 for m in I.ROWS}
    inv = sum(r.get(kernel, {}).get("batch_invariant", False) for s in res["shapes"].values()
              for r in s["rows"].values())
    print(kernel, round(time.time() - t0), "layer us", {m: round(v, 1) for m, v in layer.items()},
          "batch-invariant cells", inv, error, flush=True)
    json.dump(res, open(f"{OUT}/int4_kernels_h200.json", "w"), indent=1)
print("floor us", round(sum(s["floor_ms"] for s in res["shapes"].values()) * 1e3, 1))
