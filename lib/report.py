"""Notebook 04: per-mode aggregates, metric identities, the thesis's tables 4.1-4.11 beside ours, and
outputs/<profile>/summary.json (figures: lib/figures.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from . import modes
from .config import Profile, outputs_root, thesis_numbers
from .modes import DEFERRED, ORDINARY, PIPELINED


def thesis_modes(schedule: str) -> list[str]:
    """The modes the thesis compares under a schedule: baseline, dense draft, FlashHead draft."""
    return [modes.BASELINE, modes.name("dense", schedule), modes.name("flash", schedule)]


def records_frame(records: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(records)
    if "k_policy" not in df:                                             # runs made before block policies
        df["k_policy"] = modes.FIXED
        df["block_lengths"] = [[] for _ in range(len(df))]
    for phase in ("initial", "draft", "verify", "finalize", "transfer", "call_draft_body", "call_draft_head",
                  "call_target"):
        df[phase + "_ms"] = [s.get(phase, 0.0) for s in df["spans_ms"]]
    return df


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
           "initial_ms", "draft_ms", "verify_ms", "finalize_ms", "call_draft_body_ms", "call_draft_head_ms",
           "call_target_ms", "model_call_ms", "transfer_ms"]].sum()
    blocks = g.block_lengths.agg(lambda b: sum(map(sum, b)) / max(sum(map(len, b)), 1))
    out = pd.DataFrame({
        "mean_block": blocks,
        "draft": parts.draft, "schedule": parts.schedule, "k_policy": parts.k_policy,
        "samples": g.size(),
        "decode_tok_s": 1000 * s.decode_tokens / s.decode_ms,
        "ttft_ms": g.ttft_ms.mean(),
        "decode_total_ms": s.decode_ms,
        "acceptance": (s.accepted / s.proposed).where(s.proposed > 0),
        "mean_emitted": ((s.accepted + s.rounds) / s.rounds).where(s.rounds > 0),
        "rounds": s.rounds, "verify_calls": s.verify_calls, "append_calls": s.append_calls, "skipped": s.skipped,
        "ms_per_round": (s.decode_ms / s.rounds).where(s.rounds > 0),
        "initial_ms": s.initial_ms, "draft_ms": s.draft_ms, "verify_ms": s.verify_ms, "finalize_ms": s.finalize_ms,
        "draft_body_ms": s.call_draft_body_ms, "draft_head_ms": s.call_draft_head_ms, "transfer_ms": s.transfer_ms,
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
    return json.loads((Path(run) / "config.json").read_text()).get("kernels", {})


def kernel_of(draft: str, kernels: dict | None) -> str:
    """The kernel path that picked a mode's tokens: the target's for the baseline, else its draft's."""
    return (kernels or {}).get("target" if draft == modes.BASELINE else draft, "unrecorded")


def acceptance_by_group(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Acceptance (accepted / proposed, pooled) and mean emitted per speculative mode and prompt group, with
    a 95% bootstrap interval over samples (a sample's rounds are not independent draws), and over all groups."""
    rng = np.random.default_rng(seed)
    rows = []
    spec = df[df["mode"] != modes.BASELINE]
    for (mode, group), g in list(spec.groupby(["mode", "group"], sort=False)) + \
            [((m, "all"), g) for m, g in spec.groupby("mode", sort=False)]:
        acc, prop = g.accepted.to_numpy(float), g.proposed.to_numpy(float)
        idx = rng.integers(0, len(g), (n_boot, len(g)))
        boot = acc[idx].sum(1) / np.maximum(prop[idx].sum(1), 1)
        rows.append({"mode": mode, "group": group, "samples": len(g), "acceptance": acc.sum() / max(prop.sum(), 1),
                     "ci_low": np.percentile(boot, 2.5), "ci_high": np.percentile(boot, 97.5),
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
        "deferred: one append call (the first token)": (spec[spec.schedule == DEFERRED].append_calls == 1).all(),
        "verify calls + skipped <= rounds": (spec.verify_calls + spec.skipped <= spec.rounds).all(),
        "baseline: append calls == decode tokens": (df[df["mode"] == modes.BASELINE].eval("append_calls == decode_tokens")).all(),
        "every output has max_new_tokens tokens": (df.tokens.map(len) == df.decode_tokens + 1).all(),
    }
    return pd.DataFrame({"identity": list(checks), "holds": [bool(v) for v in checks.values()]})


def thesis_consistency(k: int = 6, max_new: int = 64) -> pd.DataFrame:
    """Do the thesis's own numbers fit its definitions? Implied proposals per round, rounds, calls."""
    t = thesis_numbers()
    rows = []
    for table, mode in [("table_4_7", m) for m in thesis_modes(ORDINARY)[1:]] + \
                       [("table_4_9", m) for m in thesis_modes(DEFERRED)[1:]]:
        r = t[table][mode]
        acc, em = r["acceptance"], r["mean_emitted"]
        row = {"table": table.replace("table_", "").replace("_", "."), "mode": mode, "acceptance": acc,
               "mean_emitted": em, "implied_proposed_per_round": (em - 1) / acc, "block_length_K": k}
        if "samples" in r:
            tokens = r["samples"] * (max_new - 1)
            row.update(implied_rounds=tokens / em, verify_calls=r["verify_calls"])
        row["fits"] = row["implied_proposed_per_round"] <= k + 1e-9
        rows.append(row)
    return pd.DataFrame(rows)


def overlap(agg: pd.DataFrame) -> pd.DataFrame:
    """Pipelined vs serial ordinary, per draft: the decode time the overlapped target append saved, and
    the most it could save, min(sum of finalize, sum of draft proposal) of the serial run (a round
    costs at least max(finalize, prepare)), each per round."""
    piped = agg[agg.schedule == PIPELINED].set_index("draft")
    serial = agg[agg.schedule == ORDINARY].set_index("draft").loc[piped.index]
    bound = np.minimum(serial.finalize_ms, serial.draft_ms)
    out = pd.DataFrame({"serial ms/round": serial.ms_per_round, "pipelined ms/round": piped.ms_per_round,
                        "finalize ms/round": serial.finalize_ms / serial.rounds,
                        "draft ms/round": serial.draft_ms / serial.rounds,
                        "overlap gain": 1 - piped.decode_total_ms / serial.decode_total_ms,
                        "bound on gain": bound / serial.decode_total_ms})
    out["share of bound"] = out["overlap gain"] / out["bound on gain"]
    return out


def side_by_side(profile: Profile, agg: pd.DataFrame, device: str, others: list[str]) -> pd.DataFrame:
    """Decode tok/s and acceptance per mode, this profile's beside other profiles' (from their summary.json,
    where it exists). Compare timings only between columns whose device names the same card."""
    shown = {"decode tok/s": "decode_tok_s", "acceptance": "acceptance", "draft share": "draft_share"}
    cols = {(profile.name, "device"): {m: device for m in agg.index},
            **{(profile.name, col): agg[key].to_dict() for col, key in shown.items()}}
    for name in others:
        path = outputs_root() / name / "summary.json"
        if path.exists():
            s = json.loads(path.read_text())
            cols[(name, "device")] = {m: s["device"] for m in s["e2e"]}
            cols.update({(name, col): {m: r.get(key) for m, r in s["e2e"].items()} for col, key in shown.items()})
    df = pd.DataFrame(cols)
    return df.reindex([m for m in modes.LABELS if m in df.index])


# ---------------------------------------------------------------- thesis tables, ours beside theirs

def _side(ours: dict, theirs: dict, label: str, source: str) -> list[dict]:
    return [{"Mode": label, "Source": source, **ours}, {"Mode": label, "Source": "thesis", **theirs}]


def _stat_row(d: dict) -> dict:
    return {"Mean latency (ms)": d["mean_ms"], "P50 (ms)": d["p50_ms"], "P95 (ms)": d["p95_ms"], "Tok/s": d["tok_s"]}


def micro_tables(profile: Profile, micro: dict) -> dict[str, pd.DataFrame]:
    """Tables 4.1-4.4: head latency and draft decode step, ours beside the thesis's."""
    t, src = thesis_numbers(), profile.name
    tabs = {}
    tabs["4.1"] = pd.DataFrame(
        _side(_stat_row(micro["head"]["dense"]), _stat_row(t["table_4_1"]["dense"]), "Dense LM head", src)
        + _side(_stat_row(micro["head"]["flash"]), _stat_row(t["table_4_1"]["flash"]), "FlashHead", src))
    tabs["4.3"] = pd.DataFrame(
        _side(_stat_row(micro["model_step"]["dense"]), _stat_row(t["table_4_3"]["dense"]), "Dense model", src)
        + _side(_stat_row(micro["model_step"]["flash"]), _stat_row(t["table_4_3"]["flash"]), "Flash model", src))
    for n, key, tt, label in (("4.2", "head", "table_4_2", "Dense LM head vs. FlashHead"),
                              ("4.4", "model_step", "table_4_4", "Dense model vs. Flash model")):
        m = micro[key]
        tabs[n] = pd.DataFrame([
            {"Comparison": label, "Source": src, "Dense (ms)": m["dense"]["mean_ms"], "Flash (ms)": m["flash"]["mean_ms"],
             "Speedup": m["speedup"]},
            {"Comparison": label, "Source": "thesis", "Dense (ms)": t[tt]["dense_ms"], "Flash (ms)": t[tt]["flash_ms"],
             "Speedup": t[tt]["speedup"]}])
    return {k: tabs[k] for k in ("4.1", "4.2", "4.3", "4.4")}


def e2e_tables(profile: Profile, agg: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Tables 4.5-4.11: end-to-end runs, phase profile, deferred schedule, ours beside the thesis's."""
    t, src = thesis_numbers(), profile.name
    tabs = {}

    def e2e(cols: dict, table: str, which: list[str]) -> pd.DataFrame:
        rows = []
        for m in which:
            if m not in agg.index:
                continue
            ours = {c: agg.loc[m, k] for c, k in cols.items()}
            theirs = {c: t[table].get(m, {}).get(k) for c, k in cols.items()}
            rows += _side(ours, theirs, modes.LABELS[m], src)
        return pd.DataFrame(rows)

    tabs["4.5"] = e2e({"Decode Tok/s": "decode_tok_s", "TTFT (ms)": "ttft_ms", "Acceptance": "acceptance",
                       "Decode total (ms)": "decode_total_ms", "Draft propose (ms)": "draft_ms",
                       "Base verify (ms)": "verify_ms", "Finalize (ms)": "finalize_ms"},
                      "table_4_5", thesis_modes(ORDINARY))
    tabs["4.7"] = e2e({"Decode Tok/s": "decode_tok_s", "Decode total (ms)": "decode_total_ms",
                       "Draft propose share": "draft_share", "Base verify share": "verify_share",
                       "Finalize share": "finalize_share", "Acceptance": "acceptance", "Mean emitted": "mean_emitted"},
                      "table_4_7", [modes.name(d, ORDINARY) for d in ("dense", "dense_shared", "flash")])
    tabs["4.9"] = e2e({"Samples": "samples", "Decode Tok/s": "decode_tok_s", "TTFT (ms)": "ttft_ms",
                       "Decode total (ms)": "decode_total_ms", "Acceptance": "acceptance", "Mean emitted": "mean_emitted",
                       "Base verify calls": "verify_calls", "Base append calls": "append_calls"},
                      "table_4_9", thesis_modes(DEFERRED))
    tabs["4.6"] = speedups(agg, t["table_4_6"], src, thesis_modes(ORDINARY))
    tabs["4.10"] = speedups(agg, t["table_4_10"], src, thesis_modes(DEFERRED))
    tabs["4.8"] = diagnosis(agg, t["table_4_8"], src)
    tabs["4.11"] = draft_path(agg, t["table_4_11"], src)
    return {k: tabs[k] for k in sorted(tabs, key=lambda s: int(s.split(".")[1]))}


def speedups(agg: pd.DataFrame, theirs: dict, src: str, which: list[str]) -> pd.DataFrame:
    base, dense, flash = which
    rows = []
    for key, (a, b) in {"baseline_vs_dense": (base, dense), "baseline_vs_flash": (base, flash),
                        "dense_vs_flash": (dense, flash)}.items():
        if a in agg.index and b in agg.index:
            ta, tb = agg.loc[a, "decode_tok_s"], agg.loc[b, "decode_tok_s"]
            label = f"{modes.LABELS[a]} vs. {modes.LABELS[b]}"
            rows += [{"Comparison": label, "Source": src, "A (tok/s)": ta, "B (tok/s)": tb, "Speedup": tb / ta},
                     {"Comparison": label, "Source": "thesis", "A (tok/s)": theirs[key]["a"],
                      "B (tok/s)": theirs[key]["b"], "Speedup": theirs[key]["speedup"]}]
    return pd.DataFrame(rows)


def diagnosis(agg: pd.DataFrame, theirs: dict, src: str) -> pd.DataFrame:
    flash = modes.name("flash", ORDINARY)
    if flash not in agg.index:
        return pd.DataFrame()
    f = agg.loc[flash]
    proposal = f.draft_ms
    ours = {"outside_proposal_share": 1 - f.draft_share, "head_share_of_decode": f.draft_head_ms / f.decode_total_ms,
            "body_share_of_proposal": f.draft_body_ms / proposal, "head_share_of_proposal": f.draft_head_ms / proposal,
            "acceptance": f.acceptance, "mean_emitted": f.mean_emitted}
    names = {"outside_proposal_share": "Share of decode time outside draft proposal",
             "head_share_of_decode": "Proposal head share of decode time",
             "body_share_of_proposal": "Draft body share of proposal time",
             "head_share_of_proposal": "Draft head share of proposal time",
             "acceptance": "Acceptance", "mean_emitted": "Mean emitted per round"}
    return pd.DataFrame([{"Evidence (FlashHead draft)": names[k], src: ours[k], "thesis": theirs[k]} for k in names])


def draft_path(agg: pd.DataFrame, theirs: dict, src: str) -> pd.DataFrame:
    rows = []
    for m in thesis_modes(DEFERRED)[1:]:
        if m not in agg.index:
            continue
        r = agg.loc[m]
        tokens = r.decode_tok_s * r.decode_total_ms / 1000
        ours = {"Draft path (ms)": r.draft_ms, "Draft path share": r.draft_share,
                "Draft ms/decode tok": r.draft_ms / tokens, "Draft path Tok/s": 1000 * tokens / r.draft_ms}
        th = theirs[m]
        rows += _side(ours, {"Draft path (ms)": th["draft_ms"], "Draft path share": th["draft_share"],
                             "Draft ms/decode tok": th["draft_ms_per_token"], "Draft path Tok/s": th["draft_tok_s"]},
                      modes.LABELS[m], src)
    return pd.DataFrame(rows)


def save_tables(tabs: dict[str, pd.DataFrame], profile: Profile, run: Path) -> Path:
    """All tables in one markdown file (and one CSV each) under outputs/<profile>/tables/, naming the run."""
    d = profile.out_dir / "tables"
    d.mkdir(parents=True, exist_ok=True)
    src = run_source(profile, run)
    micro = profile.out_dir / "microbench.json"
    stamp = json.loads(micro.read_text()).get("written", {}) if micro.exists() else {}
    md = [f"Profile `{profile.name}`; end-to-end tables from `{src['run']}` (commit {src['run_commit']}); "
          f"microbenchmark tables (4.1-4.4) from microbench.json (commit {stamp.get('commit', 'not recorded')}).\n"]
    for name, tab in tabs.items():
        tab.to_csv(d / f"table_{name.replace('.', '_')}.csv", index=False)
        md.append(f"## Table {name}\n\n{tab.to_markdown(index=False, floatfmt='.4g')}\n")
    (d / "tables.md").write_text("\n".join(md))
    return d


# ---------------------------------------------------------------- summary.json

def run_source(profile: Profile, run: Path) -> dict:
    """Which run a summary or table comes from: its directory (relative to the profile's outputs) and
    the commit it ran at, from its config.json."""
    cfg = json.loads((Path(run) / "config.json").read_text())
    wrote = [cfg.get("commit", "unknown"), *(r.get("commit", "unknown") for r in cfg.get("resumed", []))]
    return {"run": str(Path(run).relative_to(profile.out_dir)), "run_commit": cfg.get("commit", "unknown"),
            "run_started": cfg.get("started"), "sample_commits": list(dict.fromkeys(wrote))}   # each resume's too


def extra_summary(profile: Profile) -> dict:
    """Profile-specific additions to summary.json: target-step timings, and the peer, adaptive and sampling
    studies' sections where they ran (their files without their raw rows)."""
    from .sampling_study import summary_section as sampling_section
    read = lambda name: json.loads((profile.out_dir / name).read_text())
    out = {"target_step": read("target_step.json")} if (profile.out_dir / "target_step.json").exists() else {}
    if (profile.out_dir / "peers.json").exists():
        out["peers"] = {k: v for k, v in read("peers.json").items() if k != "rows"}
    if (profile.out_dir / "adaptive.json").exists():
        a = read("adaptive.json")
        out["adaptive"] = {k: a[k] for k in ("schedule", "k", "prompts", "e2e_run", "regret", "policies")}
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
                                          "transfer_ms")}
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
    a measured draft step), the predicted and measured decode tok/s and their ratio, with the measured share
    of rounds whose verify call was skipped. Needs notebook 03's target_step.json (from `extra`, else the
    file); empty without it."""
    from .costmodel import summary_section
    ts = (extra or {}).get("target_step")
    path = profile.out_dir / "target_step.json"
    if ts is None and path.exists():
        ts = json.loads(path.read_text())
    if not ts or "verify_ms" not in ts or "model_step" not in micro:
        return {}
    return {"k": profile.decode.k, "modes": summary_section(agg, micro, ts, profile.decode.k)}


def acceptance_note(profile: Profile) -> str:
    if profile.models.source == "synthetic":
        return "synthetic pair: acceptance is artificial"
    if profile.models.source == "gguf":
        return "real weights: SmolLM2-135M-Instruct and its own early-exit drafts (self-speculation), not the thesis's pair"
    return "real models"


def _num(v):
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def write_summary(profile: Profile, data: dict) -> Path:
    from .runs import save_json                                             # stamped like every result file
    return save_json(profile, "summary.json", data)


def peers_table(data: dict, agg: pd.DataFrame | None = None) -> pd.DataFrame:
    """Notebook 04: Hugging Face generate() peers (peers.json) beside this engine (lib/peers.py: table)."""
    from .peers import table
    return table(data, agg)
