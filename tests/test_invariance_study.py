"""The invariance side study (lib/study/invariance.py) on smoke: both settings of decode.batch_invariant side by
side, every greedy mode exact with the invariant target, a step time per call length and setting."""
from dataclasses import replace

from lib.config import load_profile
from lib.study import invariance


def test_invariance_study_reports_both_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path / "outputs"))
    p = load_profile("smoke")
    p = replace(p, prompts=replace(p.prompts, side_prompts=1), decode=replace(p.decode, max_new_tokens=12),
                bench=replace(p.bench, warmup=1, iters=10, verify_lengths=[1, 2]))
    data = invariance.invariance_study(p)
    modes = {(r["setting"], r["mode"]) for r in data["modes"]}
    assert modes == {(s, m) for s in invariance.SETTINGS for m in ("dense_ordinary", "dense_deferred",
                     "dense_shared_ordinary", "dense_shared_deferred", "flash_ordinary", "flash_deferred")}
    assert all(r["exact_match_rate"] == 1.0 for r in data["modes"] if r["setting"] == "invariant")
    assert data["rows"] == p.decode.k_max + 1 and set(data["step_ms"]) == set(invariance.SETTINGS)
    assert all(set(calls) == {"1", "2"} for calls in data["step_ms"].values())
    assert (p.out_dir / "invariance.json").exists()


def test_a_profile_of_adaptive_drafts_only_has_step_times_and_no_mode_rows():
    """Adaptive drafts are left out of the study (greedy_modes), so with no other draft invariance.json's modes is
    empty: its tables are then an empty mode table beside the step times (pivot failed: KeyError 'setting')."""
    from lib.report.tables import invariance_tables
    p = load_profile("smoke")
    p = replace(p, decode=replace(p.decode, modes=["baseline", "flash_adaptive", "bandit_ucb"]))
    assert invariance.greedy_modes(p) == []
    data = {"modes": [], "step_ms": {s: {"1": {"mean_ms": 1.5}, "2": {"mean_ms": 2.5}} for s in invariance.SETTINGS}}
    exact, steps = invariance_tables(data)
    assert exact.empty
    assert steps.loc[2, "variant"] == 2.5 and list(steps.columns) == list(invariance.SETTINGS)
    row = {"setting": "invariant", "mode": "flash_ordinary", "samples": 1, "exact_match_rate": 1.0, "acceptance": 0.5}
    exact, _ = invariance_tables({**data, "modes": [row]})
    assert exact.loc["flash_ordinary", ("acceptance", "invariant")] == 0.5
