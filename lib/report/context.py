"""The context study's numbers (notebook 03's context.json, measured by lib/study/context_lengths.py): the calls
of a round at each position (notebook 03), and with the cost model's projection beside them (notebook 04)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import modes
from .figures import _save, plt


def context_table(ctx: dict) -> pd.DataFrame:
    """Per position: each draft's time a proposed token (its K-token block over K) and the measured dense/flash
    ratio; the share of the dense draft's block time FlashHead saves ((dense - flash) / dense); the target's calls
    of 1, K and K+1 tokens; on a GPU each call's floor (its bytes at the copy bandwidth) and the share of it reached,
    and each draft's block fed two tokens (as deferred rounds launch it ahead) where the study timed it."""
    k, rows = ctx["k"], []
    for r in ctx["rows"]:
        d, f, t = r["draft"][modes.DENSE], r["draft"][modes.FLASH], r["target"]
        row = {"position": r["position"], "dense ms/token": d["per_token_ms"], "flash ms/token": f["per_token_ms"],
               "dense/flash": r["draft_step_ratio"], "saved share": 1 - f["mean_ms"] / d["mean_ms"],
               "draft MB/token": d["bytes"] / k / 1e6, "target 1 ms": t["1"]["mean_ms"],
               f"target {k} ms": t["K"]["mean_ms"], f"target {k + 1} ms": t["K+1"]["mean_ms"],
               "target MB": t["1"]["bytes"] / 1e6}
        if "floor_ms" in d:
            row.update({"dense floor ms/token": d["floor_ms"] / k, "dense of floor": d["floor_ms"] / d["mean_ms"],
                        "target 1 floor ms": t["1"]["floor_ms"], "target of floor": t["1"]["floor_ms"] / t["1"]["mean_ms"]})
        row.update({f"{name} fed two ms/token": s["per_token_ms"] for name, s in r.get("draft_fed_two", {}).items()})
        rows.append(row)
    return pd.DataFrame(rows).set_index("position")


def context_plot(ctx: dict, projection: pd.DataFrame | None = None, path: Path | None = None):
    """Left: each draft's time a proposed token against the position (on a GPU its floor dashed); middle: the
    target's single-token and deferred-verify calls; right: the measured draft-step ratio and, where given, the
    projected FlashHead/dense decode ratio per schedule (lib.costmodel.context_projection). The figure, or with a
    path its saved file (the folder made)."""
    tab = context_table(ctx)
    k = ctx["k"]
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 3.6))
    for name, col in (("dense", "dense ms/token"), ("FlashHead", "flash ms/token")):
        axes[0].plot(tab.index, tab[col], marker="o", label=name)
    if "dense floor ms/token" in tab:
        axes[0].plot(tab.index, tab["dense floor ms/token"], ls="--", color="grey", label="dense floor")
    axes[0].set(ylabel="draft ms a proposed token", title=f"draft (K = {k} block)")
    for n, col in ((1, "target 1 ms"), (k + 1, f"target {k + 1} ms")):
        axes[1].plot(tab.index, tab[col], marker="o", label=f"{n} token" + ("s" if n > 1 else ""))
    axes[1].set(ylabel="target ms a call", title="target calls")
    axes[2].plot(tab.index, tab["dense/flash"], marker="o", color="k", label="draft step, measured")
    note = ", artificial acceptance" if ctx.get("synthetic") else ""
    for schedule in modes.SCHEDULES:
        col = f"{schedule}: flash/dense"
        if projection is not None and col in projection:
            axes[2].plot(projection.index, projection[col], marker="s", ls=":",
                         label=f"decode, {schedule} (projected{note})")
    axes[2].axhline(1.0, color="grey", lw=0.8)
    axes[2].set(ylabel="FlashHead speedup", title="FlashHead over the dense head")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position (tokens in the cache)")
        ax.legend(fontsize=8)
    if path is None:
        fig.tight_layout()
        return fig
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, Path(path))
