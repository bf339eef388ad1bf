"""Notebook 04's figures: latency distributions, phase shares, accepted lengths, per-sample throughput."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

from . import modes

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

def figures(df: pd.DataFrame, agg: pd.DataFrame, micro: dict, out_dir: Path, note: str = "") -> dict[str, Path]:
    d = Path(out_dir) / "figures"
    d.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="notebook")
    paths = {}

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, key, title in ((axes[0], "head", "Head latency"), (axes[1], "model_step", "Draft decode step")):
        raw = micro[key]["raw_ms"]
        long = pd.DataFrame([(k, v) for k, vs in raw.items() for v in vs], columns=["head", "ms"])
        sns.boxplot(long, x="head", y="ms", ax=ax, hue="head", legend=False)
        ax.set(title=title, xlabel="", ylabel="ms per call")
    paths["latency"] = _save(fig, d / "latency_distributions.png")

    spec = agg[agg.index != modes.BASELINE]
    shares = spec[["initial_share", "draft_share", "verify_share", "finalize_share"]].rename(
        index=modes.LABELS, columns=lambda c: c.replace("_share", ""))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    shares.plot.barh(stacked=True, ax=ax, colormap="viridis")
    ax.set(xlabel="share of decode wall time", title="Phase shares per round schedule")
    ax.legend(bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=8)
    paths["phases"] = _save(fig, d / "phase_shares.png")

    lens = df[df["mode"] != modes.BASELINE][["mode", "accepted_lengths"]].explode("accepted_lengths")
    lens["accepted"] = lens.accepted_lengths.astype(int)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    sns.histplot(lens, x="accepted", hue="mode", multiple="dodge", discrete=True, stat="probability",
                 common_norm=False, ax=ax, shrink=0.8)
    ax.set(title=f"Accepted draft tokens per round ({note})" if note else "Accepted draft tokens per round",
           xlabel="accepted")
    paths["accepted"] = _save(fig, d / "accepted_lengths.png")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    tps = df.assign(tok_s=1000 * df.decode_tokens / df.decode_ms)
    sns.boxplot(tps, y="mode", x="tok_s", ax=ax, order=list(agg.index), hue="mode", legend=False)
    ax.set(title="Per-sample decode throughput", xlabel="decode tok/s", ylabel="")
    paths["throughput"] = _save(fig, d / "decode_throughput.png")
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
