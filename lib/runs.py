"""Run management for notebook 03: run directories (config.json beside samples.jsonl, DONE when finished),
resume, Slurm shards, per-sample records, and the profile's JSON result files."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from . import adaptive, modes
from .blocks import make_policy
from .config import ROOT, Profile, as_dict
from .progress import note, steps
from .speculative import Result, generate_baseline


# ---------------------------------------------------------------- result files of a profile

def save_json(profile: Profile, name: str, data: dict) -> Path:
    """Write a result file, stamped with the commit whose code wrote it and when (`written`)."""
    if not isinstance(data, dict):
        raise TypeError(f"{name}: a result file holds a JSON object (dict), got {type(data).__name__}")
    path = profile.out_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**data, "written": written()}, indent=1, default=float))
    return path


def written() -> dict:
    return {"commit": git_commit(), "at": now()}


def read_json(profile: Profile, name: str) -> dict:
    path = profile.out_dir / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the earlier notebooks for profile {profile.name!r} first")
    return json.loads(path.read_text())


def kept_json(profile: Profile, name: str) -> dict | None:
    """The result file `name` if this very commit (a clean checkout) wrote it, else None (measure it): notebook
    03 run again with keep=True (the next device call, say) keeps the side studies this code has measured."""
    path, commit = profile.out_dir / name, clean_commit()
    if commit is None or not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("written", {}).get("commit") != commit:
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
    code digest of a claim '<commit>:<digest>' (commit_claim, `python -m lib.preflight --claim`) on a copy
    without git metadata; a claim that is wrong or cannot be checked is refused."""
    claimed = os.environ.get("STUDY_COMMIT")
    if claimed and ":" in claimed:
        commit, digest = claimed.split(":", 1)
        if code_digest() != digest:
            raise ValueError(f"STUDY_COMMIT={commit}: lib/ or notebooks/ differ from the claimed code digest; "
                             "unset it, or claim again at a clean commit (python -m lib.preflight --claim)")
        return commit
    if claimed:
        try:
            ok = tree_matches(claimed.removesuffix("+dirty"))
        except (OSError, subprocess.CalledProcessError):
            raise ValueError(f"STUDY_COMMIT={claimed}: not a commit this checkout's git history knows, so the "
                             "claim cannot be checked; give '<commit>:<digest>' (python -m lib.preflight --claim) "
                             "or unset it") from None
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


# ---------------------------------------------------------------- run directories

def new_run(out_dir: Path, config: dict, name: str = "e2e") -> Path:
    """A fresh run directory outputs/<profile>/runs/<name>-<UTC time>/ with config.json beside the records."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    run = Path(out_dir) / "runs" / f"{name}-{stamp}"
    i = 1
    while run.exists():                                                # never reuse a directory
        run = run.with_name(f"{name}-{stamp}-{i}")
        i += 1
    run.mkdir(parents=True)
    config = {**config, "started": now(), "commit": git_commit()}
    (run / "config.json").write_text(json.dumps(config, indent=1, default=str))
    return run


def record_kernels(run: Path, kernels: dict) -> None:
    """Add which kernel path picks each engine's tokens (lib/engines.py: kernels, {"target": ..., <draft>: ...}) to
    the run's config.json under `kernels`, once its engines are built. A run records them before its first sample;
    one started by older code with samples and no record stays unrecorded. Samples of one run never come from other
    kernels than those it recorded: a difference stops with one line."""
    path = Path(run) / "config.json"
    cfg = json.loads(path.read_text())
    old = cfg.get("kernels")
    if old is None and read_records(run):
        note(f"run {Path(run).name} has samples from before kernels were recorded: its kernels stay unrecorded")
        return
    differ = {k: (old[k], v) for k, v in kernels.items() if old and k in old and old[k] != v}
    if differ:
        raise RuntimeError(f"run {Path(run).name} recorded other head kernels than these engines run "
                           f"({', '.join(f'{k}: {a} then {b}' for k, (a, b) in differ.items())}); FRESH=1 starts a new run")
    merged = {**(old or {}), **kernels}
    if merged != old:
        cfg["kernels"] = merged
        tmp = path.with_name(f"config.json.{os.getpid()}.tmp")                # shards may write at once: whole files
        tmp.write_text(json.dumps(cfg, indent=1, default=str))
        tmp.replace(path)


def finished(run: Path) -> bool:
    return (run / "DONE").exists()


def mark_finished(run: Path) -> None:
    (run / "DONE").write_text(json.dumps({"finished": now(), "commit": git_commit()}))


def finish_time(run: Path) -> str:
    """When the run finished, from its DONE file (ISO time; older runs wrote the bare time)."""
    text = (run / "DONE").read_text().strip()
    return json.loads(text)["finished"] if text.startswith("{") else text


def run_order_key(run: Path) -> tuple[str, int]:
    """Start order of runs: the UTC stamp in the name, then the same-second suffix as a number."""
    stamp, _, suffix = run.name.split("-", 1)[1].partition("-")
    return stamp, int(suffix or 0)


def runs_of(out_dir: Path, name: str = "e2e") -> list[Path]:
    """Run directories of that name, in the order they were started."""
    return sorted((p for p in (Path(out_dir) / "runs").glob(f"{name}-*") if (p / "config.json").exists()),
                  key=run_order_key)


def latest_run(out_dir: Path, name: str = "e2e") -> Path:
    """The finished run that finished last (by the time written in DONE, not file times)."""
    runs = [p for p in runs_of(out_dir, name) if finished(p)]
    if not runs:
        raise FileNotFoundError(f"no finished {name} run under {out_dir}/runs: run notebook 03 first")
    return max(runs, key=lambda p: (finish_time(p), run_order_key(p)))


def run_config(profile: Profile, prompt_ids: list[int], device: dict) -> dict:
    return {"profile": as_dict(profile), "device": device, "prompts": prompt_ids}


def config_differences(saved: dict, config: dict) -> list[str]:
    """What differs between a run's saved configuration and `config` among what the end-to-end samples depend
    on: the profile (less the side studies' settings), the devices and the prompts."""
    def e2e_part(c: dict) -> dict:
        c = json.loads(json.dumps(c, default=str))
        side = {k: v for k, v in c["profile"].items() if k not in ("peers", "sampling")}
        side.pop("side_studies", None)
        side["prompts"] = {k: v for k, v in side.get("prompts", {}).items() if k not in ("side_prompts", "side_studies")}
        return {**c, "profile": side}
    a, b = e2e_part(saved), e2e_part(config)
    return [k for k in ("profile", "device", "prompts") if a.get(k) != b.get(k)]


class ResumeRefused(RuntimeError):
    """An unfinished run of this configuration was started by other code than this checkout's."""


def resumable_run(out_dir: Path, config: dict) -> Path | None:
    """The latest run of the same configuration that is unfinished, or finished at this very commit (a clean
    one: its samples are what this code would measure), if any. An unfinished one started at another commit
    (or by uncommitted code) would mix code versions in one run: refused, unless RESUME_ANY_COMMIT=1."""
    commit = clean_commit()
    same = [p for p in runs_of(out_dir) if (not finished(p) or commit is not None and run_commit(p) == commit) and
            not config_differences(json.loads((p / "config.json").read_text()), config)]
    if not same:
        return None
    run, started = same[-1], run_commit(same[-1])
    if not finished(run) and (commit is None or started != commit) and os.environ.get("RESUME_ANY_COMMIT") != "1":
        raise ResumeRefused(f"run {run.name} was started at commit {started}, this checkout is {git_commit()}: "
                            "resuming would mix code versions; FRESH=1 starts a new run (RESUME_ANY_COMMIT=1 "
                            "resumes it anyway)")
    return run


def reused_run(out_dir: Path, name: str, config: dict) -> Path:
    """A finished run named by the user, checked to be of this configuration (profile, devices, prompts)."""
    run = out_dir / "runs" / name
    if not finished(run):
        raise ValueError(f"reuse={name!r}: no finished run of that name in {out_dir / 'runs'}")
    saved = json.loads((run / "config.json").read_text())
    differ = config_differences(saved, config)
    if differ:
        raise ValueError(f"reuse={name!r}: that run's {', '.join(differ)} differ from this configuration's")
    note(f"reusing finished run {name} (measured at commit {saved.get('commit', 'unknown')}; nothing is measured now)")
    return run


def run_commit(run: Path) -> str:
    return json.loads((run / "config.json").read_text()).get("commit", "unknown")


def start_or_resume(profile: Profile, config: dict, fresh: bool = False) -> tuple[Path, bool]:
    """(run directory, resumed?): the latest unfinished run of the same configuration (or one finished at
    this commit) unless fresh."""
    run = None if fresh else resumable_run(profile.out_dir, json.loads(json.dumps(config, default=str)))
    if run is not None:                                                # the run records each time it is resumed
        cfg = json.loads((run / "config.json").read_text())
        cfg.setdefault("resumed", []).append({"at": now(), "commit": git_commit(), "samples": len(read_records(run))})
        (run / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
        return run, True
    return new_run(profile.out_dir, config), False


def read_records(run: Path) -> list[dict]:
    """All records of a run: samples.jsonl plus any shard files not merged yet."""
    return [json.loads(line) for path in sorted(Path(run).glob("samples*.jsonl")) if path.is_file()
            for line in path.read_text().splitlines() if line.strip()]


def append_record(run: Path, record: dict, shard: tuple[int, int] = (0, 1)) -> None:
    """Append one sample; shards of an array each write their own file (no concurrent appends)."""
    if finished(run):
        raise RuntimeError(f"{run} is a finished run; start a new one instead of adding to it")
    name = "samples.jsonl" if shard[1] == 1 else f"samples.shard{shard[0]:03d}of{shard[1]:03d}.jsonl"
    with open(Path(run) / name, "a") as f:
        f.write(json.dumps(record) + "\n")


def merge_records(run: Path, records: list[dict]) -> None:
    """Write the one results set samples.jsonl and drop the shard files it now holds."""
    tmp = Path(run) / "samples.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    for path in Path(run).glob("samples.shard*.jsonl"):
        path.unlink()
    tmp.replace(Path(run) / "samples.jsonl")


def finish_run(run: Path) -> list[dict]:
    """Mark exact matches against the baseline's greedy output, then close the run."""
    recs = read_records(run)
    ref = {(r["iteration"], r["question_id"]): r["tokens"] for r in recs if r["mode"] == modes.BASELINE}
    for r in recs:
        r["exact_match"] = r["tokens"] == ref.get((r["iteration"], r["question_id"]))
    merge_records(run, recs)
    mark_finished(run)
    return recs


# ---------------------------------------------------------------- samples

def mode_order(profile: Profile) -> list[tuple]:
    d = profile.decode
    return modes.run_order(d.modes, d.schedules, d.k_policies)


def sample_keys(profile: Profile, n_prompts: int) -> list[tuple]:
    """(iteration, prompt index, draft, schedule, k_policy) in run order; the mode order rotates per sample."""
    order = mode_order(profile)
    keys = []
    for it in range(profile.bench.e2e_iters):
        for i in range(n_prompts):
            r = (it * n_prompts + i) % len(order)
            keys += [(it, i, *m) for m in order[r:] + order[:r]]
    return keys


def pending_keys(profile: Profile, run: Path, question_ids: list[int], shard: tuple[int, int] = (0, 1)) -> list:
    """Sample keys of this shard (every n-th prompt from i) that the run has no record of yet."""
    done = {(r["iteration"], r["question_id"], r["mode"]) for r in read_records(run)}
    return [k for k in sample_keys(profile, len(question_ids)) if k[1] % shard[1] == shard[0]
            and (k[0], question_ids[k[1]], modes.name(*k[2:])) not in done]


def generate(target, drafts: dict, profile: Profile, ids: list[int], draft: str, schedule: str | None,
             k_policy: str | None = modes.FIXED, stop: frozenset = frozenset(), costs: dict | None = None) -> Result:
    """One sample of one mode; costs: {draft: call costs} for the cost-model block policy."""
    d = profile.decode
    if draft == modes.BASELINE:
        return generate_baseline(target, ids, d.max_new_tokens, stop)
    policy = make_policy(k_policy, d.k, d.k_max, schedule, (costs or {}).get(draft))
    return adaptive.generate(target, drafts[draft], ids, d.max_new_tokens, policy, schedule, stop)   # any draft


def record(res: Result, prompt, ids: list[int], it: int, draft: str, schedule: str | None,
           k_policy: str | None = modes.FIXED) -> dict:
    """The raw per-sample record written to samples.jsonl."""
    spans = res.spans_ms
    calls = sum(v for k, v in spans.items() if k.startswith("call_"))          # model and head calls
    return {
        "mode": modes.name(draft, schedule, k_policy), "draft": draft, "schedule": schedule or modes.BASELINE,
        "k_policy": modes.FIXED if draft == modes.BASELINE else k_policy, "block_lengths": res.block_lengths,
        "question_id": prompt.question_id, "group": prompt.group, "iteration": it, "prompt_tokens": len(ids),
        "ttft_ms": res.ttft_ms, "decode_ms": res.decode_ms, "decode_tokens": res.decode_tokens,
        "rounds": res.rounds, "proposed": res.proposed, "accepted": res.accepted,
        "accepted_lengths": res.accepted_lengths, "verify_calls": res.verify_calls,
        "append_calls": res.append_calls, "skipped": res.skipped, "stopped": res.stopped, "spans_ms": spans,
        "model_call_ms": calls, "tokens": res.tokens, "choices": res.choices, "probe_counts": res.probe_counts,
    }


def run_samples(profile: Profile, run: Path, target, drafts: dict, enc: list, keys: list, stop: frozenset,
                shard: tuple[int, int] = (0, 1), progress: bool = True, costs: dict | None = None) -> None:
    """Warm every mode up on the first prompt (not recorded), then run and append each pending sample."""
    done = len(read_records(run))
    warm = [mode for mode in mode_order(profile) for _ in range(profile.bench.e2e_warmup)]
    for mode in steps(warm, "e2e warm-up", "modes") if progress else warm:
        generate(target, drafts, profile, enc[0][1], *mode, stop, costs)
    for it, i, *mode in steps(keys, "e2e", "samples", before=done) if progress else keys:
        prompt, ids = enc[i]
        res = generate(target, drafts, profile, ids, *mode, stop, costs)
        append_record(run, record(res, prompt, ids, it, *mode), shard=shard)


def launch_slurm(profile: Profile, run: Path, question_ids: list[int], shard_fn, cluster: str) -> None:
    """Run shard_fn(profile, run, shard) for every shard with pending samples, as a Slurm array through
    submitit (cluster 'local' runs the same shards as local processes, for testing). Failed shards are
    reported with their logs; finished samples stay in the run, so calling again resumes."""
    import submitit
    c = profile.slurm
    n = min(c.shards, len(question_ids))
    shards = [(i, n) for i in range(n) if pending_keys(profile, run, question_ids, (i, n))]
    ex = submitit.AutoExecutor(folder=run / "logs" / "%j", cluster=cluster)
    ex.update_parameters(timeout_min=c.timeout_min, gpus_per_node=c.gpus_per_task, slurm_array_parallelism=n,
                         **({"slurm_partition": c.partition} if c.partition and cluster == "slurm" else {}))
    jobs = ex.map_array(shard_fn, [profile] * len(shards), [run] * len(shards), shards)
    failed = []
    for shard, job in zip(shards, steps(jobs, "shards", "jobs")):
        try:
            job.result()
        except Exception as e:                                                     # noqa: BLE001 - reported below
            lines = [ln.strip() for ln in str(e).splitlines() if "Error" in ln] or [repr(e)]
            failed.append(f"shard {shard[0]}/{n} (job {job.job_id}): {lines[-1]}; log: {job.paths.stderr}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(shards)} shards failed; finished samples are kept in {run}. "
                           "Run notebook 03 again (or make reproduce) to resume.\n" + "\n".join(failed))
