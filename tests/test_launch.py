"""Notebook 03's sample set sharded through submitit: shards merge into one results set, a failed
shard is reported (never dropped) and a rerun resumes, skipping finished samples."""
from collections import Counter
from dataclasses import replace

import pytest

from lib import bench, study
from lib.config import Cluster, load_profile

pytest.importorskip("submitit")


@pytest.fixture
def profile():
    p = load_profile("smoke")
    return replace(p, prompts=replace(p.prompts, per_group=1, limit=3),
                   decode=replace(p.decode, max_new_tokens=6, modes=["baseline", "dense"],
                                  schedules=["ordinary", "deferred"]),
                   bench=replace(p.bench, e2e_warmup=0), cluster=Cluster(shards=2, timeout_min=10, gpus_per_task=0))


def keys(records):
    return Counter((r["iteration"], r["question_id"], r["mode"]) for r in records)


def test_submitit_local_shards_merge_into_one_results_set(profile, tmp_path):
    run = bench.new_run(tmp_path, {"test": True})
    study.run_e2e_launch(profile, "submitit-local", run_dir=run)
    shard_files = sorted(p.name for p in run.glob("samples.shard*.jsonl"))
    assert shard_files == ["samples.shard000of002.jsonl", "samples.shard001of002.jsonl"]
    recs = study.finish_run(run)
    assert not list(run.glob("samples.shard*.jsonl")) and (run / "samples.jsonl").exists()
    assert len(recs) == 3 * 3 and max(keys(recs).values()) == 1           # 3 prompts x 3 modes, no duplicates
    assert all(r["exact_match"] for r in recs)
    assert bench.latest_run(tmp_path) == run


def test_failed_shard_is_reported_and_rerun_resumes(profile, tmp_path):
    run = bench.new_run(tmp_path, {"test": True})
    blocker = run / "samples.shard001of002.jsonl"
    blocker.mkdir()                                                       # shard 1 cannot write: it fails
    with pytest.raises(RuntimeError, match=r"(?s)1 of 2 shards failed.*Resume with.*shard 1/2.*IsADirectoryError"):
        study.run_e2e_launch(profile, "submitit-local", run_dir=run)
    first = bench.read_records(run)
    assert len(first) == 2 * 3                                            # shard 0 holds prompts 0 and 2
    blocker.rmdir()
    study.run_e2e_launch(profile, "submitit-local", run_dir=run)         # resume: only shard 1 has work
    recs = study.finish_run(run)
    assert len(recs) == 9 and max(keys(recs).values()) == 1
    assert keys(first) <= keys(recs)
    assert {tuple(r["tokens"]) for r in first} <= {tuple(r["tokens"]) for r in recs}   # kept, not redone


def test_unknown_launcher_is_refused(profile):
    with pytest.raises(ValueError, match="unknown launcher"):
        study.run_e2e_launch(profile, "kubernetes")
