"""Notebook 04: the thesis's tables 4.1-4.11 with ours beside its published numbers (params/thesis_tables.yaml),
whether the thesis's own numbers fit its definitions, this profile beside other profiles' summary.json, and
the tables written to outputs/<profile>/tables/."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .. import modes
from ..config import Profile, outputs_root, thesis_numbers
from ..modes import DEFERRED, ORDINARY
from .summary_json import acceptance_note, run_source


def thesis_modes(schedule: str) -> list[str]:
    """The modes the thesis compares under a schedule: baseline, dense draft, FlashHead draft."""
    return [modes.BASELINE, modes.name(modes.DENSE, schedule), modes.name(modes.FLASH, schedule)]


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


def side_by_side(profile: Profile, agg: pd.DataFrame, device: str, others: list[str]) -> pd.DataFrame:
    """Decode tok/s and acceptance per mode, this profile's beside other profiles' (from their summary.json,
    where it exists), each beside the card its end-to-end run ran on (`device`: this profile's). Compare timings
    only between columns whose device names the same card."""
    shown = {"decode tok/s": "decode_tok_s", "acceptance": "acceptance", "draft share": "draft_share"}
    cols = {(profile.name, "device"): {m: device for m in agg.index},
            **{(profile.name, col): agg[key].to_dict() for col, key in shown.items()}}
    for name in others:
        path = outputs_root() / name / "summary.json"
        if path.exists():
            s = json.loads(path.read_text())
            card = s.get("run_device") or s["device"]          # the e2e run's card (older summaries: notebook 02's)
            cols[(name, "device")] = {m: card for m in s["e2e"]}
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
                      "table_4_7", [modes.name(d, ORDINARY) for d in (modes.DENSE, modes.DENSE_SHARED, modes.FLASH)])
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
    flash = modes.name(modes.FLASH, ORDINARY)
    if flash not in agg.index:
        return pd.DataFrame()
    f = agg.loc[flash]
    proposal = f.draft_ms
    if f.get("draft_block_ms", 0) > 0:                                       # one graph a round: body and head together
        f = f.copy()
        f["draft_body_ms"] = f["draft_head_ms"] = float("nan")
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
    """All tables in one markdown file (and one CSV each) under outputs/<profile>/tables/, naming the run and what
    its acceptance is (artificial on a synthetic pair)."""
    d = profile.out_dir / "tables"
    d.mkdir(parents=True, exist_ok=True)
    src = run_source(profile, run)
    micro = profile.out_dir / "microbench.json"
    stamp = json.loads(micro.read_text()).get("written", {}) if micro.exists() else {}
    md = [f"Profile `{profile.name}`; end-to-end tables from `{src['run']}` (commit {src['run_commit']}); "
          f"microbenchmark tables (4.1-4.4) from microbench.json (commit {stamp.get('commit', 'not recorded')}). "
          f"Acceptance and mean emitted: {acceptance_note(profile)}.\n"]       # the file is read on its own
    for name, tab in tabs.items():
        tab.to_csv(d / f"table_{name.replace('.', '_')}.csv", index=False)
        md.append(f"## Table {name}\n\n{tab.to_markdown(index=False, floatfmt='.4g')}\n")
    (d / "tables.md").write_text("\n".join(md))
    return d
