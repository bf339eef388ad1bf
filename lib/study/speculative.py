"""Notebook 03: the end-to-end speculative runs (raw records, resume, Slurm shards), decoded samples,
where outputs leave the baseline and why, and the side studies (peers, sampling, adaptive drafts, batch invariance,
longer contexts)."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import modes, results
from ..config import Profile
from ..engine.runner import Runner
from ..models import build as engines, checkpoints
from ..models.flash_checkpoint import ensure_flash_checkpoint
from ..progress import note, steps
from ..report.tables import first_difference
from ..results import save_json
from . import runs
from .adaptive import adaptive_study
from .context_lengths import context_study
from .invariance import invariance_study
from .common import call_costs, device_info, encoded_prompts, side_prompts, stop_tokens

# What notebook 03 shows, reached through its one import of this module.
from ..models.checkpoints import load_target  # noqa: F401
from ..report.context import context_table  # noqa: F401
from ..report.peers import table as peers_table  # noqa: F401
from ..report.tables import acceptance_counts, exact_match_rates, invariance_tables, records_frame  # noqa: F401
from ..results import read_json, read_records  # noqa: F401
from .common import setup, side_studies  # noqa: F401
from .microbench import target_step_bench  # noqa: F401


def run_speculative(profile: Profile, launcher: str = "local", target_model=None, fresh: bool = False,
                    reuse: str = "") -> Path:
    """Notebook 03's sample set (prompts x iterations x modes), raw JSONL beside the configuration, here
    (local) or sharded by prompt over a Slurm array (slurm; submitit-local runs the shards as local
    processes). Resumes the latest unfinished run of the same configuration unless fresh; finishes it.
    reuse: the name of a finished run of the same configuration to take as it is (nothing is measured)."""
    if launcher not in modes.LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}: use one of {list(modes.LAUNCHERS)}")
    enc = encoded_prompts(profile)
    qids = [p.question_id for p, _ in enc]
    if reuse:
        run = runs.reused_run(profile.out_dir, reuse, runs.run_config(profile, qids, device_info(profile)))
        try:
            latest = results.latest_run(profile.out_dir, profile=profile)
        except FileNotFoundError:                           # a run renamed by hand: not among runs_of's e2e-* runs
            latest = None
        if latest is None or latest.resolve() != run.resolve():
            note(f"notebook 04 analyses the latest finished run of these settings"
                 f"{f', {latest.name}' if latest else ''}: to analyse {run.name} there, give it the parameter "
                 f"run={run.name!r}")
        return run
    run, resumed = runs.start_or_resume(profile, runs.run_config(profile, qids, device_info(profile)), fresh)
    done = len(results.read_records(run))
    state = ("reusing finished" if results.finished(run) else "resuming") if resumed else "new"
    note(f"{state} run {run.name}" + (f" ({done} samples already recorded)" if resumed else ""))
    if launcher == "local":
        run_shard(profile, run, (0, 1), target_model)
    else:
        runs.launch_slurm(profile, run, qids, run_shard, {"slurm": "slurm", "submitit-local": "local"}[launcher])
    if not results.finished(run):
        runs.finish_run(run)
    return run


def run_shard(profile: Profile, run: Path, shard: tuple[int, int] = (0, 1), target_model=None) -> None:
    """The pending samples of one shard (every n-th prompt from i) of a run (a Slurm array task's work)."""
    enc = encoded_prompts(profile)
    keys = runs.pending_keys(profile, run, [p.question_id for p, _ in enc], shard)
    if not keys:
        return
    ensure_flash_checkpoint(profile)
    target, drafts = engines.build_engines(profile, target_model=target_model)
    runs.record_kernels(run, engines.kernels(target, drafts))              # which head kernels the samples use
    runs.record_kernels(run, engines.bodies(target, drafts), "bodies")      # and which single-token bodies
    runs.record_kernels(run, engines.layer_paths(target, drafts), "layers")  # and their layers' kernels
    costs = call_costs(profile) if modes.COST in profile.decode.k_policies else None
    runs.run_samples(profile, run, (target, drafts, stop_tokens(profile), costs), enc, keys, shard)


def decoded_samples(profile: Profile, records: list[dict], n: int = 3):
    """The text of the first n prompts' outputs, baseline beside every speculative mode (first iteration)."""
    import pandas as pd
    tok = checkpoints.load_tokenizer(profile)
    qids = list(dict.fromkeys(r["question_id"] for r in records))[:n]
    rows = [{"question_id": r["question_id"], "mode": r["mode"], "exact_match": r.get("exact_match"),
             "text": tok.decode(r["tokens"])} for r in records if r["question_id"] in qids and r["iteration"] == 0]
    return pd.DataFrame(rows).sort_values(["question_id", "mode"], key=lambda c: c.map(str)).reset_index(drop=True)


@torch.no_grad()
def divergences(profile: Profile, records: list[dict], target_model) -> list[dict]:
    """For every sample whose output differs from the baseline's: the first divergent position and the
    target's top-1 minus top-2 logit gap there, with the shared prefix fed one token at a time (as the
    baseline feeds it) and in one batch (as a verify call does). A near-tie of low-precision arithmetic
    shows as a gap of a few ulps of the logits; a defect as a large gap. Written to divergences.json.
    Modes that leave the baseline at the same point share one measurement of its gaps."""
    enc = {p.question_id: ids for p, ids in encoded_prompts(profile)}
    base = {(r["iteration"], r["question_id"]): r["tokens"] for r in records if r["draft"] == modes.BASELINE}
    runner = Runner(target_model, engines.cache_len(profile))
    W = target_model.get_output_embeddings().weight
    measured: dict[tuple, dict] = {}                                    # (iteration, question, position) -> gaps
    out = []
    for r in steps(records, "divergences", "samples"):
        ref = base.get((r["iteration"], r["question_id"]))
        if r.get("exact_match", True) or ref is None:
            continue
        j = first_difference(r["tokens"], ref)
        point = (r["iteration"], r["question_id"], j)
        if point not in measured:
            measured[point] = logit_gaps(runner, W, enc[r["question_id"]], ref[:j])
        out.append({"mode": r["mode"], "question_id": r["question_id"], "iteration": r["iteration"], "position": j,
                    "baseline_token": ref[j] if j < len(ref) else None,
                    "mode_token": r["tokens"][j] if j < len(r["tokens"]) else None, **measured[point]})
    save_json(profile, "divergences.json", {"dtype": profile.dtype, "divergences": out})
    return out


def logit_gaps(runner: Runner, W: torch.Tensor, prompt: list[int], shared: list[int]) -> dict:
    """The target's top-1 minus top-2 logit after prompt + shared, fed stepwise and in one batch."""
    ids, dev = prompt + shared, W.device
    h_batch = runner.forward(torch.tensor([ids], device=dev), 0, graph=False)[0, -1]
    h_step = runner.forward(torch.tensor([prompt], device=dev), 0, graph=False)[0, -1]
    for pos in range(len(prompt), len(ids)):                            # one token at a time
        h_step = runner.forward(torch.tensor([[ids[pos]]], device=dev), pos, graph=False)[0, -1]
    gaps = {}
    for name, h in (("stepwise", h_step), ("batched", h_batch)):
        top = (h @ W.T).float().topk(2).values
        gaps[f"gap_{name}"] = float(top[0] - top[1])
    return gaps


def peer_study(profile: Profile, target_model=None) -> dict:
    """Hugging Face generate() (greedy, static cache, assisted with the dense draft, prompt lookup) beside this
    engine's baseline on the same prompts, device, token budget and stop tokens (lib/study/peers.py): peers.json."""
    from . import peers
    data = peers.run(profile, side_prompts(profile), stop_tokens(profile), target_model)
    save_json(profile, "peers.json", data)
    return data


def sampling_study(profile: Profile, target_model=None) -> dict:
    """Target-only sampling and speculative sampling with each draft and schedule of the profile, at each of
    sampling.temperatures (lib/study/sampling.py); saves sampling.json and returns it."""
    from . import sampling as ss
    ensure_flash_checkpoint(profile)
    target, drafts = engines.build_engines(profile, target_model=target_model)
    # Sampling verifies through the target's hidden states: capture those call lengths now too (on h100 one
    # length first met inside a timed sample had cost it 3.7 s, in the run at 6a4ba48).
    target.runner.warm("hidden", range(1, profile.decode.k + 2))
    samples = ss.run(profile, target, drafts, side_prompts(profile), stop_tokens(profile))
    data = ss.result(profile, samples, device_info(profile))
    save_json(profile, "sampling.json", data)
    return data


def side_study(profile: Profile, name: str, target_model, keep: bool = False) -> dict | None:
    """Notebook 03's side study `name` (modes.SIDE_STUDIES), measured with the loaded target, or None where no
    target is loaded here (slurm: the shards load their own). keep: take <name>.json as it is if this very
    commit wrote it (an earlier device call, say)."""
    if target_model is None:
        return None
    kept = keep and results.kept_json(profile, f"{name}.json")
    study = {"sampling": sampling_study, "adaptive": adaptive_study, "peers": peer_study,
             "invariance": invariance_study, "context": context_study}[name]
    return kept or study(profile, target_model)
