"""Notebook 01's cluster-size study (lib/study/cluster_sizes.py) on smoke: equal numbers of scored tokens at every
cluster size, the bytes each setting reads, agreement with the dense head and the target, the summary, the table
and the figure, and a clear error for a size that does not divide the vocabulary."""
from dataclasses import replace

import pytest

from lib.config import load_profile
from lib.profile_rules import ConfigError
from lib.study import reclustering

SIZES = [8, 16, 64]


def smoke(**clustering):
    p = load_profile("smoke")
    return replace(p, decode=replace(p.decode, max_new_tokens=12), bench=replace(p.bench, warmup=1, iters=10),
                   clustering=replace(p.clustering, **clustering))


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("STUDY_OUTPUTS", str(tmp_path_factory.mktemp("outputs")))
    p = smoke(size_sweep=SIZES, probe_sweep=[1, 4, 16, 256])
    yield p, reclustering.cluster_size_study(p, progress=False)
    mp.undo()


def test_every_size_is_clustered_equally_and_scores_the_same_token_budgets(study):
    p, data = study
    assert [s["cluster_size"] for s in data["sizes"]] == SIZES and all(s["equal_sizes"] for s in data["sizes"])
    assert data["scored_tokens"] == [16, 64, 256, 4096] and (p.out_dir / "cluster_sizes.json").exists()
    assert data["prompts"].endswith("prompts, built-in prompt set")                # the run names its prompts
    for r in data["rows"]:
        assert r["scored_tokens"] == r["n_probes"] * r["cluster_size"] and r["scored_tokens"] in data["scored_tokens"]
        assert r["n_clusters"] * r["cluster_size"] == data["vocab"] and 1 <= r["n_probes"] <= r["n_clusters"]
    by_size = {b: sorted(r["scored_tokens"] for r in data["rows"] if r["cluster_size"] == b) for b in SIZES}
    assert by_size == {8: [16, 64, 256, 4096], 16: [16, 64, 256, 4096], 64: [64, 256, 4096]}   # p = 16/64 < 1: none


def test_bytes_read_are_centroids_probed_rows_and_special_tokens(study):
    _, data = study
    for r in data["rows"]:
        rows = r["n_clusters"] + r["scored_tokens"] + data["n_special"]
        assert r["read_fraction"] == pytest.approx(rows / data["vocab"])


def test_probing_every_cluster_is_the_dense_head(study):
    _, data = study
    every = [r for r in data["rows"] if r["n_probes"] == r["n_clusters"]]
    assert every and all(r["agree_dense"] == 1.0 for r in every)
    assert all(r["agree_target"] == pytest.approx(data["dense"]["agree_target"]) for r in every)
    for b in SIZES:
        agree = [r["agree_dense"] for r in data["rows"] if r["cluster_size"] == b]
        assert agree == sorted(agree)                                           # more probes never lose the token


def test_least_read_is_the_cheapest_setting_at_each_level(study):
    _, data = study
    near = data["dense"]["agree_target"] - 0.01
    meets = {"= dense head >= 0.90": lambda r: r["agree_dense"] >= 0.9,
             "= dense head >= 0.95": lambda r: r["agree_dense"] >= 0.95,
             "= target within 0.01 of the dense head": lambda r: r["agree_target"] >= near}
    assert {s["criterion"] for s in data["least_read"]} == set(meets)
    for s in data["least_read"]:
        ok = [r["read_fraction"] for r in data["rows"]
              if r["cluster_size"] == s["cluster_size"] and meets[s["criterion"]](r)]
        assert s["read_fraction"] == min(ok)                                   # probing every cluster meets them all
    table = reclustering.least_read_table(data)
    assert list(table.index) == SIZES and list(table.columns) == list(meets)


def test_the_table_and_figure_show_every_setting(study):
    _, data = study
    table = reclustering.cluster_size_table(data)
    assert len(table) == len(data["rows"]) and table.index.names == ["cluster size", "probes"]
    fig = reclustering.cluster_size_plot(data)
    labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert labels == [f"{b} tokens a cluster" for b in SIZES] + ["dense head"]


def test_an_empty_sweep_runs_no_study(tmp_path, monkeypatch):
    """h100awq and two_gpu_awq sweep no sizes (their draft is h100's): no study, no file, nothing for the notebook."""
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path))
    p = smoke(size_sweep=[])
    assert reclustering.cluster_size_study(p, progress=False) is None
    assert not (p.out_dir / "cluster_sizes.json").exists()


def test_a_size_that_does_not_divide_the_vocabulary_stops_in_one_line():
    with pytest.raises(ConfigError, match=r"size_sweep: \[3\] do not divide the vocabulary \(4096 tokens\)"):
        reclustering.cluster_size_study(smoke(size_sweep=[16, 3]), progress=False)


def test_a_size_below_one_is_refused_when_the_profile_is_read():
    from lib.profile_rules import validate
    with pytest.raises(ConfigError, match="size_sweep must be cluster sizes >= 1"):
        validate(smoke(size_sweep=[0]), "smoke.yaml")
