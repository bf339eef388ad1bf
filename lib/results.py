"""The study's result files and where they came from: JSON files of a profile stamped with the commit that
wrote them, the commit claim a copy of the tree without git metadata checks, and reading run directories
(config.json beside samples.jsonl, DONE when finished). Pure file I/O: the report reads results through it."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from .config import ROOT, Profile, as_dict
from .progress import note


def save_json(profile: Profile, name: str, data: dict) -> Path:
    """Write a result file, stamped with the commit whose code wrote it, when, and the digest of the profile
    it ran (`written`)."""
    if not isinstance(data, dict):
        raise TypeError(f"{name}: a result file holds a JSON object (dict), got {type(data).__name__}")
    path = profile.out_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {**written(), "profile": profile_digest(profile)}
    write_whole(path, json.dumps({**data, "written": stamp}, indent=1, default=float))
    return path


def write_whole(path: Path, text: str) -> None:
    """Write a file whole: beside it, then renamed into place, so an interruption keeps the old one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def profile_digest(profile: Profile) -> str:
    """sha256 of the whole run configuration: a kept result must come from the same settings, which neither a
    clean commit (a profile of one's own is untracked) nor a STUDY_COMMIT claim (lib/ and notebooks/) covers."""
    return hashlib.sha256(json.dumps(as_dict(profile), sort_keys=True, default=str).encode()).hexdigest()


def written() -> dict:
    return {"commit": git_commit(), "at": now()}


def read_json(profile: Profile, name: str) -> dict:
    path = profile.out_dir / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the earlier notebooks for profile {profile.name!r} first")
    return json.loads(path.read_text())


def side_study_json(profile: Profile, study: str) -> dict | None:
    """Notebook 03's side study `study` (<study>.json) as notebook 04 reads it: where these very settings wrote it
    (notebook 03's parameter side_studies runs others than the profile's too), or, for a study the profile runs,
    where the file predates stamps naming the settings. None where the study has not run, or where its file is left
    from other settings (a study the profile no longer runs, or one not run again since the settings changed: a
    Slurm launch, a narrower side_studies, a failed run) and would be shown as if it were these settings'."""
    path = profile.out_dir / f"{study}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    wrote = data.get("written", {}).get("profile")
    return data if wrote == profile_digest(profile) or (wrote is None and study in profile.side_studies) else None


def kept_json(profile: Profile, name: str) -> dict | None:
    """The result file `name` if this very commit (a clean checkout) wrote it for this very profile, else None
    (measure it): notebook 03 run again with keep=True (the next device call, say) keeps the side studies this
    code has measured with these settings."""
    path, commit = profile.out_dir / name, clean_commit()
    if commit is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("written", {}).get("commit") != commit or data["written"].get("profile") != profile_digest(profile):
        return None
    note(f"kept {name}: written by this commit at {data['written']['at']}")
    return data


def update_json(profile: Profile, name: str, data: dict) -> dict:
    """Merge `data` into the profile's JSON file `name` (several notebooks add their parts, each part
    stamped with its own `written`)."""
    path = profile.out_dir / name
    data = {k: {**v, "written": written()} if isinstance(v, dict) else v for k, v in data.items()}
    merged = {**(json.loads(path.read_text()) if path.exists() else {}), **data}
    save_json(profile, name, merged)
    return merged


def git(*args: str, env: dict | None = None) -> str:
    """A git command in the checkout; its stdout (CalledProcessError or OSError when it fails)."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})}).stdout.strip()


CODE = ("lib", "notebooks")                                            # what a commit claim is checked on


def tree_matches(commit: str, paths=CODE) -> bool:
    """Whether this tree's files under `paths` (tracked or not, less the ignored ones) are exactly `commit`'s:
    their git tree hashes, through a scratch index (the checkout's own index and files are left alone)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git("read-tree", commit, env=env)
        git("add", "--all", "--", *paths, env=env)
        return all(git("write-tree", f"--prefix={p}/", env=env) == git("rev-parse", f"{commit}:{p}") for p in paths)


def code_digest(root: Path | None = None) -> str:
    """sha256 over the path and bytes of every file under lib/ and notebooks/ (less caches and staging files):
    what a commit claim is checked against on a copy of the tree that has no git metadata (a GPU machine)."""
    root, h = root or ROOT, hashlib.sha256()
    for top in CODE:
        for p in sorted((root / top).rglob("*")):
            rel = p.relative_to(root)
            if p.is_file() and not {"__pycache__", ".ipynb_checkpoints"} & set(rel.parts) \
                    and not p.name.endswith((".pyc", ".running.ipynb", ".failed.ipynb")):
                h.update(str(rel).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def commit_claim() -> str:
    """'<commit>:<code digest>', the STUDY_COMMIT to give a copy of this checkout; only a clean one can claim."""
    commit = clean_commit()
    if commit is None or git("status", "--porcelain", "--untracked-files=all", "--", *CODE):
        raise ValueError("a commit claim needs a checkout whose lib/ and notebooks/ are exactly its commit: commit first")
    return f"{commit}:{code_digest()}"


def git_commit() -> str:
    """The checkout's commit, with '+dirty' when tracked files differ from it ('unknown' outside git).
    STUDY_COMMIT, where set, names it instead: a copy of the tree whose git metadata is not its own (a remote
    GPU machine given the working tree) would otherwise report the wrong commit. It is honoured only when
    lib/ and notebooks/ are exactly that commit's: checked with git where it knows the commit, or against the
    code digest of a claim '<commit>:<digest>' (commit_claim, `python -m lib.study.preflight --claim`) on a copy
    without git metadata; a claim that is wrong or cannot be checked is refused."""
    claimed = os.environ.get("STUDY_COMMIT")
    if claimed and ":" in claimed:
        commit, digest = claimed.split(":", 1)
        if code_digest() != digest:
            raise ValueError(f"STUDY_COMMIT={commit}: lib/ or notebooks/ differ from the claimed code digest; "
                             "unset it, or claim again at a clean commit (python -m lib.study.preflight --claim)")
        return commit
    if claimed:
        try:
            ok = tree_matches(claimed.removesuffix("+dirty"))
        except (OSError, subprocess.CalledProcessError):
            raise ValueError(f"STUDY_COMMIT={claimed}: not a commit this checkout's git history knows, so the "
                             "claim cannot be checked; give '<commit>:<digest>' "
                             "(python -m lib.study.preflight --claim) or unset it") from None
        if not ok and not claimed.endswith("+dirty"):
            raise ValueError(f"STUDY_COMMIT={claimed}: lib/ or notebooks/ differ from that commit's; unset it "
                             "or commit the changes")
        return claimed
    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!outputs")  # results do not count
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def clean_commit() -> str | None:
    """The checkout's commit if its code is exactly that commit's (not '+dirty', not 'unknown'), else None:
    only then does a result this commit wrote stand for what this code would measure."""
    commit = git_commit()
    return None if commit == "unknown" or commit.endswith("+dirty") else commit


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


def finished(run: Path) -> bool:
    return (run / "DONE").exists()


def finish_time(run: Path) -> str:
    """When the run finished, from its DONE file (ISO time; older runs wrote the bare time)."""
    text = (run / "DONE").read_text().strip()
    return json.loads(text)["finished"] if text.startswith("{") else text


def run_order_key(run: Path) -> tuple[str, int]:
    """Start order of runs: the UTC stamp in the name (NAME-STAMP, NAME may hold hyphens), then the same-second
    suffix (NAME-STAMP-N) as a number."""
    stamp, suffix = re.search(RUN_NAME, run.name).groups()
    return stamp, int(suffix or 0)


RUN_NAME = r"(\d{8}T\d{6})(?:-(\d+))?$"            # NAME-STAMP, or NAME-STAMP-N for a second run in that second


def runs_of(out_dir: Path, name: str = "e2e") -> list[Path]:
    """Run directories of that name, in the order they were started (a copy renamed otherwise, say `e2e-copy`,
    is not one)."""
    return sorted((p for p in (Path(out_dir) / "runs").glob(f"{name}-*")
                   if re.fullmatch(re.escape(name) + "-" + RUN_NAME, p.name) and (p / "config.json").exists()),
                  key=run_order_key)


def latest_run(out_dir: Path, name: str = "e2e", profile: Profile | None = None) -> Path:
    """The finished run that finished last (by the time written in DONE, not file times). Given the profile, the
    last of those run with its end-to-end settings: notebook 03 reuses a finished run of them, which a run of other
    settings may have outlasted; where none was (a result set measured before a setting was added), the last."""
    runs = [p for p in runs_of(out_dir, name) if finished(p)]
    if not runs:
        raise FileNotFoundError(f"no finished {name} run under {out_dir}/runs: run notebook 03 first")
    if profile is not None:
        runs = [p for p in runs if of_e2e_settings(p, profile)] or runs
    return max(runs, key=lambda p: (finish_time(p), run_order_key(p)))


def of_e2e_settings(run: Path, profile: Profile) -> bool:
    """Whether `run` was made with the profile's end-to-end settings (e2e_settings)."""
    return e2e_settings(read_config(run))["profile"] == e2e_settings({"profile": as_dict(profile)})["profile"]


def read_config(run: Path) -> dict:
    """A run's configuration (its config.json)."""
    return json.loads((Path(run) / "config.json").read_text())


SIDE_SETTINGS = ("peers", "sampling", "side_studies")          # a profile's settings that only the side studies read


def e2e_settings(config: dict) -> dict:
    """A run configuration (config.json: profile, device, prompts) less the profile's settings that only the side
    studies read: what its end-to-end samples depend on."""
    c = json.loads(json.dumps(config, default=str))
    profile = {k: v for k, v in c.get("profile", {}).items() if k not in SIDE_SETTINGS}
    profile["prompts"] = {k: v for k, v in profile.get("prompts", {}).items() if k not in ("side_prompts", "side_studies")}
    return {**c, "profile": profile}


def read_records(run: Path) -> list[dict]:
    """All records of a run: samples.jsonl plus any shard files not merged yet."""
    return [json.loads(line) for path in sorted(Path(run).glob("samples*.jsonl")) if path.is_file()
            for line in path.read_text().splitlines() if line.strip()]
