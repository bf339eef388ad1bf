"""Notebook 04's view of the peers study (notebook 03's peers.json, measured by lib/study/peers.py): per method
pooled tok/s, agreement and per-sample spreads, and each peer beside this engine's own runs."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import modes
from .tables import aggregate as run_aggregate


def spread(values) -> dict:
    a = np.asarray([v for v in values if v is not None], dtype=float)
    if not a.size:
        return {"mean": None, "p50": None, "p95": None}
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95))}


def aggregate(rows: list[dict]) -> dict:
    """Per method: pooled tok/s (all new tokens over all wall time; decode only: tokens after the first over
    wall minus prefill, as report/tables.py's aggregate pools decode tok/s), agreement, and the mean, p50 and p95 of each
    per-sample number."""
    out = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == method]
        col = lambda k: [r[k] for r in rs]
        decode_ms = sum(col("decode_ms"))
        out[method] = {
            "label": modes.PEERS.get(method, "this engine, target only (generate_baseline)"), "samples": len(rs),
            "new_tokens": sum(col("new_tokens")), "tok_s": 1000 * sum(col("new_tokens")) / sum(col("wall_ms")),
            "decode_tok_s": 1000 * sum(n - 1 for n in col("new_tokens")) / decode_ms if decode_ms > 0 else None,
            "exact_match_rate": float(np.mean(col("exact_match"))),
            "mean_prefix_frac": float(np.mean(col("prefix_frac"))),
            "per_sample": {k: spread(col(k)) for k in ("wall_ms", "prefill_ms", "decode_ms", "tok_s", "decode_tok_s")}}
    return out


def table(data: dict, agg: pd.DataFrame | None = None, run_device: str | None = None,
          df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each peer beside this engine's baseline timed in the same harness; with notebook 03's aggregate
    (report/tables.py's aggregate) also its baseline and fastest speculative mode, timed on `run_device` (the card
    of notebook 03's run: the peers may have run on another; compare timings only within one card). With the run's
    records `df`, those rows are its samples of the prompts the peers ran (as against_greedy's temperature 0 is);
    else `agg`, the run over all its prompts, and their source says so."""
    asked = set(data.get("config", {}).get("prompts") or [])
    same = df is not None and bool(asked & set(df.question_id))
    if same:
        agg = run_aggregate(df[df.question_id.isin(asked)])
    run_label = "notebook 03 run" if same else "notebook 03 run (all prompts)"
    peer_device = data.get("config", {}).get("device")
    rows = [{"method": m, "label": a["label"], "source": "peer harness", "device": peer_device, "tok_s": a["tok_s"],
             "decode_tok_s": a["decode_tok_s"], "exact_match_rate": a["exact_match_rate"],
             "mean_prefix_frac": a["mean_prefix_frac"], "samples": a["samples"]} for m, a in data["aggregate"].items()]
    if agg is not None:
        spec = agg[agg.index != modes.BASELINE]
        best = [spec.decode_tok_s.idxmax()] if len(spec) else []
        for m in [modes.BASELINE, *best] if modes.BASELINE in agg.index else best:
            r = agg.loc[m]
            new = r.decode_tok_s * r.decode_total_ms / 1000 + r.samples          # decode tokens + first tokens
            rows.append({"method": m, "label": modes.LABELS.get(m, m), "source": run_label, "device": run_device,
                         "tok_s": 1000 * new / (r.decode_total_ms + r.ttft_ms * r.samples),
                         "decode_tok_s": r.decode_tok_s,
                         "exact_match_rate": r.exact_match_rate, "mean_prefix_frac": None, "samples": int(r.samples)})
    return pd.DataFrame(rows).set_index("method")
