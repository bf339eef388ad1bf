"""Notebook 03's context study (lib/study/context_lengths.py) on smoke: every call timed at every position, the
bytes each must read, the cost model's projection from them (lib/costmodel.context_projection), the table and the
figure, and one-line errors for bad settings."""
from dataclasses import replace

import pandas as pd
import pytest
import yaml

from lib import costmodel
from lib.config import ConfigError, load_profile
from lib.models import checkpoints
from lib.report.context import context_plot, context_table
from lib.study import context_lengths as ctx_study

LENGTHS = [16, 200]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("STUDY_OUTPUTS", str(tmp_path_factory.mktemp("outputs")))
    p = load_profile("smoke")
    p = replace(p, bench=replace(p.bench, warmup=1, iters=10, context_lengths=LENGTHS))   # 200 > the e2e cache
    yield p, ctx_study.context_study(p, checkpoints.load_target(p))
    mp.undo()


def test_every_call_is_timed_at_every_position(study):
    p, data = study
    assert [r["position"] for r in data["rows"]] == LENGTHS and (p.out_dir / "context.json").exists()
    for r in data["rows"]:
        assert set(r["draft"]) == {"dense", "flash"} and set(r["target"]) == {"1", "K", "K+1"}
        assert all(s["n"] >= 10 and s["mean_ms"] > 0 for part in ("draft", "target") for s in r[part].values())
        assert r["draft"]["dense"]["per_token_ms"] == pytest.approx(r["draft"]["dense"]["mean_ms"] / data["k"])
        assert r["draft_step_ratio"] == pytest.approx(r["draft"]["dense"]["mean_ms"] / r["draft"]["flash"]["mean_ms"])
        assert r["cache_positions"] >= r["position"] + data["k"] + 1                # engines sized for the position
        assert r["draft_fed_two"] == {}        # a CPU's drafts step token by token: no block launched ahead to time
    assert data["rows"][0]["cache_positions"] < data["rows"][1]["cache_positions"]


def test_bytes_are_the_weights_once_a_call_and_the_cache_up_to_its_position(study):
    p, data = study
    w, k, cfg = data["weight_bytes"], data["k"], p.models.synthetic
    per_position = {part: 2 * s.num_hidden_layers * s.num_key_value_heads * s.head_dim * 4   # fp32 K and V
                    for part, s in (("draft", cfg.draft), ("target", cfg.target))}
    for r in data["rows"]:
        n = r["position"]
        for name in ("dense", "flash"):                                 # k steps at positions n .. n + k - 1
            kv = per_position["draft"] * sum(n + i + 1 for i in range(k))
            assert r["draft"][name]["bytes"] == k * (w["draft_body"] + w[f"draft_{name}_head"]) + kv
        for name, m in costmodel.round_call_lengths(k).items():
            assert r["target"][name]["bytes"] == w["target"] + per_position["target"] * (n + m)
    assert w["draft_flash_head"] < w["draft_dense_head"]


def costs_row(position, dense_ms, flash_ms, target_ms, k):
    return {"position": position, "draft_step_ratio": dense_ms / flash_ms,
            "draft": {"dense": {"mean_ms": k * dense_ms, "per_token_ms": dense_ms, "bytes": 1},
                      "flash": {"mean_ms": k * flash_ms, "per_token_ms": flash_ms, "bytes": 1}},
            "target": {name: {"mean_ms": target_ms + 0.1 * n, "bytes": 1}
                       for name, n in costmodel.round_call_lengths(k).items()}}


def agg_of(emitted, launched_ahead=0):
    """An e2e run's table as the projection reads it: 10 rounds a mode, the deferred ones `launched_ahead`."""
    index = ["dense_ordinary", "flash_ordinary", "dense_deferred", "flash_deferred"]
    return pd.DataFrame({"mean_emitted": [emitted] * 4, "schedule": ["ordinary"] * 2 + ["deferred"] * 2,
                         "rounds": [10] * 4, "launched_ahead": [0, 0, launched_ahead, launched_ahead]}, index=index)


def test_projection_charges_the_rounds_launched_ahead_the_block_fed_two_tokens():
    k, em = 4, 3.0
    row = costs_row(4096, 2.0, 1.5, 20.0, k)
    row["draft_fed_two"] = {"dense": {"per_token_ms": 2.4}, "flash": {"per_token_ms": 1.9}}
    proj = costmodel.context_projection({"k": k, "rows": [row]}, agg_of(em, launched_ahead=6))
    block = k * (0.4 * 1.5 + 0.6 * 1.9)                                    # 6 of 10 rounds launched ahead
    assert proj.loc[4096, "flash_deferred tok/s"] == pytest.approx(1000 * em / (20.0 + 0.1 * (k + 1) + block))
    ordinary = 1000 * em / ((1 - costmodel.skip_share(costmodel.per_token_acceptance(em, k), "ordinary"))
                            * (20.0 + 0.1 * k) + k * 1.5 + 20.1)           # never launched ahead: T_q alone
    assert proj.loc[4096, "flash_ordinary tok/s"] == pytest.approx(ordinary)
    del row["draft_fed_two"]                                               # a study that did not time it: T_q
    before = costmodel.context_projection({"k": k, "rows": [row]}, agg_of(em, launched_ahead=6))
    assert before.loc[4096, "flash_deferred tok/s"] == pytest.approx(1000 * em / (20.0 + 0.1 * (k + 1) + k * 1.5))


def test_projection_is_the_cost_model_at_each_position():
    k, em = 4, 3.0
    ctx = {"k": k, "rows": [costs_row(64, 1.0, 1.0, 10.0, k), costs_row(4096, 2.0, 1.5, 20.0, k)]}
    proj = costmodel.context_projection(ctx, agg_of(em))
    assert list(proj.index) == [64, 4096]
    assert proj.loc[64, "deferred: flash/dense"] == pytest.approx(1.0)            # equal draft steps: no gain
    assert proj.loc[64, "ordinary: flash/dense"] == pytest.approx(1.0)
    deferred = 1000 * em / (20.0 + 0.1 * (k + 1) + k * 1.5)                         # T_p(K+1) + K T_q, no append
    assert proj.loc[4096, "flash_deferred tok/s"] == pytest.approx(deferred)
    assert proj.loc[4096, "baseline tok/s"] == pytest.approx(1000 / 20.1)
    assert 1 < proj.loc[4096, "deferred: flash/dense"] < proj.loc[4096, "draft step dense/flash (measured)"]


def test_table_and_figure(study, tmp_path):
    _, data = study
    tab = context_table(data)
    assert list(tab.index) == LENGTHS and {"dense ms/token", "flash ms/token", "dense/flash", "target 1 ms"} <= set(tab)
    timed = {**data, "rows": [{**r, "draft_fed_two": {"dense": {"per_token_ms": 0.7}}} for r in data["rows"]]}
    assert list(context_table(timed)["dense fed two ms/token"]) == [0.7, 0.7]   # a GPU's block launched ahead
    assert not any("fed two" in c for c in tab)
    proj = pd.DataFrame({"deferred: flash/dense": [1.0, 1.0]}, index=pd.Index(LENGTHS, name="position"))
    fig = context_plot(data, proj)
    assert len(fig.axes) == 3 and any("projected" in t.get_text() for t in fig.axes[2].get_legend().get_texts())
    saved = context_plot(data, proj, tmp_path / "figures" / "context_lengths.png")
    assert saved == tmp_path / "figures" / "context_lengths.png" and saved.stat().st_size > 0


@pytest.mark.parametrize("change, message", [
    ({"bench": {"context_lengths": []}}, "the context study needs bench.context_lengths"),
    ({"bench": {"context_lengths": [64, 0]}}, r"bench.context_lengths must be positions >= 1, got \[64, 0\]"),
])
def test_bad_context_settings_stop_in_one_line(tmp_path, change, message):
    data = yaml.safe_load(open("params/smoke.yaml"))
    data["bench"].update(change["bench"])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        load_profile(str(path))


def test_the_context_study_named_by_notebook_03s_parameter_needs_context_lengths_too():
    """Notebook 03's side_studies="context" on a profile without bench.context_lengths (which the profile rules allow
    where the profile's own side studies leave the context study out) stops in the rule's one line, before any work."""
    from dataclasses import replace
    from lib.study import common
    p = load_profile("smoke")
    p = replace(p, side_studies=[], bench=replace(p.bench, context_lengths=[]))
    assert common.side_studies(p, "sampling") == ["sampling"]
    with pytest.raises(ValueError, match="the context study needs bench.context_lengths"):
        common.side_studies(p, "sampling,context")
