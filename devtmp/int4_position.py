"""Device-only (issue 26): the int4 table's kernels one by one at the h100awq shapes, each result written to $OUT as it
lands (w4a16 first, marlin once its nvcc build is done, then dense_fp16 and tinygemm): position and batch invariance."""
import json, os, subprocess, sys, time
sys.path.insert(0, os.getcwd())
from lib.config import load_profile
from lib.study.int4_kernels import awq_projection_shapes
OUT = os.environ["OUT"]
shapes = json.dumps(awq_projection_shapes(load_profile("h100awq")))
t0 = time.time()
for kernel in sys.argv[1:]:
    if kernel == "marlin":
        while not os.path.exists(f"{OUT}/marlin_done") and time.time() - t0 < 330:
            time.sleep(2)
    path = f"{OUT}/int4_{kernel}.json"
    p = subprocess.run([sys.executable, "-m", "lib.study.int4_kernels", kernel, shapes, "cuda:0", "20", path],
                       capture_output=True, text=True, timeout=150)
    if p.returncode or not os.path.exists(path):
        print(kernel, "failed", (p.stderr or p.stdout).strip().splitlines()[-1:], flush=True)
        continue
    got = json.load(open(path))
    for name, rows in got.items():
        print(kernel, name, " ".join(f"{m}:{'B' if r['batch_invariant'] else 'b'}{'P' if r['position_invariant'] else 'p'}"
                                     f" {r['p50_ms'] * 1000:.1f}us" for m, r in rows.items()), round(time.time() - t0), flush=True)
