"""Notebook 04: reads notebooks 01-03's result files (the latest end-to-end run, clustering.json,
microbench.json, target_step.json and the side studies' files where they ran) and hands them to lib/report,
which makes every table, figure and summary.json from them. Needs no GPU and loads no model."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import modes, results
from ..config import Profile
from ..report import sampling as sampling_report
from ..report.peers import table as peers_table
from ..report.tables import aggregate, first_difference, records_frame, run_kernels
from ..results import finish_time, finished, read_json, read_records, runs_of, side_study_json

# What notebook 04 shows, reached through its one import of this module.
from ..costmodel import (context_projection, head_ratios, model_check, phase_check, projection_grid,  # noqa: F401
                         projections)
from ..report.context import context_plot  # noqa: F401
from ..report.figures import (adaptive_plots, block_length_plot, divergence_gap_plot, figures,  # noqa: F401
                              head_effect_plot, policy_rounds_plot, projection_heatmap)
from ..report.summary_json import acceptance_note, closing_checks, run_source, summary, write_summary  # noqa: F401
from ..report import summary_json
from ..report.tables import (acceptance_by_group, adaptive_tables, block_policies, call_counts,  # noqa: F401
                             divergence_points, identities, overlap, ttft_outliers)
from ..report.micro import head_memory_table  # noqa: F401
from ..report.thesis import e2e_tables, micro_tables, save_tables, side_by_side, thesis_consistency  # noqa: F401
from .adaptive import E2E_SOURCE, run_rows
from .common import setup  # noqa: F401


def latest_run(profile: Profile, name: str = "") -> Path:
    """The run notebook 04 analyses: the finished run `name` under runs/ (its parameter `run`), else the last finished
    one of the profile's end-to-end settings, the run notebook 03 made or reused (results.latest_run)."""
    if not name:
        return results.latest_run(profile.out_dir, profile=profile)
    runs = profile.out_dir / "runs"
    if Path(name).name != name or not finished(runs / name):
        raise ValueError(f"run={name!r}: no finished run of that name in {runs}")
    if not results.of_e2e_settings(runs / name, profile):
        raise ValueError(f"run={name!r}: its end-to-end settings differ from profile {profile.name!r}'s")
    return runs / name


def run_frames(run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's raw records as a frame (report.tables.records_frame) and their per-mode aggregate, with the head
    kernel that picked each mode's tokens (from the run's config.json)."""
    df = records_frame(read_records(run))
    return df, aggregate(df, run_kernels(run))


def optional_json(profile: Profile, name: str) -> dict | None:
    """The profile's result file `name`, or None where the step that writes it did not run."""
    return read_json(profile, name) if (profile.out_dir / name).exists() else None


def sampling_against_greedy(profile: Profile, agg: pd.DataFrame, df: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """sampling.json's acceptance, mean emitted and decode tok/s per mode and temperature beside the greedy run's
    (temperature 0: with the run's records `df`, on the prompts the study sampled; else `agg`, all the run's
    prompts); None without the sampling study."""
    data = side_study_json(profile, "sampling")
    return None if data is None else sampling_report.against_greedy(data, agg, df)


def adaptive_results(profile: Profile, run: Path) -> dict | None:
    """adaptive.json (notebook 03's adaptive probes and bandit drafters), or None without the study; its end-to-end
    rows (each adaptive policy against its best fixed setting) are the analysed run's, made here: the file holds those
    of the run that was newest when notebook 03 ran."""
    ad = side_study_json(profile, "adaptive")
    if ad is None:
        return None
    side = [r for r in ad["policies"] if not str(r.get("source", "")).startswith(E2E_SOURCE)]
    return {**ad, "e2e_run": Path(run).name, "policies": side + run_rows(Path(run))}


def extra_summary(profile: Profile, ad: dict | None) -> dict:
    """summary.json's profile-specific sections (report.summary_json.extra_summary), the adaptive one as
    adaptive_results gave it (`ad`: with the analysed run's end-to-end rows)."""
    out = summary_json.extra_summary(profile)
    if ad is not None and "adaptive" in out:
        out["adaptive"].update(e2e_run=ad["e2e_run"], policies=ad["policies"])
    return out


def divergences(profile: Profile, df: pd.DataFrame) -> pd.DataFrame:
    """divergences.json's rows for the samples of the run in `df` that leave the baseline, each at the position where
    that sample leaves it (none: an empty frame). The file is notebook 03's last measurement, which may be of an
    earlier run (a run reused without its target, say): its other rows are left out."""
    data = optional_json(profile, "divergences.json")
    rows = pd.DataFrame(data["divergences"]) if data is not None else pd.DataFrame()
    if rows.empty:
        return rows
    base = {(r.iteration, r.question_id): r.tokens for r in df[df["mode"] == modes.BASELINE].itertuples()}
    leaves = {(r.mode, r.iteration, r.question_id): first_difference(r.tokens, base.get((r.iteration, r.question_id)))
              for r in df[~df.exact_match.astype(bool)].itertuples()}
    keep = [leaves.get((r.mode, r.iteration, r.question_id)) == r.position for r in rows.itertuples()]
    return rows[keep].reset_index(drop=True)



def no_side_study(profile: Profile, name: str) -> str:
    """What notebook 04 says where a side study's file is missing or not read (results.side_study_json): the profile
    does not run it (a file from other settings says so), or notebook 03 has not run it yet."""
    left = (profile.out_dir / f"{name}.json").exists()
    other = f" ({name}.json here is from other settings and is not shown)" if left else ""
    if name not in profile.side_studies:
        return f"no {name} study: this profile's side_studies leave it out{other}"
    return (f"no {name} study {'of these settings' if left else 'yet'}: notebook 03 runs it (this profile's "
            f"side_studies list it) and writes {name}.json{other}")


def peers(profile: Profile, agg: pd.DataFrame, run_device: str | None = None,
          df: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """peers.json's methods beside notebook 03's baseline and fastest speculative mode (timed on `run_device`): with
    the run's records `df`, its samples of the prompts the peers ran (the first prompts.side_prompts), else `agg`, the
    run over all its prompts. None without peers.json."""
    data = side_study_json(profile, "peers")
    return None if data is None else peers_table(data, agg, run_device, df)


RATIOS = " flash/dense"                 # subset_runs' key of a run's FlashHead/dense ratios: <run name> + RATIOS


def newest_ratios(run: Path, ratios: pd.DataFrame, subsets: dict[str, pd.DataFrame]) -> tuple[str, pd.DataFrame]:
    """(name, FlashHead/dense ratios) of the run that finished last: the e2e run `run` (its `ratios`) or one of
    subset_runs' runs, so that the figure beside notebook 02's draft step shows the newest end-to-end run."""
    found = {run.name: (finish_time(run), ratios)}
    for name, tab in subsets.items():
        if name.endswith(RATIOS):
            sub = name.removesuffix(RATIOS)
            found[sub] = (finish_time(run.parent / sub), tab)
    name = max(found, key=lambda n: found[n][0])
    return name, found[name][1]


def subset_runs(profile: Profile, micro: dict, target_step: dict, name: str = "fused-draft") -> dict[str, pd.DataFrame]:
    """Finished runs of a subset of modes named `name`-* (runs/fused-draft-*: the fused draft end to end, written
    where notebook 03's full run did not fit a session's device time): per run, each mode's decode tok/s,
    acceptance and exact-match rate beside the cost model's prediction from this profile's microbench.json and
    target_step.json, then FlashHead over dense per schedule, measured and modelled."""
    out = {}
    for run in runs_of(profile.out_dir, name):
        if finished(run):
            agg = run_frames(run)[1]
            check = model_check(agg, micro, target_step, profile.decode.k)
            out[run.name] = check.join(agg[["acceptance", "exact_match_rate"]])
            out[run.name + RATIOS] = head_ratios(check)
    return out
