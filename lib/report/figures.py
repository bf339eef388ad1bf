"""Notebook 04's figures (written under outputs/<profile>/figures/): latency distributions, phase shares,
accepted lengths, per-sample throughput. Figures with many modes are faceted by round schedule, one row per
draft and block-length policy, so that every label stays short and readable however many modes a profile runs.
Below them the plots notebooks 02 and 04 draw in place (`*_plot`, `projection_heatmap`): on pyplot's current
figure, shown by the notebook's inline backend."""
from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from .. import modes
from .micro import draft_step_table

if "inline" not in matplotlib.get_backend():        # a notebook keeps its inline backend (its plots show there)
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
            "phases": phase_shares(groups, d / "phase_shares.png", note),
            "accepted": accepted_lengths(df, agg, d / "accepted_lengths.png", note),
            "throughput": throughput(df, agg, groups, d / "decode_throughput.png", note)}


def titled(title: str, note: str) -> str:
    """A figure's title with the run's note (what its acceptance is, the card) below it, wrapped."""
    return title + (f"\n({textwrap.fill(note, 90)})" if note else "")


def latency(micro: dict, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key, title in ((axes[0], "head", "Head latency"), (axes[1], "model_step", "Draft decode step")):
        raw = micro[key]["raw_ms"]
        long = pd.DataFrame([(k, v) for k, vs in raw.items() for v in vs], columns=["head", "ms"])
        sns.boxplot(long, x="head", y="ms", ax=ax, hue="head", legend=False)
        ax.set(title=title, xlabel="", ylabel="ms per call")
    return _save(fig, path)


def phase_shares(groups: dict, path: Path, note: str = "") -> Path:
    """Stacked shares of decode wall time per phase (each sample's initial step, then the rounds' phases), one panel
    per schedule. Phases that overlap (the pipelined schedule's finalize beside the next draft) sum past 1: the axis
    reaches the longest stack, the wall time marked at 1."""
    fig, axes = panels(groups)
    colors = sns.color_palette("viridis", len(PHASES))
    top = max(1.0, *(g[[p + "_share" for p in PHASES]].sum(axis=1).max() for g in groups.values()))
    for ax, (schedule, g) in zip(axes, groups.items()):
        left = np.zeros(len(g))
        for phase, color in zip(PHASES, colors):
            share = g[phase + "_share"].to_numpy()
            ax.barh(g.label, share, left=left, color=color, label=phase)
            left += share
        ax.invert_yaxis()
        if top > 1:
            ax.axvline(1.0, color="k", ls="--", lw=1, label="wall time" if ax is axes[-1] else None)
        ax.set(title=schedule, xlabel="share of decode wall time", xlim=(0, top))
    same_rows(axes, groups)
    axes[-1].legend(bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    fig.suptitle(titled("Where decode time goes: each sample's initial step, then its rounds' phases", note),
                 fontsize=10)
    return _save(fig, path)


def accepted_lengths(df: pd.DataFrame, agg: pd.DataFrame, path: Path, note: str = "") -> Path:
    """Share of rounds that accepted 0, 1, ... draft tokens, one row per mode (a heatmap reads at any count)."""
    spec = df[df["mode"] != modes.BASELINE]
    lens = spec[["mode", "accepted_lengths"]].explode("accepted_lengths", ignore_index=True).dropna()   # unique index: crosstab aligns on it
    counts = pd.crosstab(lens["mode"], lens.accepted_lengths.astype(int), normalize="index")
    counts = counts.reindex([m for m in agg.index if m in counts.index])
    counts.index = [modes.LABELS[m] for m in counts.index]
    fig, ax = plt.subplots(figsize=(3.5 + 0.7 * counts.shape[1], 1.2 + 0.3 * len(counts)))
    sns.heatmap(counts, annot=True, fmt=".2f", cmap="Blues", vmin=0, vmax=1, cbar=False, ax=ax,
                annot_kws={"fontsize": 8})
    ax.set(xlabel="accepted draft tokens in a round", ylabel="",
           title=titled("Share of rounds by accepted length", note))
    ax.title.set_fontsize(10)
    return _save(fig, path)


def throughput(df: pd.DataFrame, agg: pd.DataFrame, groups: dict, path: Path, note: str = "") -> Path:
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
    fig.suptitle(titled("Per-sample decode throughput", note), fontsize=10)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    with warnings.catch_warnings():                          # a warning here would print this file's path
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- plots drawn in the notebooks

def probe_sweep_plot(micro: dict):
    """Notebook 02: FlashHead latency against probes (microbench.json's probe_sweep), one line per kernel path,
    the dense head's mean as a dashed line."""
    sweep = pd.DataFrame(micro["probe_sweep"])
    ax = sweep.pivot(index="n_probes", columns="kernel", values="mean_ms").plot(
        marker="o", logx=True, figsize=(6, 3), title="FlashHead latency against probes")
    ax.axhline(micro["head"]["dense"]["mean_ms"], color="k", ls="--", label="dense head")
    ax.legend()
    ax.set(xlabel="probes p", ylabel="ms per call")
    return ax


def head_batch_plot(batches: dict):
    """Notebook 02's batch study (head_batches.json). Left: the share of FlashHead's clusters that B rows probe
    together (mean, 5-95 % band) beside independent uniform probes; right: both heads' batched times against B, with
    FlashHead's time were it as fast as the dense head a byte (dense time / bytes ratio: a bound, dotted). None where
    every batch size was skipped (more than the states)."""
    if not batches["rows"]:
        return None
    t = pd.DataFrame(batches["rows"]).set_index("batch")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3))
    a.fill_between(t.index, t["union_share_p5"], t["union_share_p95"], alpha=0.25, color="C1")
    a.plot(t.index, t["union_share"], "o-", color="C1", label="these states")
    a.plot(t.index, t["uniform_share"], "k--", label="uniform probes")
    a.set(xscale="log", xlabel="batch size B", ylabel="share of clusters probed", ylim=(0, 1.02),
          title=f"union of the probed clusters (p = {batches['n_probes']} of {batches['n_clusters']})")
    a.legend(fontsize=8)
    dense, flash = (t[k].map(lambda s: s["mean_ms"]) for k in ("dense", "flash"))
    b.plot(t.index, dense, "o-", color="0.3", label="dense head")
    path = {"triton": "batched Triton kernel", "torch": "union GEMM"}[batches.get("flash_path", "torch")]
    b.plot(t.index, flash, "o-", color="C1", label=f"FlashHead ({path})")
    b.plot(t.index, dense / t["bytes_ratio"], ":", color="C1", label="FlashHead at dense's bytes/s (bound)")
    b.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="ms per call (mean)",
          title=f"batched heads, {batches['device']}")
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig


def cluster_size_plot(sizes: dict):
    """Notebook 01's cluster-size study (cluster_sizes.json): against the share of the dense head's bytes each
    setting reads, how often FlashHead picks the dense head's token (left) and the target's (right), one line per
    cluster size (points: probe counts); the dense head's own agreement with the target dashed."""
    t = pd.DataFrame(sizes["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharex=True)
    for i, (b, g) in enumerate(t.groupby("cluster_size")):
        for ax, col in zip(axes, ("agree_dense", "agree_target")):
            ax.plot(g["read_fraction"], g[col], "o-", color=f"C{i}", label=f"{b} tokens a cluster")
    axes[1].axhline(sizes["dense"]["agree_target"], color="0.3", ls="--", label="dense head")
    what = "synthetic states" if sizes["synthetic"] else f"{sizes['n_states']} real trajectory states"
    axes[0].set(ylabel="FlashHead = dense head", title=f"top-1 containment ({what})")
    axes[1].set(ylabel="FlashHead = target", title="agreement with the target's greedy token")
    lo, hi = t.read_fraction.min() / 1.5, t.read_fraction.max() * 1.5
    ticks = [x for x in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1) if lo <= x <= hi]
    for ax in axes:
        ax.set(xscale="log", xlabel="share of the dense head's bytes read")
        ax.set_xticks(ticks, [f"{x:.0%}" for x in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def head_effect_plot(micro: dict, ratios: pd.DataFrame, run: str = ""):
    """Notebook 04: FlashHead against the dense head. Left: the draft's time per token in a round's proposal block
    (p50), the body and what the head adds to it, each draft's floor marked; right: the FlashHead draft's decode
    tok/s over the dense draft's per schedule, measured and modelled, over the whole decode and over the rounds alone
    where given (costmodel.head_ratios), in `run`. None where
    notebook 02 did not time the block without a head (CPU profiles, older files)."""
    if "floors" not in micro or "body" not in micro.get("block", {}):
        return None
    tab = draft_step_table(micro).loc[["dense", "FlashHead"]]
    head = tab["head p50 ms per token in block"]
    body = tab["block p50 ms per token"] - head
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 2.6), gridspec_kw={"width_ratios": [3, 2]})
    a.barh(tab.index, body, color="0.75", label="body")
    a.barh(tab.index, head, left=body, color="C1", label="head")
    a.scatter(tab["floor ms"], tab.index, marker="|", s=500, color="k", zorder=3, label="floor")
    a.set(xlabel="ms per token in the block (p50)", title="the draft step", xlim=(0, 1.35 * (body + head).max()))
    a.legend(loc="center right", fontsize=8)
    cols = [c for c in ("measured flash/dense", "model flash/dense", "rounds: measured flash/dense",
                        "rounds: model flash/dense") if c in ratios]
    ratios[cols].rename(columns=lambda c: c.replace(" flash/dense", "")).plot.bar(ax=b, rot=0)
    b.axhline(1.0, color="k", lw=0.8)
    b.set(ylim=(min(1.0, ratios[cols].min().min()) - 0.01, max(1.0, ratios[cols].max().max()) + 0.01),
          ylabel="FlashHead / dense tok/s", title=f"end to end ({run})" if run else "end to end")
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig


def int4_kernel_plot(frame: pd.DataFrame):
    """Notebook 02: per-call time of each W4A16 kernel against activation rows, one panel per projection
    (lib.report.micro.int4_kernel_frame), the int4 floor dashed."""
    grid = sns.relplot(frame, x="rows", y="p50 ms", hue="kernel", col="projection", kind="line", marker="o",
                       height=2.6, aspect=1.0, facet_kws={"sharey": False})
    for shape, ax in grid.axes_dict.items():
        ax.axhline(frame.loc[frame["projection"] == shape, "floor ms"].iloc[0], color="k", ls="--", lw=1)
        ax.set(xscale="log", xticks=[1, 2, 4, 8, 16], xticklabels=["1", "2", "4", "8", "16"])
    grid.figure.suptitle("W4A16 kernels: ms per call against rows (dashed: the int4 floor)", y=1.04)
    return grid


def exit_depth_plot(table: pd.DataFrame, exit_layer: int):
    """Notebook 02: the early-exit draft's acceptance and PROJECTED speedups against its exit layer
    (lib.study.exit_depth's table), the profile's exit layer dashed."""
    ax = table[["acceptance", "speedup_ordinary", "speedup_deferred"]].plot(
        marker="o", figsize=(6, 3), title="Early exit: acceptance and PROJECTED speedup")
    ax.axvline(exit_layer, color="k", ls="--")
    ax.set(xlabel="exit layer N")
    return ax


def block_length_plot(df: pd.DataFrame):
    """Notebook 04: the block length K over the rounds of the first sample of each adaptive-K mode."""
    first = df[df.k_policy != modes.FIXED].groupby("mode", sort=False).head(1)
    ax = pd.DataFrame({m: pd.Series(b) for m, b in zip(first["mode"], first.block_lengths)}).plot(
        drawstyle="steps-post", figsize=(7, 3), title="Block length K over the rounds of one sample")
    ax.set(xlabel="round", ylabel="K")
    return ax


def adaptive_plots(ad: dict):
    """Notebook 04, adaptive.json: top-1 containment against probes (fixed p, and adaptive at its mean p), and
    each drafter's acceptance and decode tok/s against its mean probes."""
    pr = ad["probes"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.2))
    pd.DataFrame(pr["fixed"]).plot(x="n_probes", y="top1", marker="o", logx=True, label="fixed p", ax=axes[0])
    pd.DataFrame(pr["adaptive"]).plot(x="mean_probes", y="top1", marker="s", ax=axes[0], label="adaptive (mean p)")
    axes[0].set(xlabel="probes", ylabel="top-1 containment", title="Containment against probes")
    dr = pd.DataFrame(ad["drafters"]).T.dropna(subset=["mean_probes"])
    for col, ax in zip(["acceptance", "decode_tok_s"], axes[1:]):
        ax.scatter(dr.mean_probes.astype(float), dr[col].astype(float))
        for name, r in dr.iterrows():
            ax.annotate(name, (float(r.mean_probes), float(r[col])), fontsize=7)
        ax.set(xscale="log", xlabel="mean probes", ylabel=col, title=f"{col} against mean probes")
    fig.tight_layout()
    return fig


def policy_rounds_plot(df: pd.DataFrame):
    """Notebook 04: round by round, the block length the grow policy proposed and the tokens accepted (its
    first sample), and the arm a bandit drafter chose (its first sample)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3))
    grow = df[df.k_policy == modes.GROW]
    if len(grow):
        one = grow.iloc[0]
        axes[0].step(range(1, len(one.block_lengths) + 1), one.block_lengths, where="mid", label="K proposed")
        axes[0].plot(range(1, len(one.accepted_lengths) + 1), one.accepted_lengths, "o", label="accepted")
        axes[0].set(xlabel="round", ylabel="tokens", title=f"K by acceptance, {one['mode']}, question {one.question_id}")
        axes[0].legend()
    else:
        nothing(axes[0], "no mode with the grow block-length policy in this run")
    bandit = df[df.draft.isin(modes.BANDITS)]
    if len(bandit):
        one = bandit.iloc[0]
        arms = sorted(set(one.choices))
        axes[1].plot(range(1, len(one.choices) + 1), [arms.index(c) for c in one.choices], ".")
        axes[1].set(yticks=range(len(arms)), yticklabels=arms, xlabel="round",
                    title=f"{one['mode']}: arm chosen, question {one.question_id}")
    else:
        nothing(axes[1], "no bandit drafter in this run")
    fig.tight_layout()
    return fig


def nothing(ax, text: str) -> None:
    """A panel with nothing to draw says so (blank axes read as a plot that failed)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def divergence_gap_plot(points: pd.DataFrame):
    """Notebook 04: the top-1 minus top-2 logit gap at each divergence point (tables.divergence_points)."""
    return points[["gap_stepwise", "gap_batched"]].plot.hist(
        bins=20, alpha=0.6, figsize=(6, 3), title="Top-1 minus top-2 logit gap at each divergence point")


def projection_heatmap(grid: pd.DataFrame):
    """Notebook 04: the cost model's PROJECTED FlashHead-deferred speedup over acceptance and K
    (lib.costmodel.projection_grid)."""
    ax = sns.heatmap(grid, annot=True, fmt=".2f", cmap="viridis")
    ax.set_title("PROJECTED speedup, FlashHead deferred vs baseline")
    return ax
