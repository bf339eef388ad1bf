"""Run management for notebook 03: new run directories, resume, Slurm shards and per-sample records
(lib/results.py reads them back)."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from .. import modes
from ..engine.blocks import make_policy
from ..config import Profile, as_dict
from ..results import (clean_commit, e2e_settings, finished, git_commit, now, read_config, read_records, runs_of,
                       write_whole)
from ..progress import note, steps
from ..engine.speculative import Request, Result, generate_baseline, generate_speculative


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


def record_kernels(run: Path, kernels: dict, key: str = "kernels") -> None:
    """Add which kernel path picks each engine's tokens (lib/models/build.py: kernels, {"target": ..., <draft>: ...}) to
    the run's config.json under `kernels` (key="bodies": which path runs each engine's single-token body, build.bodies;
    key="layers": how each engine's multi-token calls attend and normalise, build.layer_paths),
    once its engines are built. A run records them before its first sample; one started by older code with samples
    and no record stays unrecorded. Samples of one run never come from other kernels than those it recorded: a
    difference stops with one line."""
    path = Path(run) / "config.json"
    cfg = json.loads(path.read_text())
    old = cfg.get(key)
    if old is None and read_records(run):
        note(f"run {Path(run).name} has samples from before its {key} were recorded: they stay unrecorded")
        return
    differ = {k: (old[k], v) for k, v in kernels.items() if old and k in old and old[k] != v}
    if differ:
        raise RuntimeError(f"run {Path(run).name} recorded other {key} than these engines run "
                           f"({', '.join(f'{k}: {a} then {b}' for k, (a, b) in differ.items())}); FRESH=1 starts a new run")
    merged = {**(old or {}), **kernels}
    if merged != old:
        cfg[key] = merged
        tmp = path.with_name(f"config.json.{os.getpid()}.tmp")                # shards may write at once: whole files
        tmp.write_text(json.dumps(cfg, indent=1, default=str))
        tmp.replace(path)


def mark_finished(run: Path) -> None:
    (run / "DONE").write_text(json.dumps({"finished": now(), "commit": git_commit()}))


def run_config(profile: Profile, prompt_ids: list[int], device: dict) -> dict:
    return {"profile": as_dict(profile), "device": device, "prompts": prompt_ids}


def config_differences(saved: dict, config: dict) -> list[str]:
    """What differs between a run's saved configuration and `config` among what the end-to-end samples depend
    on: the profile (less the side studies' settings), the devices and the prompts."""
    a, b = e2e_settings(saved), e2e_settings(config)
    return [k for k in ("profile", "device", "prompts") if a.get(k) != b.get(k)]


class ResumeRefused(RuntimeError):
    """An unfinished run of this configuration was started by other code than this checkout's."""


def resumable_run(out_dir: Path, config: dict) -> Path | None:
    """The latest run of the same configuration that is unfinished, or finished at this very commit (a clean
    one: its samples are what this code would measure), if any. An unfinished one started at another commit
    (or by uncommitted code) would mix code versions in one run: refused, unless RESUME_ANY_COMMIT=1."""
    commit = clean_commit()
    same = [p for p in runs_of(out_dir) if (not finished(p) or commit is not None and run_commit(p) == commit) and
            not config_differences(read_config(p), config)]
    if not same:
        return None
    run, started = same[-1], run_commit(same[-1])
    if not finished(run) and (commit is None or started != commit) and os.environ.get("RESUME_ANY_COMMIT") != "1":
        here = git_commit()
        why = (f"run {run.name} was started by uncommitted code ({started}, as this checkout is), which cannot be "
               "checked to be this code" if started == here else
               f"run {run.name} was started at commit {started}, this checkout is {here}")   # both '+dirty' above
        raise ResumeRefused(f"{why}: resuming would mix code versions; FRESH=1 starts a new run (RESUME_ANY_COMMIT=1 "
                            "resumes it anyway)")
    return run


def reused_run(out_dir: Path, name: str, config: dict) -> Path:
    """A finished run named by the user, checked to be of this configuration (profile, devices, prompts)."""
    run = out_dir / "runs" / name
    if Path(name).name != name or not finished(run):
        raise ValueError(f"reuse={name!r}: no finished run of that name in {out_dir / 'runs'}")
    saved = read_config(run)
    differ = config_differences(saved, config)
    if differ:
        raise ValueError(f"reuse={name!r}: that run's {', '.join(differ)} differ from this configuration's")
    note(f"reusing finished run {name} (measured at commit {saved.get('commit', 'unknown')}; nothing is measured now)")
    return run


def run_commit(run: Path) -> str:
    return read_config(run).get("commit", "unknown")


def start_or_resume(profile: Profile, config: dict, fresh: bool = False) -> tuple[Path, bool]:
    """(run directory, resumed?): the latest unfinished run of the same configuration (or one finished at
    this commit) unless fresh."""
    run = None if fresh else resumable_run(profile.out_dir, json.loads(json.dumps(config, default=str)))
    if run is not None and finished(run):                              # reused as it is: a finished run is never written
        return run, True
    if run is not None:                                                # the run records each time it is resumed
        cfg = json.loads((run / "config.json").read_text())
        cfg.setdefault("resumed", []).append({"at": now(), "commit": git_commit(), "samples": len(read_records(run))})
        write_whole(run / "config.json", json.dumps(cfg, indent=1, default=str))       # a torn one would end resuming
        return run, True
    return new_run(profile.out_dir, config), False


def append_record(run: Path, record: dict, shard: tuple[int, int] = (0, 1)) -> None:
    """Append one sample; shards of an array each write their own file (no concurrent appends)."""
    if finished(run):
        raise RuntimeError(f"{run} is a finished run; start a new one instead of adding to it")
    name = "samples.jsonl" if shard[1] == 1 else f"samples.shard{shard[0]:03d}of{shard[1]:03d}.jsonl"
    with open(Path(run) / name, "a") as f:
        f.write(json.dumps(record) + "\n")


def merge_records(run: Path, records: list[dict]) -> None:
    """Write the one results set samples.jsonl and drop the shard files it now holds (in that order: stopped
    between the two, the run reads a record twice, which finish_run keeps once, never none)."""
    tmp, shards = Path(run) / "samples.jsonl.tmp", list(Path(run).glob("samples.shard*.jsonl"))
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(Path(run) / "samples.jsonl")
    for path in shards:
        path.unlink()


def finish_run(run: Path) -> list[dict]:
    """Mark exact matches against the baseline's greedy output, then close the run. A sample recorded twice (a
    shard that ran again before its first job ended) keeps its first record."""
    seen, recs = set(), []
    for r in read_records(run):
        if record_key(r) not in seen:
            seen.add(record_key(r))
            recs.append(r)
    ref = {(r["iteration"], r["question_id"]): r["tokens"] for r in recs if r["mode"] == modes.BASELINE}
    for r in recs:
        r["exact_match"] = r["tokens"] == ref.get((r["iteration"], r["question_id"]))
    merge_records(run, recs)
    mark_finished(run)
    return recs


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


def record_key(record: dict) -> tuple:
    """What a sample is: (iteration, question id, mode)."""
    return record["iteration"], record["question_id"], record["mode"]


def pending_keys(profile: Profile, run: Path, question_ids: list[int], shard: tuple[int, int] = (0, 1)) -> list:
    """Sample keys of this shard (every n-th prompt from i) that the run has no record of yet."""
    done = {record_key(r) for r in read_records(run)}
    return [k for k in sample_keys(profile, len(question_ids)) if k[1] % shard[1] == shard[0]
            and (k[0], question_ids[k[1]], modes.name(*k[2:])) not in done]


def generate(target, drafts: dict, profile: Profile, ids: list[int], mode: tuple, stop: frozenset = frozenset(),
             costs: dict | None = None) -> Result:
    """One sample of one mode (draft, schedule, k_policy); costs: {draft: call costs} for the cost-model block policy."""
    d, (draft, schedule, k_policy) = profile.decode, mode
    if draft == modes.BASELINE:
        return generate_baseline(target, Request(ids, d.max_new_tokens, stop=stop))
    policy = make_policy(k_policy, d.k, d.k_max, schedule, (costs or {}).get(draft))
    return generate_speculative(target, drafts[draft], Request(ids, d.max_new_tokens, schedule, policy, stop))


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
        "append_calls": res.append_calls, "skipped": res.skipped, "launched_ahead": res.launched_ahead,
        "appended_ahead": res.appended_ahead,
        "stopped": res.stopped, "spans_ms": spans,
        "model_call_ms": calls, "tokens": res.tokens, "choices": res.choices, "probe_counts": res.probe_counts,
    }


def run_samples(profile: Profile, run: Path, engines: tuple, enc: list, keys: list, shard: tuple[int, int] = (0, 1),
                progress: bool = True) -> None:
    """Warm the prefill up at every prompt length and every mode up on the first prompt (neither recorded), then
    run and append each pending sample.
    engines: (target, drafts, stop tokens, {draft: call costs} for the cost-model block policy or None)."""
    target, drafts, stop, costs = engines
    done = len(read_records(run))
    target.runner.warm_prefill(len(ids) for _, ids in enc)                    # no timed prefill meets a kernel first
    warm = [mode for mode in mode_order(profile) for _ in range(profile.bench.e2e_warmup)]
    for mode in steps(warm, "e2e warm-up", "modes") if progress else warm:
        generate(target, drafts, profile, enc[0][1], mode, stop, costs)
    for it, i, *mode in steps(keys, "e2e", "samples", before=done) if progress else keys:
        prompt, ids = enc[i]
        res = generate(target, drafts, profile, ids, mode, stop, costs)
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
    try:
        for shard, job in zip(shards, steps(jobs, "shards", "jobs")):
            try:
                job.result()
            except Exception as e:                                                 # noqa: BLE001 - reported below
                lines = [ln.strip() for ln in str(e).splitlines() if "Error" in ln] or [repr(e)]
                failed.append(f"shard {shard[0]}/{n} (job {job.job_id}): {lines[-1]}; log: {job.paths.stderr}")
    except BaseException:                 # interrupted: no job may go on writing into the run a resume will use
        for job in jobs:
            job.cancel(check=False)
        raise
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(shards)} shards failed; finished samples are kept in {run}. "
                           "Run notebook 03 again (or make reproduce) to resume.\n" + "\n".join(failed))
