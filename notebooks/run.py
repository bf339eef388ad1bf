"""Run the study's notebooks for one profile (what `make reproduce` calls):

    python notebooks/run.py PROFILE [--launcher local|slurm] [--fresh]

1. Preflight (`python -m lib.preflight PROFILE`): on failure print its line and exit 2, touching nothing.
2. Each notebooks/0*.ipynb in order, into $STUDY_OUTPUTS/PROFILE/ (default outputs/PROFILE/):
   skipped when up to date, i.e. the executed notebook exists and its stamp .stamps/<name>.json records
   the current sha256 of the profile file, the notebook, every lib/*.py and the earlier notebooks' stamps
   (so rerunning 01 makes 02-04 stale); --fresh runs everything and passes `fresh=True` to the notebooks.
3. papermill executes into <name>.running.ipynb, which replaces <name>.ipynb only on success; a failure
   leaves the previous executed notebook alone, renames the staging file to <name>.failed.ipynb, prints
   the error's `ename: evalue` and that path, and exits 1.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import papermill

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tidy import tidy  # noqa: E402 - notebooks/tidy.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
PREFLIGHT = [sys.executable, "-m", "lib.preflight"]
# Progress bars would land in executed notebooks as stderr outputs and widget state.
QUIET_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}


def outputs_root() -> Path:
    return Path(os.environ.get("STUDY_OUTPUTS") or ROOT / "outputs").expanduser()


def shown(path: Path) -> str:
    """The path relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def preflight(profile: str) -> None:
    """Exit 2 with the preflight's one line when the profile cannot run here."""
    r = subprocess.run([*PREFLIGHT, profile], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        lines = (r.stdout + r.stderr).strip().splitlines() or [f"error: preflight exited with status {r.returncode}"]
        print(lines[-1])
        sys.exit(2)


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stamp_path(out: Path, name: str) -> Path:
    return out / ".stamps" / f"{name}.json"


def dependencies(root: Path, profile: str, notebook: Path, out: Path, earlier: list[str]) -> dict:
    """sha256 of everything a notebook's results depend on; an earlier notebook's stamp changes
    whenever it reruns, and a missing stamp is None."""
    stamps = {name: sha256(stamp_path(out, name)) if stamp_path(out, name).exists() else None for name in earlier}
    return {"profile": sha256(root / "params" / f"{profile}.yaml"),
            "notebook": sha256(notebook),
            "lib": {p.name: sha256(p) for p in sorted((root / "lib").glob("*.py"))},
            "earlier_stamps": stamps}


def up_to_date(out: Path, name: str, deps: dict) -> bool:
    stamp = stamp_path(out, name)
    if not (out / f"{name}.ipynb").exists() or not stamp.exists():
        return False
    try:
        return json.loads(stamp.read_text())["dependencies"] == deps
    except (ValueError, KeyError):
        return False


def write_stamp(out: Path, name: str, deps: dict) -> None:
    stamp = stamp_path(out, name)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    record = {"dependencies": deps, "executed_sha256": sha256(out / f"{name}.ipynb"),
              "finished": datetime.now(timezone.utc).isoformat()}
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, stamp)


def first_error(exc: BaseException) -> str:
    """The failing cell's own `ename: evalue` on one line (never the traceback)."""
    if isinstance(exc, papermill.PapermillExecutionError):
        ename, evalue = exc.ename, exc.evalue
    else:
        ename, evalue = type(exc).__name__, str(exc)
    lines = str(evalue).strip().splitlines()
    return f"{ename}: {lines[0]}" if lines else ename


def execute(notebook: Path, out: Path, parameters: dict) -> tuple[str, Path] | None:
    """Run one notebook into a staging file and move it into place; on failure return
    (error line, failed notebook) and leave the previous executed notebook untouched."""
    name = notebook.stem
    staging, failed = out / f"{name}.running.ipynb", out / f"{name}.failed.ipynb"
    stamp_path(out, name).unlink(missing_ok=True)        # half-written results are never up to date
    failed.unlink(missing_ok=True)
    try:
        papermill.execute_notebook(str(notebook), str(staging), parameters=parameters, kernel_name="python3",
                                   cwd=str(notebook.parent), progress_bar=False, log_output=False,
                                   extra_arguments=["--IPKernelApp.log_level=CRITICAL"])   # no kernel log lines
    except (Exception, KeyboardInterrupt) as e:          # noqa: BLE001 - reported in one line below
        if not staging.exists():                         # the kernel never started: point at the source
            return first_error(e), notebook
        os.replace(staging, failed)
        return first_error(e), failed
    tidy(staging, keep_outputs=True)
    os.replace(staging, out / f"{name}.ipynb")
    return None


def run_all(profile: str, launcher: str, fresh: bool, root: Path = ROOT) -> int:
    """Every notebook in order, skipping the up-to-date ones; 0 when all are done, 1 on a failure."""
    out = outputs_root().resolve() / profile
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(QUIET_ENV, STUDY_OUTPUTS=str(out.parent))   # kernels inherit this; they run in notebooks/
    logging.getLogger("papermill").setLevel(logging.CRITICAL)
    parameters = {"profile": profile, "launcher": launcher, **({"fresh": True} if fresh else {})}
    notebooks = sorted((root / "notebooks").glob("0*.ipynb"))
    for i, nb in enumerate(notebooks):
        deps = dependencies(root, profile, nb, out, [n.stem for n in notebooks[:i]])
        if not fresh and up_to_date(out, nb.stem, deps):
            print(f"{nb.stem}: up to date, skipped")
            continue
        print(f"{nb.stem}: running ...", end=" ", flush=True)
        t0 = time.perf_counter()
        failure = execute(nb, out, parameters)
        if failure:
            print(f"failed after {time.perf_counter() - t0:.1f} s")
            print(failure[0])
            print(shown(failure[1]))
            return 1
        write_stamp(out, nb.stem, deps)
        print(f"done in {time.perf_counter() - t0:.1f} s")
    print(f"results in {shown(out)}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the study's notebooks for one profile (make reproduce).")
    ap.add_argument("profile", help="params/<profile>.yaml")
    ap.add_argument("--launcher", default="local", help="notebook 03: local or slurm")
    ap.add_argument("--fresh", action="store_true", help="ignore stamps, run every notebook, start a new e2e run")
    args = ap.parse_args(argv)
    preflight(args.profile)
    return run_all(args.profile, args.launcher, args.fresh)


if __name__ == "__main__":
    sys.exit(main())
