"""Notebook 02's batch study (lib/study/head_batches.py) on smoke: the union of probed clusters against the batch
size, both heads' batched times and their bytes, the table and the figure."""
from dataclasses import replace

import pytest

from lib.config import load_profile
from lib.study import microbench


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("STUDY_OUTPUTS", str(tmp_path_factory.mktemp("outputs")))
    p = load_profile("smoke")
    p = replace(p, decode=replace(p.decode, max_new_tokens=12),
                bench=replace(p.bench, warmup=1, iters=10, head_batches=[1, 4, 16, 10 ** 6]))
    drafts, _, _ = microbench.step_drafts(p)
    yield p, microbench.head_batch_study(p, drafts)
    mp.undo()


def test_batch_sizes_past_the_states_are_skipped_and_said(study):
    p, data = study
    assert [r["batch"] for r in data["rows"]] == [1, 4, 16] and data["skipped"] == [10 ** 6]
    assert data["n_states"] >= 16 and (p.out_dir / "head_batches.json").exists()


def test_one_row_probes_exactly_p_clusters_and_a_batch_at_most_b_times_p(study):
    _, data = study
    c, probes = data["n_clusters"], data["n_probes"]
    one, four, sixteen = data["rows"]
    assert one["union_share"] == one["union_share_p5"] == one["union_share_p95"] == probes / c
    assert one["uniform_share"] == pytest.approx(probes / c)
    assert probes / c <= four["union_share_p5"] <= four["union_share_p95"] <= min(1, 4 * probes / c)
    assert four["union_share"] <= sixteen["union_share"] <= min(1, 16 * probes / c)


def test_bytes_and_speedup_follow_from_the_measured_quantities(study):
    _, data = study
    V, d, c, s = data["vocab"], data["hidden"], data["n_clusters"], data["n_special"]
    for r in data["rows"]:
        assert r["dense_bytes"] == V * d * 4                                    # fp32 smoke weights
        assert r["flash_bytes"] == pytest.approx((c + r["union_share"] * V + s) * d * 4)   # c clusters of V / c
        assert r["bytes_ratio"] == pytest.approx(r["dense_bytes"] / r["flash_bytes"])
        assert r["timed_flash_bytes"] == pytest.approx((c + r["timed_union_share"] * V + s) * d * 4)   # timed batch
        assert r["speedup"] == pytest.approx(r["dense"]["mean_ms"] / r["flash"]["mean_ms"])


def test_the_table_and_figure_show_every_batch_size(study):
    _, data = study
    table = microbench.head_batch_table(data)
    assert list(table.index) == [1, 4, 16] and table.loc[1, "union share"] == data["rows"][0]["union_share"]
    assert len(microbench.head_batch_plot(data).axes) == 2
    labels = lambda d: [line.get_label() for line in microbench.head_batch_plot(d).axes[1].get_lines()]
    assert data["flash_path"] == "torch" and "FlashHead (union GEMM)" in labels(data)          # a CPU
    assert "FlashHead (batched Triton kernel)" in labels({**data, "flash_path": "triton"})


def test_a_study_whose_batch_sizes_are_all_past_the_states_shows_an_empty_table(tmp_path, monkeypatch):
    """bench.head_batches may all exceed the states (one short prompt, say): every size is skipped and said, and the
    notebook's table and figure show that, instead of stopping on a KeyError."""
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path))
    p = load_profile("smoke")
    p = replace(p, decode=replace(p.decode, max_new_tokens=4), prompts=replace(p.prompts, limit=1),
                bench=replace(p.bench, warmup=1, iters=10, head_batches=[10 ** 6]))
    data = microbench.head_batch_study(p, microbench.step_drafts(p)[0])
    assert data["rows"] == [] and data["skipped"] == [10 ** 6]
    table = microbench.head_batch_table(data)
    assert table.empty and table.index.name == "batch"
    assert microbench.head_batch_plot(data) is None
