"""The sampling study's numbers (notebook 03's sampling.json, measured by lib/study/sampling.py): per temperature
and mode, summary.json's `sampling` section, and sampling beside greedy decoding (notebook 04)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .. import modes
from ..config import Profile
from ..results import side_study_json
from .tables import aggregate as run_aggregate


def aggregate(samples: list[dict]) -> list[dict]:
    """Per (temperature, mode), as lib/report/tables.py's aggregate defines them: acceptance = accepted / proposed,
    mean emitted = (accepted + rounds) / rounds, decode tok/s = sum of decode tokens / sum of decode time;
    speedup = decode tok/s over target-only sampling's at the same temperature."""
    rows = []
    for key in dict.fromkeys((r["temperature"], r["mode"]) for r in samples):
        rs = [r for r in samples if (r["temperature"], r["mode"]) == key]
        total = lambda k: sum(r[k] for r in rs)
        rows.append({"temperature": key[0], "mode": key[1], "draft": rs[0]["draft"], "schedule": rs[0]["schedule"],
                     "probes": rs[0]["probes"], "samples": len(rs), "accepted": total("accepted"),
                     "proposed": total("proposed"),
                     "acceptance": total("accepted") / total("proposed") if total("proposed") else None,
                     "mean_emitted": (total("accepted") + total("rounds")) / total("rounds") if total("rounds") else None,
                     "decode_tok_s": 1000 * total("decode_tokens") / total("decode_ms"),
                     "verify_calls": total("verify_calls"), "skipped": total("skipped")})
    base = {r["temperature"]: r["decode_tok_s"] for r in rows if r["mode"] == modes.BASELINE}
    for r in rows:
        r["speedup"] = r["decode_tok_s"] / base[r["temperature"]] if r["temperature"] in base else None
    return rows


def summary_section(profile: Profile) -> dict:
    """summary.json's `sampling` section (sampling.json without its per-sample records), if the study ran."""
    data = side_study_json(profile, "sampling")
    if data is None:
        return {}
    data = {k: v for k, v in data.items() if k != "samples"}
    return {"sampling": {**data, "rows": sampled_rows(data)}}


def sampled_rows(data: dict) -> list[dict]:
    """The study's rows, less those of adaptive drafts: they are greedy-only, and runs made before they were
    left out sampled them with their base FlashHead, which is the flash rows again under another name."""
    return [r for r in data["rows"] if r.get("draft") not in modes.ADAPTIVE_DRAFTS]


def against_greedy(data: dict, agg: pd.DataFrame, df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Acceptance, mean emitted and decode tok/s per mode at temperature 0 (the greedy run's fixed-K modes) and at
    each sampling temperature (sampling.json's rows, sampled_rows), for the modes sampled. Temperature 0: with the
    run's records `df`, the greedy run on the prompts the study sampled (its first prompts.side_prompts) pooled as
    tables.aggregate pools; without them `agg`, the run over all its prompts. Where the samples carry their times,
    also each mode's median sample tok/s (median_sample_tok_s)."""
    samp = pd.DataFrame(sampled_rows(data))
    sampled = {s["question_id"] for s in data.get("samples", [])}
    if df is not None and sampled:                                       # the same prompts at every temperature
        df = df[df.question_id.isin(sampled)]
        agg = run_aggregate(df)
    greedy = agg[agg.k_policy == modes.FIXED].reset_index(names="mode").assign(temperature=0.0)
    values, median = ["acceptance", "mean_emitted", "decode_tok_s"], median_sample_tok_s(data.get("samples", []))
    if median:
        samp[MEDIAN] = [median.get(key) for key in zip(samp.temperature, samp["mode"])]
        if df is not None:                                                # the greedy run's samples: temperature 0
            at_zero = median_sample_tok_s(df.assign(temperature=0.0).to_dict("records"))
            greedy[MEDIAN] = [at_zero.get((0.0, m)) for m in greedy["mode"]]
        values.append(MEDIAN)
    both = pd.concat([greedy, samp])[lambda d: d["mode"].isin(samp["mode"])]
    return both.pivot_table(index="mode", columns="temperature", values=values, sort=False)


MEDIAN = "median_sample_tok_s"


def median_sample_tok_s(samples: list[dict]) -> dict[tuple, float]:
    """Per (temperature, mode), the median sample's decode tok/s. Beside the pooled figure (all decode tokens over
    all decode time), a sample slowed by something once (a kernel compiled or a graph captured on first use) shows
    as a gap between the two."""
    by = {}
    for s in samples:
        if s.get("decode_ms"):
            by.setdefault((s["temperature"], s["mode"]), []).append(1000 * s["decode_tokens"] / s["decode_ms"])
    return {key: float(np.median(v)) for key, v in by.items()}
