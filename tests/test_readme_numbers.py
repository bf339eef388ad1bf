"""The README says what the committed result files say. Recomputed from outputs/<profile>/ and required, so rounded,
in the README: the headline table (each profile column's draft block, target step, decode tok/s, FlashHead/dense over
the rounds measured and modelled, acceptance, the runs it names), the ranges and bounds above it, the goal table's
verify row and int4 kernel figures, the batch and context studies' tables and the real-weights paragraph. A re-run
committed without updating the README fails here. Both are read as committed (git HEAD): a local `make reproduce`,
which rewrites outputs/ with this machine's numbers, does not fail it."""
import json
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@cache
def committed(path: str) -> str:
    """A file's text at HEAD (an error where HEAD lacks it); the tests skip outside a git checkout."""
    try:
        in_git = git("rev-parse", "--verify", "HEAD").returncode == 0
    except OSError:
        in_git = False
    if not in_git:
        pytest.skip("needs the git checkout's committed README and results", allow_module_level=True)
    shown = git("show", f"HEAD:{path}")
    assert shown.returncode == 0, f"{path} is not committed: {shown.stderr.strip()}"
    return shown.stdout


def headline_table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """(the profiles of the table's columns, {row label: its cells}) for the first table after 'The answer so far'."""
    lines = text[text.index("**The answer so far.**"):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    profiles = [re.search(r"\(`([a-z0-9_]+)`\)", cell).group(1) for cell in table[0][1:]]
    return profiles, {row[0]: row[1:] for row in table[2:]}


def load(profile: str, name: str) -> dict:
    return json.loads(committed(f"outputs/{profile}/{name}"))


def readme_row(start: str) -> str:
    """The README's one line that starts with `start` (a table row)."""
    return next(line for line in committed("README.md").splitlines() if line.startswith(start))


def rounds_ratios(profile: str) -> dict[str, tuple[float, float]]:
    """schedule -> FlashHead/dense tok/s over the rounds, (measured, modelled), from summary.json's cost model."""
    model = load(profile, "summary.json")["cost_model"]["modes"]
    return {s: tuple(model[f"flash_{s}"][key] / model[f"dense_{s}"][key]
                     for key in ("rounds_measured_tok_s", "rounds_predicted_tok_s"))
            for s in ("ordinary", "deferred", "pipelined") if f"flash_{s}" in model}


def expected_cells(profile: str) -> dict[str, list[str]]:
    """Row label's start -> the strings its cell must hold for this profile, from the result files."""
    block, summary = load(profile, "microbench.json")["block"], load(profile, "summary.json")
    target, e2e = load(profile, "target_step.json"), summary["e2e"]
    dense, flash = block["dense"]["mean_ms"] / block["k"], block["flash"]["mean_ms"] / block["k"]
    tok_s = {mode: f"{row['decode_tok_s']:.1f}" for mode, row in e2e.items()}

    return {"draft step": [f"{dense:.3f} → {flash:.3f} ({dense / flash:.2f}×)"],
            "target step": [f"{target['single']['mean_ms']:.2f} ms"],
            "decode tok/s": [f"{tok_s['baseline']};", f"{tok_s['dense_ordinary']} / {tok_s['flash_ordinary']}",
                             f"{tok_s['dense_deferred']} / {tok_s['flash_deferred']}"],
            "FlashHead / dense over the rounds": [f"{measured:.3f} ({modelled:.3f})"
                                                  for measured, modelled in rounds_ratios(profile).values()],
            "acceptance": [f"{e2e['dense_ordinary']['acceptance']:.3f} / {e2e['flash_ordinary']['acceptance']:.3f}"]}


def test_the_table_is_found_and_names_committed_profiles():
    profiles, rows = headline_table(committed("README.md"))
    assert profiles and all(load(p, "summary.json")["run"] for p in profiles)
    assert len(rows) >= 5 and all(len(cells) == len(profiles) for cells in rows.values())


@pytest.mark.parametrize("profile", headline_table(committed("README.md"))[0])
def test_each_column_matches_its_result_files(profile):
    profiles, rows = headline_table(committed("README.md"))
    column = profiles.index(profile)
    for start, wanted in expected_cells(profile).items():
        (label,) = [label for label in rows if label.startswith(start)]
        missing = [w for w in wanted if w not in rows[label][column]]
        assert not missing, f"README's '{label}' for {profile}: {missing} not in {rows[label][column]!r}"
    run = load(profile, "summary.json")["run"]
    assert f"`outputs/{profile}/{run}`" in committed("README.md"), f"README does not name {profile}'s run {run}"


def test_a_stale_cell_is_caught():
    profiles, rows = headline_table(committed("README.md"))
    wanted = expected_cells(profiles[0])["target step"][0]
    stale = committed("README.md").replace(f"| {wanted}", "| 99.99 ms", 1)
    _, stale_rows = headline_table(stale)
    (label,) = [label for label in stale_rows if label.startswith("target step")]
    assert wanted in rows[label][0] and wanted not in stale_rows[label][0]


def test_the_int4_kernel_figures_match_their_table():
    """The goal table's int4 row quotes two_gpu_awq's int4_kernels.json: a layer's four projections, µs."""
    table = load("two_gpu_awq", "int4_kernels.json")
    shapes = table["shapes"].values()
    rows = [str(m) for m in (1, 2, 4, 8, 16)]
    layer = {kernel: [sum(s["rows"][m][kernel]["p50_ms"] for s in shapes) * 1e3 for m in rows]
             for kernel in ("w4a16_mma", "w4a16", "marlin")}
    text = committed("README.md")
    assert " / ".join(f"{us:.1f}" for us in layer["w4a16_mma"]) in text
    for kernel in ("w4a16", "marlin"):
        assert f"{min(layer[kernel]):.1f}-{max(layer[kernel]):.1f}" in text, kernel
    assert f"floor {sum(s['floor_ms'] for s in shapes) * 1e3:.1f}" in text


def test_the_batch_study_table_matches_its_file():
    """'Past the thesis' quotes two_gpu's head_batches.json: the dense and batched FlashHead means and speedups."""
    rows = load("two_gpu", "head_batches.json")["rows"]
    text = committed("README.md")
    for label, values in (("dense head, ms", [r["dense"]["mean_ms"] for r in rows]),
                          ("FlashHead batched, ms", [r["flash"]["mean_ms"] for r in rows])):
        assert " | ".join(f"{v:.3f}" for v in values) in text, label
    assert "| speedup | " + " | ".join(f"{r['speedup']:.2f}" for r in rows) + " |" in text


def test_the_real_weights_paragraph_matches_smollm2s_files():
    """'What the real-weights profile shows' quotes outputs/smollm2/: acceptance, tokens a round, containment."""
    e2e, clusters = load("smollm2", "summary.json")["e2e"], load("smollm2", "clustering.json")
    text = committed("README.md")
    early, full = e2e["dense_ordinary"], e2e["flash_full_ordinary"]
    assert early["acceptance"] == e2e["flash_ordinary"]["acceptance"] and f"({early['acceptance']:.3f} each" in text
    assert f"has {full['acceptance']:.3f} of its proposals accepted ({full['mean_emitted']:.2f} tokens" in text
    trajectory = {p["n_probes"]: p["top1"] for p in clusters["trajectory_probe_sweep"]}[clusters["n_probes"]]
    assert f"is {clusters['top1_containment']:.3f} at prompt positions and {trajectory:.3f}" in text
    assert f"mean cosine {clusters['mean_cosine']:.5f} here" in text


def test_the_answer_states_the_ranges_of_the_table_s_runs():
    """'The answer so far' gives FlashHead's draft-step gain and its decoding change, as ranges over the table's
    profiles (K = 6 block means; decode tok/s, every schedule of each run)."""
    profiles, _ = headline_table(committed("README.md"))
    gains, changes = [], []
    for p in profiles:
        block, e2e = load(p, "microbench.json")["block"], load(p, "summary.json")["e2e"]
        gains.append(block["dense"]["mean_ms"] / block["flash"]["mean_ms"])
        changes += [100 * (e2e[m]["decode_tok_s"] / e2e[m.replace("flash", "dense", 1)]["decode_tok_s"] - 1)
                    for m in e2e if m.startswith("flash_") and m.replace("flash", "dense", 1) in e2e]
    answer = committed("README.md").split("**The answer so far.**")[1].split("\n\n")[0]
    assert f"step {min(gains):.2f}-{max(gains):.2f}× faster" in answer
    assert f"decoding only {min(changes):.1f} % to +{max(changes):.1f} %" in answer


def test_the_verify_goal_row_matches_the_target_steps():
    """The goal table's 'verify of 8 tokens' row quotes each int4 and bf16 target's target_step.json."""
    row = readme_row("| verify of 8 tokens")
    steps = {p: load(p, "target_step.json") for p in ("h100", "h100awq", "two_gpu_awq")}
    single = {p: t["single"]["mean_ms"] for p, t in steps.items()}
    assert f"`h100awq`: {steps['h100awq']['verify_ms']['8']:.2f} against {single['h100awq']:.2f} ms" in row
    assert f"`h100` {steps['h100']['verify_ms']['8'] / single['h100']:.3f}×" in row
    ratios = [ms / single["two_gpu_awq"] for n, ms in steps["two_gpu_awq"]["verify_ms"].items() if int(n) >= 2]
    assert f"`two_gpu_awq` {min(ratios):.2f}-{max(ratios):.2f}×" in row


def test_the_cost_model_goal_row_matches_each_run():
    """The goal table's end-to-end ratio row: each profile's FlashHead/dense over the rounds, measured against
    modelled (ordinary / deferred), and the bound it states (in points, rounded) holds for every schedule of the run."""
    row = readme_row("| end-to-end FlashHead/dense ratio")
    for profile, bound in (("h100", 0.1), ("h100awq", 0.2), ("two_gpu", 0.3), ("two_gpu_awq", 0.8)):
        pair = rounds_ratios(profile)
        (mo, po), (md, pd) = pair["ordinary"], pair["deferred"]
        assert f"`{profile}` ({mo:.3f} / {md:.3f} against {po:.3f} / {pd:.3f}" in row, profile
        assert f"{bound} " in row and all(round(abs(m - p) * 100, 1) <= bound for m, p in pair.values()), profile


def test_the_cost_model_s_tok_s_bounds_match_the_runs():
    """Above the headline table: how close the model's tok/s comes to each run's (summary.json's cost_model), on one
    GPU (every mode), on two (the serial schedules) and for the pipelined one."""
    off = {p: {mode: 100 * (row["ratio"] - 1) for mode, row in load(p, "summary.json")["cost_model"]["modes"].items()}
           for p in ("h100", "h100awq", "two_gpu", "two_gpu_awq")}
    one = max(abs(v) for p in ("h100", "h100awq") for v in off[p].values())
    two = [abs(v) for p in ("two_gpu", "two_gpu_awq") for mode, v in off[p].items()
           if mode.endswith(("ordinary", "deferred"))]
    piped = [v for p in ("two_gpu", "two_gpu_awq") for mode, v in off[p].items() if mode.endswith("pipelined")]
    text = " ".join(committed("README.md").split("**The answer so far.**")[1].split("## Two commands")[0].split())
    assert f"tok/s within {one:.1f} % on one GPU" in text
    pipelined = f"{min(piped):.0f}-{max(piped):.0f} %"
    assert f"schedules within {max(two):.1f} % on two, the pipelined one {pipelined} over" in text


def test_the_context_table_matches_its_file():
    """'Longer contexts' quotes outputs/h100/context.json: the draft's ms a proposed token (dense / FlashHead), the
    step ratio, and the target's one-token and K + 1 calls, at every position (the projections are notebook 04's)."""
    rows = load("h100", "context.json")["rows"]
    text = committed("README.md")
    assert "| position | " + " | ".join(f"{r['position']:,}" for r in rows) + " |" in text
    draft = " | ".join(f"{r['draft']['dense']['per_token_ms']:.3f} / {r['draft']['flash']['per_token_ms']:.3f}"
                       for r in rows)
    assert f"| draft, dense / FlashHead (measured) | {draft} |" in text
    assert " | ".join(f"{r['draft_step_ratio']:.3f}" for r in rows) in text
    one = [f"{t['mean_ms']:.2f} ({100 * t['floor_ms'] / t['mean_ms']:.0f} %)" for t in (r["target"]["1"] for r in rows)]
    assert "| target, one token (measured; share of its floor) | " + " | ".join(one) + " |" in text
    verify = " | ".join(f"{r['target']['K+1']['mean_ms']:.2f}" for r in rows)
    assert f"| target, verify of K + 1 = 7 (measured) | {verify} |" in text
