"""Notebook 04's figures: latency distributions, phase shares, accepted lengths, per-sample throughput.
Figures with many modes are faceted by round schedule, one row per draft and block-length policy, so that
every label stays short and readable however many modes a profile runs."""
from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from . import modes

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

PHASES = ["initial", "draft", "verify", "finalize"]


def row_label(draft: str, k_policy: str | None) -> str:
    """A mode's label within its schedule's panel: the draft and its block-length policy."""
    return modes.DRAFTS[draft] + modes.K_POLICIES[k_policy or modes.FIXED]


def by_schedule(agg: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The speculative modes of `agg` grouped by schedule (in lib.modes' order), each labelled by row_label."""
    spec = agg[agg.index != modes.BASELINE]
    spec = spec.assign(label=[row_label(d, k) for d, k in zip(spec.draft, spec.k_policy)])
    return {s: spec[spec.schedule == s] for s in modes.SCHEDULES if (spec.schedule == s).any()}


def panels(groups: dict, width: float = 4.6, per_row: float = 0.32):
    """One panel per schedule side by side, tall enough for the longest panel's rows."""
    rows = max(len(g) for g in groups.values())
    fig, axes = plt.subplots(1, len(groups), figsize=(2.6 + width * len(groups), max(2.8, 1.4 + per_row * rows)),
                             sharex=True, squeeze=False)
    return fig, list(axes[0])


def same_rows(axes, groups: dict) -> None:
    """Panels with the same rows in the same order show their labels once, on the left."""
    if len({tuple(g.label) for g in groups.values()}) == 1:
        for ax in axes[1:]:
            ax.set_yticklabels([])


def figures(df: pd.DataFrame, agg: pd.DataFrame, micro: dict, out_dir: Path, note: str = "") -> dict[str, Path]:
    d = Path(out_dir) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="notebook")
    groups = by_schedule(agg)
    return {"latency": latency(micro, d / "latency_distributions.png"),
            "phases": phase_shares(groups, d / "phase_shares.png"),
            "accepted": accepted_lengths(df, agg, d / "accepted_lengths.png", note),
            "throughput": throughput(df, agg, groups, d / "decode_throughput.png")}


def latency(micro: dict, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key, title in ((axes[0], "head", "Head latency"), (axes[1], "model_step", "Draft decode step")):
        raw = micro[key]["raw_ms"]
        long = pd.DataFrame([(k, v) for k, vs in raw.items() for v in vs], columns=["head", "ms"])
        sns.boxplot(long, x="head", y="ms", ax=ax, hue="head", legend=False)
        ax.set(title=title, xlabel="", ylabel="ms per call")
    return _save(fig, path)


def phase_shares(groups: dict, path: Path) -> Path:
    """Stacked shares of decode wall time per round phase, one panel per schedule."""
    fig, axes = panels(groups)
    colors = sns.color_palette("viridis", len(PHASES))
    for ax, (schedule, g) in zip(axes, groups.items()):
        left = np.zeros(len(g))
        for phase, color in zip(PHASES, colors):
            share = g[phase + "_share"].to_numpy()
            ax.barh(g.label, share, left=left, color=color, label=phase)
            left += share
        ax.invert_yaxis()
        ax.set(title=schedule, xlabel="share of decode wall time", xlim=(0, 1))
    same_rows(axes, groups)
    axes[-1].legend(bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    fig.suptitle("Where a round's time goes")
    return _save(fig, path)


def accepted_lengths(df: pd.DataFrame, agg: pd.DataFrame, path: Path, note: str = "") -> Path:
    """Share of rounds that accepted 0, 1, ... draft tokens, one row per mode (a heatmap reads at any count)."""
    spec = df[df["mode"] != modes.BASELINE]
    lens = spec[["mode", "accepted_lengths"]].explode("accepted_lengths").dropna()
    counts = pd.crosstab(lens["mode"], lens.accepted_lengths.astype(int), normalize="index")
    counts = counts.reindex([m for m in agg.index if m in counts.index])
    counts.index = [modes.LABELS[m] for m in counts.index]
    fig, ax = plt.subplots(figsize=(3.5 + 0.7 * counts.shape[1], 1.2 + 0.3 * len(counts)))
    sns.heatmap(counts, annot=True, fmt=".2f", cmap="Blues", vmin=0, vmax=1, cbar=False, ax=ax,
                annot_kws={"fontsize": 8})
    ax.set(xlabel="accepted draft tokens in a round", ylabel="",
           title="Share of rounds by accepted length" + (f"\n({textwrap.fill(note, 70)})" if note else ""))
    ax.title.set_fontsize(10)
    return _save(fig, path)


def throughput(df: pd.DataFrame, agg: pd.DataFrame, groups: dict, path: Path) -> Path:
    """Per-sample decode tok/s, one panel per schedule; the baseline's median as a dashed line in each."""
    tps = df.assign(tok_s=1000 * df.decode_tokens / df.decode_ms)
    base = tps[tps["mode"] == modes.BASELINE].tok_s.median() if (tps["mode"] == modes.BASELINE).any() else None
    fig, axes = panels(groups)
    for ax, (schedule, g) in zip(axes, groups.items()):
        rows = tps[tps["mode"].isin(g.index)].assign(label=lambda t: t["mode"].map(g.label))
        sns.boxplot(rows, y="label", x="tok_s", order=list(g.label), ax=ax, color="C0", fliersize=2)
        if base is not None:
            ax.axvline(base, ls="--", color="grey", lw=1, label="baseline (median)")
        ax.set(title=schedule, xlabel="decode tok/s", ylabel="")
    same_rows(axes, groups)
    if base is not None:
        axes[-1].legend(bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    fig.suptitle("Per-sample decode throughput")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    with warnings.catch_warnings():                          # a warning here would print this file's path
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
