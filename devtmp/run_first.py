"""Device helper: run_all for the first N notebooks only (stamps as run.py writes them)."""
import os, sys, time, logging
sys.path.insert(0, "notebooks")
import run
profile, n = sys.argv[1], int(sys.argv[2])
first = int(sys.argv[3]) if len(sys.argv) > 3 else 1   # notebooks before it: left as they are
out = run.outputs_root().resolve() / profile
os.environ.update(run.QUIET_ENV, STUDY_OUTPUTS=str(out.parent))
logging.getLogger("papermill").setLevel(logging.CRITICAL)
nbs = sorted((run.ROOT / "notebooks").glob("0*.ipynb"))
names = [nb.stem for nb in nbs]
for i, nb in enumerate(nbs[:n]):
    if i + 1 < first:
        continue
    deps = run.dependencies(run.ROOT, profile, nb, out, names[:i])
    reason = run.stale_reason(out, nb.stem, deps, names[i + 1:])
    if not reason:
        print(nb.stem, "up to date"); continue
    print(nb.stem, "running:", reason, flush=True)
    t0, before = time.perf_counter(), run.result_files(out)
    f = run.execute(nb, out, {"profile": profile, "launcher": "local", **({"keep": True} if os.environ.get("NB_KEEP") else {})})
    if f:
        print("FAILED", f); sys.exit(1)
    run.write_stamp(out, nb.stem, deps, before)
    print(nb.stem, "done in", time.perf_counter() - t0, flush=True)
