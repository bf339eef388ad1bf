"""Notebook 04's outputs/<profile>/summary.json: the run it comes from, per-mode end-to-end numbers, the
clustering and microbenchmark headlines, the cost-model check, the side studies' sections read from their
files, and the closing checks the notebook asserts."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .. import costmodel, modes
from ..config import Profile
from ..results import read_config, save_json, side_study_json
from .sampling import summary_section as sampling_section
from .tables import kernel_of, run_kernels


def run_source(profile: Profile, run: Path) -> dict:
    """Which run a summary or table comes from, from its config.json: its directory (relative to the profile's
    outputs), the commit it ran at, which path ran each engine's single-token body and its multi-token calls' layer
    kernels (runs made before that was recorded: none)."""
    cfg = read_config(run)
    wrote = [cfg.get("commit", "unknown"), *(r.get("commit", "unknown") for r in cfg.get("resumed", []))]
    return {"run": str(Path(run).relative_to(profile.out_dir)), "run_commit": cfg.get("commit", "unknown"),
            "run_started": cfg.get("started"), "sample_commits": list(dict.fromkeys(wrote)),  # each resume's too
            "run_bodies": cfg.get("bodies"), "run_layers": cfg.get("layers"), "run_device": run_cards(cfg)}


def run_cards(cfg: dict) -> str:
    """Where a run's engines ran, from its config.json: one card, or the target's and the draft's."""
    dev = cfg.get("device") or {}
    target, draft = dev.get("target", "unknown"), dev.get("draft", "unknown")
    return target if target == draft else f"target on {target}, draft on {draft}"


def extra_summary(profile: Profile) -> dict:
    """Profile-specific additions to summary.json: target-step timings, and the peer, adaptive, context and
    sampling studies' sections where they ran (their files without their raw rows)."""
    read = lambda name: json.loads((profile.out_dir / name).read_text())
    out = {"target_step": read("target_step.json")} if (profile.out_dir / "target_step.json").exists() else {}
    p, a, c = (side_study_json(profile, study) for study in ("peers", "adaptive", "context"))
    if p is not None:
        out["peers"] = {k: v for k, v in p.items() if k != "rows"}
    if a is not None:
        out["adaptive"] = {k: a[k] for k in ("schedule", "k", "prompts", "e2e_run", "regret", "policies")}
    if c is not None:                                                          # per position: ms a token, a call
        out["context"] = {"k": c["k"], "device": c["device"], "rows": [
            {"position": r["position"], "draft_step_ratio": r["draft_step_ratio"],
             **{f"draft_{d}_ms_per_token": s["per_token_ms"] for d, s in r["draft"].items()},
             **{f"target_{n}_ms": s["mean_ms"] for n, s in r["target"].items()}} for r in c["rows"]]}
    return {**out, **sampling_section(profile)}


def summary(profile: Profile, device: str, clus: dict, micro: dict, agg: pd.DataFrame, run: Path,
            extra: dict | None = None) -> dict:
    keep = ("n_tokens", "n_clusters", "cluster_size", "equal_sizes", "seconds", "mean_cosine",
            "mean_cosine_unconstrained", "top1_containment", "n_probes")
    e2e = {}
    for m, r in agg.iterrows():
        e2e[m] = {k: _num(r[k]) for k in ("decode_tok_s", "ttft_ms", "acceptance", "mean_emitted", "verify_calls",
                                          "append_calls", "exact_match_rate", "engine_overhead_frac", "overlap_frac", "samples",
                                          "ms_per_round", "draft_share", "verify_share", "finalize_share",
                                          "transfer_ms", "launched_ahead", "appended_ahead")}
    kernels = run_kernels(run)                                               # which head kernel picked the tokens
    for m, r in agg.iterrows():
        e2e[m]["head_kernel"] = kernel_of(r["draft"], kernels)
    out = {
        "profile": profile.name, "device": device, **run_source(profile, run),
        "real_weights": profile.models.source != "synthetic",
        "acceptance_note": acceptance_note(profile),
        "clustering": {k: clus[k] for k in keep if k in clus},
        "head": {"dense_ms": micro["head"]["dense"]["mean_ms"], "flash_ms": micro["head"]["flash"]["mean_ms"],
                 "speedup": micro["head"]["speedup"], "n_probes": micro["n_probes"]},
        "model_step": {"dense_ms": micro["model_step"]["dense"]["mean_ms"],
                       "flash_ms": micro["model_step"]["flash"]["mean_ms"], "speedup": micro["model_step"]["speedup"]},
        "microbench_commit": micro.get("written", {}).get("commit", "not recorded"),   # head and model_step
        "e2e": e2e,
    }
    cost = cost_model_section(profile, micro, agg, extra)
    if cost:
        out["cost_model"] = cost
    if profile.models.source == "gguf":
        out.update(model_file=profile.models.gguf_file, model_sha256=profile.models.gguf_sha256,
                   exit_layer=profile.models.exit_layer)
    out.update(extra or {})
    return out


def cost_model_section(profile: Profile, micro: dict, agg: pd.DataFrame, extra: dict | None = None) -> dict:
    """summary.json's `cost_model`: per mode the cost model checks (lib/costmodel.py model_check: fixed K,
    a measured draft step), the predicted and measured decode tok/s and their ratio, with the measured mean block
    and shares of rounds that verify and append. Needs notebook 03's target_step.json (from `extra`, else the
    file); empty without it."""
    ts = (extra or {}).get("target_step")
    path = profile.out_dir / "target_step.json"
    if ts is None and path.exists():
        ts = json.loads(path.read_text())
    if not ts or "verify_ms" not in ts or "model_step" not in micro:
        return {}
    return {"k": profile.decode.k, "modes": costmodel.summary_section(agg, micro, ts, profile.decode.k)}


def acceptance_note(profile: Profile) -> str:
    if profile.models.source == "synthetic":
        return "synthetic pair: acceptance is artificial"
    if profile.models.source == "gguf":                                # flash_full: the whole model with FlashHead
        full = " and its full-depth FlashHead control" if modes.FLASH_FULL in profile.decode.modes else ""
        return (f"real weights: SmolLM2-135M-Instruct and its own early-exit drafts{full} (self-speculation), "
                "not the thesis's pair")
    return "real models"


def _num(v):
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def write_summary(profile: Profile, data: dict) -> Path:
    return save_json(profile, "summary.json", data)                           # stamped like every result file


def closing_checks(summary: dict, df: pd.DataFrame, div: pd.DataFrame, dtype: str) -> dict[str, bool]:
    """Notebook 04's closing checks, each must hold: equal cluster sizes, and speculative output equal to greedy
    decoding exactly in fp32; in lower precision every sample that differs must be a measured divergence (`div`,
    divergences.json's rows)."""
    exact = min(v["exact_match_rate"] for k, v in summary["e2e"].items() if k != modes.BASELINE)
    if dtype == "float32" or exact == 1.0:
        same = {"exact match in every speculative mode": exact == 1.0}
    else:
        key = ["mode", "iteration", "question_id"]
        differ = set(df.loc[~df.exact_match.astype(bool), key].itertuples(index=False, name=None))
        listed = set(div[key].itertuples(index=False, name=None)) if len(div) else set()
        same = {f"every sample that differs from greedy ({dtype}) is a measured divergence": differ <= listed}
    return {"equal_sizes": bool(summary["clustering"]["equal_sizes"]), **same}
