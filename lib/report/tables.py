"""Notebooks 03-04's tables of a run's raw records: the records as a frame, per-mode aggregates, acceptance
per prompt group, the metric identities, call counts, pipelined against serial, the block-length and adaptive
studies' tables and the divergence points. Pure functions of result files and data frames (the thesis's tables
beside ours: thesis.py; summary.json: summary_json.py; figures: figures.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import modes
from ..modes import DEFERRED, ORDINARY, PIPELINED
from ..results import read_config


def records_frame(records: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    if "k_policy" not in df:                                             # runs made before block policies
        df["k_policy"] = modes.FIXED
        df["block_lengths"] = [[] for _ in range(len(df))]
    for ahead in ("launched_ahead", "appended_ahead"):                   # runs made before launching ahead
        if ahead not in df:
            df[ahead] = 0
    for phase in ("initial", "draft", "verify", "finalize", "transfer", "call_draft_body", "call_draft_head",
                  "call_draft_block", "call_target"):
        df[phase + "_ms"] = [s.get(phase, 0.0) for s in df["spans_ms"]]
    return df


def exact_match_rates(df: pd.DataFrame) -> pd.DataFrame:
    """Per mode: samples and the share whose output equals the baseline's greedy output."""
    return df.groupby("mode", sort=False).agg(samples=("exact_match", "size"), exact_match_rate=("exact_match", "mean"))


def acceptance_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Per speculative mode: the round counters summed, acceptance and mean tokens emitted per round. Modes whose
    counters follow measured timings (modes.follows_timings) are left out: they differ from machine to machine."""
    spec = df[(df["mode"] != modes.BASELINE) & ~df.apply(lambda r: modes.follows_timings(r.draft, r.k_policy), axis=1)]
    acc = spec.groupby("mode", sort=False)[["proposed", "accepted", "rounds", "verify_calls", "append_calls",
                                            "skipped"]].sum()
    acc["acceptance"] = (acc.accepted / acc.proposed).round(3)
    acc["mean_emitted"] = ((acc.accepted + acc.rounds) / acc.rounds).round(3)
    return acc


def aggregate(df: pd.DataFrame, kernels: dict | None = None) -> pd.DataFrame:
    """One row per mode. Decode tok/s = sum of decode tokens / sum of decode time (thesis 4.2);
    acceptance = accepted / proposed; mean emitted = (accepted + rounds) / rounds. head_kernel: the kernel path
    that picked the mode's tokens (the target's for the baseline, else the draft's), from the run's recorded
    `kernels` (run_kernels), "unrecorded" where it has none.

    Engine overhead is the share of decode time outside model and head calls, 1 - model_call_ms / decode_ms,
    clamped at 0: where calls overlap (the pipelined schedule's target append runs beside the draft on its
    own stream) their summed time can exceed the wall time, and the clamped value is then a lower bound.
    The overlap is reported beside it: overlap_ms = max(model_call_ms - decode_ms, 0), the least call time
    that ran beside other calls (the spans record sums, not the union of their intervals), and
    overlap_frac = overlap_ms / decode_ms."""
    g = df.groupby("mode", sort=False)
    parts = g[["draft", "schedule", "k_policy"]].first()
    s = g[["decode_tokens", "decode_ms", "accepted", "proposed", "rounds", "verify_calls", "append_calls", "skipped",
           "launched_ahead", "appended_ahead", "initial_ms", "draft_ms", "verify_ms", "finalize_ms",
           "call_draft_body_ms", "call_draft_head_ms", "call_draft_block_ms", "call_target_ms", "model_call_ms",
           "transfer_ms"]].sum()
    out = pd.DataFrame({
        "mean_block": (s.proposed / s.rounds).where(s.rounds > 0, 0.0),   # the block lengths' mean (runs made
                                                                          # before block policies recorded none)
        "draft": parts.draft, "schedule": parts.schedule, "k_policy": parts.k_policy,
        "samples": g.size(),
        "decoded": g.rounds.agg(lambda r: int((r > 0).sum())),             # generations past their first token
        "decode_tok_s": 1000 * s.decode_tokens / s.decode_ms,
        "ttft_ms": g.ttft_ms.mean(),
        "decode_total_ms": s.decode_ms,
        "acceptance": (s.accepted / s.proposed).where(s.proposed > 0),
        "mean_emitted": ((s.accepted + s.rounds) / s.rounds).where(s.rounds > 0),
        "rounds": s.rounds, "verify_calls": s.verify_calls, "append_calls": s.append_calls, "skipped": s.skipped,
        "launched_ahead": s.launched_ahead, "appended_ahead": s.appended_ahead,
        "ms_per_round": (s.decode_ms / s.rounds).where(s.rounds > 0),
        "initial_ms": s.initial_ms, "draft_ms": s.draft_ms, "verify_ms": s.verify_ms, "finalize_ms": s.finalize_ms,
        "draft_body_ms": s.call_draft_body_ms, "draft_head_ms": s.call_draft_head_ms,
        "draft_block_ms": s.call_draft_block_ms, "transfer_ms": s.transfer_ms,
        "exact_match_rate": g.exact_match.mean(),
        "model_call_ms": s.model_call_ms, "target_call_ms": s.call_target_ms,
        "engine_overhead_frac": (1 - s.model_call_ms / s.decode_ms).clip(lower=0),
        "overlap_ms": (s.model_call_ms - s.decode_ms).clip(lower=0),
        "overlap_frac": (s.model_call_ms - s.decode_ms).clip(lower=0) / s.decode_ms,
    })
    for phase in ("initial", "draft", "verify", "finalize"):
        out[phase + "_share"] = out[phase + "_ms"] / out.decode_total_ms
    out["head_kernel"] = [kernel_of(d, kernels) for d in out.draft]
    return out.reindex([m for m in modes.LABELS if m in out.index])


def run_kernels(run: Path) -> dict:
    """The run's recorded head kernel per engine ({"target": ..., <draft>: ...}; {} for runs made before they were
    recorded), from its config.json."""
    return read_config(run).get("kernels", {})


def kernel_of(draft: str, kernels: dict | None) -> str:
    """The kernel path that picked a mode's tokens: the target's for the baseline, else its draft's."""
    return (kernels or {}).get("target" if draft == modes.BASELINE else draft, "unrecorded")


TTFT_OUTLIER = 10.0      # x the run's median TTFT: a first use (12-28x in the GPU runs before 5726e5a), not a long prompt


def ttft_outliers(df: pd.DataFrame, factor: float = TTFT_OUTLIER) -> pd.DataFrame:
    """The samples whose time to first token is over `factor` times the run's median: a prefill that met a kernel for
    the first time (built or loaded inside the timed prefill; every GPU run made before 5726e5a has one or two). Each
    beside its mode's mean TTFT with and without it, the figure tables 4.5 and 4.9 show."""
    cols = ["mode", "question_id", "prompt_tokens", "ttft_ms", "run_median_ms", "mode_mean_ms", "mode_mean_without_ms"]
    med = df.ttft_ms.median()
    rows = [[r.mode, r.question_id, r.prompt_tokens, r.ttft_ms, med, df.ttft_ms[df["mode"] == r.mode].mean(),
             df.ttft_ms[(df["mode"] == r.mode) & (df.index != r.Index)].mean()]
            for r in df[df.ttft_ms > factor * med].itertuples()]
    return pd.DataFrame(rows, columns=cols)


def acceptance_by_group(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Acceptance (accepted / proposed, pooled) and mean emitted per speculative mode and prompt group, with
    a 95% bootstrap interval over prompts (a sample's rounds are not independent draws, nor are the iterations of
    one prompt: greedy decoding repeats its tokens), none from a single prompt, and over all groups."""
    rng = np.random.default_rng(seed)
    rows = []
    spec = df[df["mode"] != modes.BASELINE]
    for (mode, group), g in list(spec.groupby(["mode", "group"], sort=False)) + \
            [((m, "all"), g) for m, g in spec.groupby("mode", sort=False)]:
        per = g.groupby("question_id", sort=False)[["accepted", "proposed"]].sum()      # one draw a prompt
        acc, prop = per.accepted.to_numpy(float), per.proposed.to_numpy(float)
        idx = rng.integers(0, len(per), (n_boot, len(per)))
        boot = acc[idx].sum(1) / np.maximum(prop[idx].sum(1), 1)
        low, high = np.percentile(boot, [2.5, 97.5]) if len(per) > 1 else (np.nan, np.nan)
        rows.append({"mode": mode, "group": group, "samples": len(g), "acceptance": acc.sum() / max(prop.sum(), 1),
                     "ci_low": low, "ci_high": high,
                     "mean_emitted": (g.accepted.sum() + g.rounds.sum()) / max(g.rounds.sum(), 1)})
    return pd.DataFrame(rows).set_index(["mode", "group"])


def identities(df: pd.DataFrame) -> pd.DataFrame:
    """Per-record checks of the metric definitions against the raw counters."""
    spec = df[df["mode"] != modes.BASELINE]
    lens = spec.accepted_lengths
    checks = {
        "accepted == sum of accepted lengths": (spec.accepted == lens.map(sum)).all(),
        "decode tokens == sum of (accepted + 1) per round": (spec.decode_tokens == lens.map(lambda a: sum(a) + len(a))).all(),
        "rounds == number of accepted lengths": (spec.rounds == lens.map(len)).all(),
        "accepted <= proposed": (spec.accepted <= spec.proposed).all(),
        "ordinary/pipelined: append calls == rounds": (spec[spec.schedule != DEFERRED].eval("append_calls == rounds")).all(),
        "deferred: append calls == 1 where rounds > 0":
            spec[spec.schedule == DEFERRED].eval("append_calls == (rounds > 0)").all(),
        "verify calls + skipped <= rounds": (spec.verify_calls + spec.skipped <= spec.rounds).all(),
        "baseline: append calls == decode tokens": (df[df["mode"] == modes.BASELINE].eval("append_calls == decode_tokens")).all(),
        "tokens = the first + decode tokens": (df.tokens.map(len) == df.decode_tokens + 1).all(),
    }
    return pd.DataFrame({"identity": list(checks), "holds": [bool(v) for v in checks.values()]})


def overlap(agg: pd.DataFrame) -> pd.DataFrame:
    """Pipelined vs serial ordinary, per draft: the decode time the overlapped target append saved, and
    the most it could save, min(sum of finalize, sum of draft proposal) of the serial run (a round
    costs at least max(finalize, prepare)), each per round. One row per draft and block policy (named after the
    draft, '<draft>_<policy>' for an adaptive one) that ran both schedules."""
    def by_draft(schedule: str) -> pd.DataFrame:
        rows = agg[agg.schedule == schedule]
        name = [d if k == modes.FIXED else f"{d}_{k}" for d, k in zip(rows.draft, rows.k_policy)]
        return rows.set_index(pd.Index(name, name="draft"))
    piped, serial = by_draft(PIPELINED), by_draft(ORDINARY)
    piped = piped[piped.index.isin(serial.index)]
    serial = serial.loc[piped.index]
    bound = np.minimum(serial.finalize_ms, serial.draft_ms)
    out = pd.DataFrame({"serial ms/round": serial.ms_per_round, "pipelined ms/round": piped.ms_per_round,
                        "finalize ms/round": serial.finalize_ms / serial.rounds,
                        "draft ms/round": serial.draft_ms / serial.rounds,
                        "overlap gain": 1 - piped.decode_total_ms / serial.decode_total_ms,
                        "bound on gain": bound / serial.decode_total_ms})
    out["share of bound"] = out["overlap gain"] / out["bound on gain"]
    return out


def call_counts(agg: pd.DataFrame) -> pd.DataFrame:
    """Rounds, target calls, skipped verify calls and rounds whose proposal block (deferred) or append (ordinary) was
    launched ahead of the host's read (on a GPU) per mode, less the modes whose counters follow measured timings
    (modes.follows_timings: they differ from machine to machine)."""
    timed = agg.apply(lambda r: modes.follows_timings(r.draft, r.k_policy), axis=1)
    return agg[~timed][["rounds", "verify_calls", "append_calls", "skipped", "launched_ahead", "appended_ahead"]]


def block_policies(agg: pd.DataFrame) -> pd.DataFrame:
    """Per speculative mode: its draft, schedule, block-length policy, mean block length, acceptance, mean
    emitted and decode tok/s (the fixed-K modes beside the adaptive ones)."""
    cols = ["draft", "schedule", "k_policy", "mean_block", "acceptance", "mean_emitted", "decode_tok_s"]
    return agg[cols].dropna(subset=["acceptance"])


def adaptive_tables(ad: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """adaptive.json's policies (each beside the best fixed setting it competes with) and the bandits' regret."""
    return pd.DataFrame(ad["policies"]).set_index("policy"), pd.DataFrame(ad["regret"]).T


def first_difference(tokens: list[int], baseline: list[int] | None) -> int | None:
    """The first position where a sample's tokens leave the baseline's (None without a baseline)."""
    if baseline is None:
        return None
    return next(i for i, (a, b) in enumerate(zip(tokens + [-1], baseline + [-1])) if a != b)


def divergence_points(div: pd.DataFrame) -> pd.DataFrame:
    """divergences.json's rows grouped by the point where outputs leave the baseline (iteration, prompt,
    position): how many modes leave there, the tokens and the logit gaps (measured once per point)."""
    return div.groupby(["iteration", "question_id", "position"]).agg(
        modes=("mode", "size"), baseline_token=("baseline_token", "first"), mode_token=("mode_token", "first"),
        gap_stepwise=("gap_stepwise", "first"), gap_batched=("gap_batched", "first"))


def invariance_tables(data: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """invariance.json as (exact match and acceptance per mode, one column pair per setting; the target's mean
    call time in ms per call length, one column per setting). The mode table is empty where the profile's drafts
    are all adaptive (the study runs fixed-K drafts only): the rows' frame is given its columns, so none pivots too."""
    rows = pd.DataFrame(data["modes"], columns=["setting", "mode", "exact_match_rate", "acceptance"])
    modes_ = rows.pivot(index="mode", columns="setting", values=["exact_match_rate", "acceptance"])
    steps = pd.DataFrame({s: {int(n): v["mean_ms"] for n, v in calls.items()} for s, calls in data["step_ms"].items()})
    steps.index.name = "call length"
    return modes_, steps
