"""Run the study's notebooks for one profile (what `make reproduce` calls):

    python notebooks/run.py PROFILE [--launcher local|slurm] [--fresh]

1. Preflight (`python -m lib.study.preflight PROFILE`): on failure print its line and exit 2, touching nothing.
2. Each notebooks/0*.ipynb in order, into $STUDY_OUTPUTS/PROFILE/ (default outputs/PROFILE/), skipped when up
   to date: its stamp .stamps/<name>.json records the sha256 of what it depends on (the profile file and the
   profiles it extends, the prompt file, the notebook, every lib/ module, the earlier notebooks' stamps, so
   rerunning 01 makes 02-04 stale; 04_analysis also params/thesis_tables.yaml, the summary.json of each profile
   under compare_with, which it sets ours beside, and the run it analyses) and of what it wrote (the executed notebook and every result
   file it changed). Anything that differs re-runs it, and the terminal says why; --fresh runs everything and
   passes `fresh=True`. Before the first notebook of other settings runs (the profile or its prompt file changed,
   or --fresh) the result set is copied to earlier/<UTC>/, so that nothing the earlier settings measured is lost.
3. papermill executes into <name>.running.ipynb, which replaces <name>.ipynb only on success; a failure
   leaves the previous executed notebook alone, renames the staging file to <name>.failed.ipynb, prints
   the error's `ename: evalue` and that path, and exits 1.
4. While a notebook runs, the terminal shows its progress (notebooks/watch.py reads what lib/progress.py
   reports); the kernel's own stray output (C++ libraries, banners) goes to .logs/<name>.log instead.
   At the end: where the results are, the headline numbers of summary.json, and each notebook's time.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import papermill

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tidy import tidy  # noqa: E402 - notebooks/tidy.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lib.config import (ConfigError, Prompts, known_profiles, load_profile, merged,  # noqa: E402 - profiles (no model code)
                        profile_files, read_yaml)
from lib.modes import LAUNCHERS  # noqa: E402 - what notebook 03's run_speculative takes
from lib.prompts import profile_prompt_file  # noqa: E402 - which prompt file a profile reads
from lib.results import latest_run  # noqa: E402 - the run notebook 04 analyses
from watch import Watch, duration  # noqa: E402 - notebooks/watch.py, beside this file

PREFLIGHT = [sys.executable, "-m", "lib.study.preflight"]
# Progress bars would land in executed notebooks as stderr outputs and widget state; the profiler's
# start/stop lines (kineto, level 5) would land in the terminal and the notebook.
QUIET_ENV = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
             "KINETO_LOG_LEVEL": "6"}
KEPT = "earlier"                                    # outputs/PROFILE/earlier/<UTC>/: results other settings replaced
BOOKKEEPING = (".stamps", ".logs", KEPT)            # the driver's own files under outputs/PROFILE/, never results
SETTINGS_CHANGED = ("the profile changed", "the prompt file changed", "FRESH=1")   # reasons that start another study
LIB_SOURCES = (".py", ".cu")                        # lib/'s code: Python, and the CUDA kernels it builds
ANALYSIS = "04_analysis"                            # the report: the one notebook that reads report_inputs


def outputs_root() -> Path:
    return Path(os.environ.get("STUDY_OUTPUTS") or ROOT / "outputs").expanduser()


def absolute_roots() -> None:
    """$STUDY_OUTPUTS and $STUDY_MODELS made absolute, from the working directory: preflight runs in the repository
    and the kernels in notebooks/, and each would read a relative one from its own."""
    for key in ("STUDY_OUTPUTS", "STUDY_MODELS"):
        if os.environ.get(key):
            os.environ[key] = str(Path(os.environ[key]).expanduser().resolve())


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
    files = profile_files(profile, root / "params")
    prompts = prompt_file(files)
    settings = json.loads(json.dumps(profile_data(files), default=str))    # as the stamp holds them (JSON)
    return {"profile": {p.name: sha256(p) for p in files}, "settings": settings,
            "prompts": {prompts.name: sha256(prompts) if prompts.is_file() else None},
            "notebook": sha256(notebook),
            "lib": {str(p.relative_to(root / "lib")): sha256(p) for p in sorted((root / "lib").rglob("*"))
                    if p.suffix in LIB_SOURCES},
            "earlier_stamps": stamps,
            **({"report": report_inputs(root, files, out)} if notebook.stem == ANALYSIS else {})}


def report_inputs(root: Path, files: list[Path], out: Path) -> dict:
    """sha256 of what the analysis notebook reads besides this profile's results and code (None where missing):
    the thesis's published tables (lib.config.thesis_numbers), the summary.json of each profile under
    compare_with (beside this profile's outputs) and the run it analyses, the latest finished e2e run of the
    profile's settings (one made or put back without notebook 03, by a script or git, is a new input too)."""
    others = profile_data(files).get("compare_with")
    paths = {"params/thesis_tables.yaml": root / "params" / "thesis_tables.yaml",
             **{f"{o}/summary.json": out.parent / o / "summary.json"
                for o in (others if isinstance(others, list) else []) if isinstance(o, str) and o != out.name}}
    inputs = {name: sha256(p) if p.is_file() else None for name, p in paths.items()}
    try:
        run = latest_run(out, profile=typed_profile(files))
        inputs["the analysed run"] = f"{run.name} {sha256(run / 'samples.jsonl')}"
    except FileNotFoundError:
        inputs["the analysed run"] = None
    return inputs


def typed_profile(files: list[Path]):
    """The profile as notebook 04 reads it, or None where it does not load (preflight refuses it)."""
    try:
        return load_profile(str(files[0]))
    except ConfigError:
        return None


def profile_data(files: list[Path]) -> dict:
    """The profile's files merged as lib.config.load_profile merges them (a malformed layer is skipped here:
    preflight refuses it)."""
    data = {}
    for f in reversed(files):
        layer = read_yaml(f)
        data = merged(data, layer) if isinstance(layer, dict) else data
    return data


def prompt_file(files: list[Path]) -> Path:
    """The question file a profile reads (its files merged, else the default); `auto` follows `make data`. A
    malformed profile reads the default here: preflight refuses it."""
    data = profile_data(files)
    given = (data.get("prompts") or {}).get("file") if isinstance(data.get("prompts"), dict) else None
    return profile_prompt_file(given if isinstance(given, str) else Prompts.file)[0]


def result_files(out: Path) -> dict[str, int]:
    """Every result file under out/ with its modification time (ns): not the driver's bookkeeping, nor the
    executed notebooks (each stamp checks its own)."""
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted(out.rglob("*"))
            if p.is_file() and p.relative_to(out).parts[0] not in BOOKKEEPING
            and not (p.parent == out and p.suffix == ".ipynb")}


def read_stamp(out: Path, name: str) -> dict | None:
    try:
        return json.loads(stamp_path(out, name).read_text())
    except (OSError, ValueError):
        return None


def changed_dependency(old: dict, new: dict) -> str:
    """Which dependency differs, in words."""
    if old.get("profile") != new["profile"]:
        return "the profile changed" + settings_changed(old.get("settings"), new["settings"])
    if old.get("prompts") != new["prompts"]:
        return f"the prompt file changed ({', '.join(new['prompts'])})"
    if old.get("notebook") != new["notebook"]:
        return "the notebook changed"
    if old.get("lib") != new["lib"]:
        before, after = old.get("lib") or {}, new["lib"]
        names = sorted(n for n in {*before, *after} if before.get(n) != after.get(n))
        return f"lib/{names[0]} changed" + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")
    if old.get("report") != new.get("report"):
        before, after = old.get("report") or {}, new.get("report") or {}
        return f"{min(n for n in {*before, *after} if before.get(n) != after.get(n))} changed"
    earlier = [n for n, h in new["earlier_stamps"].items() if (old.get("earlier_stamps") or {}).get(n) != h]
    return f"{earlier[0]} ran again since" if earlier else "its dependencies changed"


def settings_changed(old: dict | None, new: dict) -> str:
    """': decode.k 3 -> 4, ...', the settings that differ (dotted keys, at most three named), or '' where the stamp
    predates recording them or only the files' text changed."""
    def flat(d, at=""):
        return {k: v for key, val in d.items() for k, v in
                (flat(val, f"{at}{key}.").items() if isinstance(val, dict) else [(f"{at}{key}", val)])}
    if old is None:
        return ""
    before, after = flat(old), flat(new)
    keys = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
    named = ", ".join(f"{k} {before.get(k)} -> {after.get(k)}" for k in keys[:3])
    return f": {named}" + (f" (and {len(keys) - 3} more)" if len(keys) > 3 else "") if keys else ""


def stale_reason(out: Path, name: str, deps: dict, later: list[str] = ()) -> str:
    """Why the notebook must run again, or '' when its executed notebook and results are the ones its stamp
    recorded and nothing it depends on changed. A result file that a later notebook rewrote counts as current
    while it is the one that notebook's stamp recorded (a later notebook may add only its part to the file)."""
    stamp = read_stamp(out, name)
    executed = out / f"{name}.ipynb"
    if stamp is None:
        return "no record of an earlier run here"
    if "dependencies" not in stamp:
        return "its last run did not finish"
    if not executed.exists():
        return f"{name}.ipynb is missing"
    if stamp["dependencies"] != deps:
        return changed_dependency(stamp["dependencies"], deps)
    if stamp.get("executed_sha256") != sha256(executed):
        return f"{name}.ipynb is not the one its run wrote"
    rewritten = {f: h for n in later for f, h in ((read_stamp(out, n) or {}).get("results") or {}).items()}
    for f, h in (stamp.get("results") or {}).items():
        if not (out / f).exists():
            return f"{f} is missing"
        if sha256(out / f) not in (h, rewritten.get(f)):          # the last rewrite's stamp wins (later in order)
            return f"{f} is not the one its run wrote"
    return ""


def up_to_date(out: Path, name: str, deps: dict, later: list[str] = ()) -> bool:
    return not stale_reason(out, name, deps, later)


def write_stamp(out: Path, name: str, deps: dict | None, before: dict[str, int] | None = None) -> None:
    """The stamp: dependencies, the executed notebook's hash, and the hash of each result file the run wrote
    (new or modified since `before`, result_files when it started; rewritten with the same bytes counts too).
    deps None: a run that failed, whose stamp names only the files it changed (never up to date itself, it keeps
    an earlier notebook from running again for a file this one rewrote)."""
    stamp = stamp_path(out, name)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    results = {f: sha256(out / f) for f, t in result_files(out).items() if (before or {}).get(f) != t}
    record = {"results": results, "failed": datetime.now(timezone.utc).isoformat()} if deps is None else {
        "dependencies": deps, "executed_sha256": sha256(out / f"{name}.ipynb"), "results": results,
        "finished": datetime.now(timezone.utc).isoformat()}
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, stamp)


def keep_earlier(out: Path) -> Path | None:
    """Copy the result set (executed notebooks, result files, stamps) into earlier/<UTC>/ before notebooks of other
    settings replace it; runs/ keeps every e2e run itself. None where no notebook has run here."""
    files = [p for p in sorted(out.rglob("*"))
             if p.is_file() and p.relative_to(out).parts[0] not in ("runs", ".logs", KEPT)]
    if not any(p.parent == out and p.suffix == ".ipynb" for p in files):
        return None
    kept = out / KEPT / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    while kept.exists():                                          # two in one second: never into another's copy
        kept = kept.with_name(kept.name + "+")
    for p in files:
        (kept / p.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(p, kept / p.relative_to(out))
    return kept


def mark_started(out: Path, name: str) -> None:
    """The stamp of a run under way: never up to date, and read as a run that did not finish where the driver is
    killed before it writes another (kill, a time limit's SIGTERM)."""
    stamp = stamp_path(out, name)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"results": {}, "started": datetime.now(timezone.utc).isoformat()}, indent=1))


@contextlib.contextmanager
def kernel_output_to(log: Path):
    """The kernel inherits this process's stdout and stderr descriptors: point them at `log` while it runs (C++
    libraries and banners write there directly), and yield a stream to the terminal for the driver's lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        terminal.close()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (kill, a time limit) stops the notebook as Ctrl-C does: its failed notebook kept, its stamp naming the
    files it rewrote (else an earlier notebook whose file it added to runs again) and a line saying so."""
    def stop(signum, frame):
        raise KeyboardInterrupt("stopped by SIGTERM")
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def first_error(exc: BaseException) -> str:
    """The failing cell's own `ename: evalue` on one line (never the traceback)."""
    if isinstance(exc, papermill.PapermillExecutionError):
        ename, evalue = exc.ename, exc.evalue
    else:
        ename, evalue = type(exc).__name__, str(exc)
    lines = str(evalue).strip().splitlines()
    return f"{ename}: {lines[0]}" if lines else ename


def execute(notebook: Path, out: Path, parameters: dict) -> tuple[str, Path] | None:
    """Run one notebook into a staging file and move it into place, showing its progress; on failure return
    (error line, failed notebook) and leave the previous executed notebook untouched."""
    name = notebook.stem
    staging, failed = out / f"{name}.running.ipynb", out / f"{name}.failed.ipynb"
    mark_started(out, name)                              # half-written results are never up to date
    failed.unlink(missing_ok=True)
    log = out / ".logs" / f"{name}.log"
    log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp, kernel_output_to(log) as terminal, sigterm_as_interrupt():
        os.environ["STUDY_PROGRESS"] = events = str(Path(tmp) / "progress.jsonl")   # lib/progress.py writes here
        try:
            with Watch(name, events, staging, out=terminal):
                papermill.execute_notebook(str(notebook), str(staging), parameters=parameters, kernel_name="python3",
                                           cwd=str(notebook.parent), progress_bar=False, log_output=False,
                                           extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
        except (Exception, KeyboardInterrupt) as e:      # noqa: BLE001 - reported in one line below
            if not staging.exists():                     # the kernel never started: point at the source
                return first_error(e), notebook
            os.replace(staging, failed)
            return first_error(e), failed
        finally:
            del os.environ["STUDY_PROGRESS"]
    tidy(staging, keep_outputs=True)
    os.replace(staging, out / f"{name}.ipynb")
    return None


def run_all(profile: str, launcher: str, fresh: bool, root: Path = ROOT) -> int:
    """Every notebook in order, skipping the up-to-date ones; 0 when all are done, 1 on a failure."""
    absolute_roots()
    out = outputs_root().resolve() / profile
    out.mkdir(parents=True, exist_ok=True)
    os.environ.update(QUIET_ENV, STUDY_OUTPUTS=str(out.parent))   # kernels inherit this; they run in notebooks/
    logging.getLogger("papermill").setLevel(logging.CRITICAL)
    parameters = {"profile": profile, "launcher": launcher, **({"fresh": True} if fresh else {})}
    notebooks = sorted((root / "notebooks").glob("0*.ipynb"))
    names = [nb.stem for nb in notebooks]
    took: dict[str, float | None] = {}
    kept = None
    for i, nb in enumerate(notebooks):
        deps = dependencies(root, profile, nb, out, names[:i])
        reason = "FRESH=1" if fresh else stale_reason(out, nb.stem, deps, names[i + 1:])
        if not reason:
            print(f"{nb.stem}: up to date, skipped")
            took[nb.stem] = None
            continue
        if kept is None and reason.startswith(SETTINGS_CHANGED):      # the first notebook of other settings
            kept = keep_earlier(out) or False
            if kept:
                print(f"the earlier settings' results are kept in {shown(kept)}/")
        print(f"{nb.stem}: running ({reason})", flush=True)
        t0, before = time.perf_counter(), result_files(out)
        failure = execute(nb, out, parameters)
        if failure:
            write_stamp(out, nb.stem, None, before)
            ended = "stopped" if failure[0].startswith("KeyboardInterrupt") else "failed"     # Ctrl-C, SIGTERM
            print(f"{nb.stem}: {ended} after {duration(time.perf_counter() - t0)}")
            print(failure[0])
            print(shown(failure[1]))
            return 1
        write_stamp(out, nb.stem, deps, before)
        took[nb.stem] = time.perf_counter() - t0
        print(f"{nb.stem}: done in {duration(took[nb.stem])}")
    print("\n".join(closing_summary(out, took)))
    return 0


def closing_summary(out: Path, took: dict[str, float | None]) -> list[str]:
    """Where the results are, each notebook's time, and the headline numbers of summary.json."""
    lines = [f"results in {shown(out)}/",
             "time: " + " · ".join(f"{n.split('_')[0]} {duration(t) if t is not None else 'skipped'}"
                                   for n, t in took.items())]
    summary = out / "summary.json"
    if summary.exists():
        from lib.report.headline import headline
        lines += headline(json.loads(summary.read_text()))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run the study's notebooks for one profile (make reproduce).")
    ap.add_argument("profile", nargs="?", default="", help="params/<profile>.yaml")   # PROFILE= gives none
    ap.add_argument("--launcher", default="local", help="notebook 03: local, slurm or submitit-local")
    ap.add_argument("--fresh", action="store_true", help="ignore stamps, run every notebook, start a new e2e run")
    args = ap.parse_args(argv)
    if not args.profile:
        print(f"error: no profile given: make reproduce PROFILE=<profile>, one of {known_profiles()}")
        sys.exit(2)
    if args.launcher not in LAUNCHERS:                  # else notebooks 01-02 ran first and 03 refused it
        print(f"error: unknown launcher {args.launcher!r}: use {', '.join(LAUNCHERS[:-1])} or {LAUNCHERS[-1]}")
        sys.exit(2)
    profile = Path(args.profile).stem if args.profile.endswith(".yaml") else args.profile   # params/<profile>.yaml
    absolute_roots()
    preflight(profile)
    return run_all(profile, args.launcher, args.fresh)


if __name__ == "__main__":
    sys.exit(main())
