"""Notebook 03's sample set sharded through submitit: shards merge into one results set, a failed
shard is reported (never dropped) and a rerun resumes, skipping finished samples."""
import shutil
from collections import Counter
from dataclasses import replace

import pytest
import torch

from lib import results
from lib.study import runs, common, microbench, reclustering, speculative
from lib.models import flash_checkpoint
from lib.config import Slurm, load_profile

pytest.importorskip("submitit")
REAL_TREE_MATCHES = results.tree_matches


@pytest.fixture(autouse=True)
def clean_commit(monkeypatch):
    """Every test here runs as if at one clean commit (resuming is refused across commits, and a dirty
    development tree would be one); STUDY_COMMIT claims are taken as they are unless a test checks them."""
    monkeypatch.setenv("STUDY_COMMIT", "abc123")
    monkeypatch.setattr(results, "tree_matches", lambda commit, paths=results.CODE: True)


@pytest.fixture
def profile(monkeypatch, tmp_path):
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path))
    p = load_profile("smoke")
    return replace(p, prompts=replace(p.prompts, per_group=1, limit=3),
                   decode=replace(p.decode, max_new_tokens=6, modes=["baseline", "dense"],
                                  schedules=["ordinary", "deferred"], k_policies=["fixed"]),
                   bench=replace(p.bench, e2e_warmup=0), slurm=Slurm(shards=2, timeout_min=10, gpus_per_task=0))


def keys(records):
    return Counter((r["iteration"], r["question_id"], r["mode"]) for r in records)


def new_run(profile):
    enc = common.encoded_prompts(profile)
    qids = [p.question_id for p, _ in enc]
    return runs.new_run(profile.out_dir, runs.run_config(profile, qids, common.device_info(profile))), qids


def test_submitit_local_shards_merge_into_one_results_set(profile):
    run, qids = new_run(profile)
    runs.launch_slurm(profile, run, qids, speculative.run_shard, "local")
    shard_files = sorted(p.name for p in run.glob("samples.shard*.jsonl"))
    assert shard_files == ["samples.shard000of002.jsonl", "samples.shard001of002.jsonl"]
    recs = runs.finish_run(run)
    assert not list(run.glob("samples.shard*.jsonl")) and (run / "samples.jsonl").exists()
    assert len(recs) == 3 * 3 and max(keys(recs).values()) == 1           # 3 prompts x 3 modes, no duplicates
    assert all(r["exact_match"] for r in recs)
    assert results.latest_run(profile.out_dir) == run


@pytest.mark.parametrize("kw", [dict(limit=0), dict(per_group=0)])
def test_a_profile_that_selects_no_prompt_is_refused_before_any_run(profile, kw):
    # (it made a finished run of no sample, the latest one, on which notebook 04 failed with KeyError 'spans_ms',
    # and the side studies with IndexError)
    p = replace(profile, prompts=replace(profile.prompts, **kw))
    with pytest.raises(ValueError, match="no prompt selected"):
        speculative.run_speculative(p, fresh=True)
    assert not results.runs_of(p.out_dir)


def test_failed_shard_is_reported_and_rerun_resumes(profile):
    run, qids = new_run(profile)
    blocker = run / "samples.shard001of002.jsonl"
    blocker.mkdir()                                                       # shard 1 cannot write: it fails
    with pytest.raises(RuntimeError, match=r"(?s)1 of 2 shards failed.*to resume.*shard 1/2.*IsADirectoryError"):
        speculative.run_speculative(profile, "submitit-local")
    first = results.read_records(run)
    assert len(first) == 2 * 3                                            # shard 0 holds prompts 0 and 2
    blocker.rmdir()
    assert speculative.run_speculative(profile, "submitit-local") == run       # resume: only shard 1 has work
    recs = results.read_records(run)
    assert results.finished(run) and len(recs) == 9 and max(keys(recs).values()) == 1
    assert keys(first) <= keys(recs)
    assert {tuple(r["tokens"]) for r in first} <= {tuple(r["tokens"]) for r in recs}   # kept, not redone


def test_unknown_launcher_is_refused(profile):
    with pytest.raises(ValueError, match="unknown launcher"):
        speculative.run_speculative(profile, "kubernetes")


# resume after an interruption (make reproduce runs notebook 03 again)

def test_interrupted_run_is_resumed_and_says_so(profile, monkeypatch, capsys):
    import lib.study.runs
    real, calls = lib.study.runs.append_record, []

    def dies_after_four(run, rec, shard=(0, 1)):
        if len(calls) == 4:
            raise KeyboardInterrupt                                           # the user's Ctrl-C
        calls.append(rec)
        real(run, rec, shard)
    monkeypatch.setattr(lib.study.runs, "append_record", dies_after_four)
    with pytest.raises(KeyboardInterrupt):
        speculative.run_speculative(profile)
    (run,) = results.runs_of(profile.out_dir)
    assert not results.finished(run) and len(results.read_records(run)) == 4
    monkeypatch.setattr(lib.study.runs, "append_record", real)
    assert speculative.run_speculative(profile) == run                              # same directory, finished now
    assert f"resuming run {run.name} (4 samples already recorded)" in capsys.readouterr().out
    recs = results.read_records(run)
    assert results.finished(run) and len(recs) == 9 and max(keys(recs).values()) == 1
    cfg = __import__("json").loads((run / "config.json").read_text())
    assert [r["samples"] for r in cfg["resumed"]] == [4]                     # the run records the resume


def test_fresh_starts_a_new_run_and_other_configurations_do_not_resume(profile):
    run, _ = new_run(profile)                                                 # unfinished, same configuration
    assert speculative.run_speculative(profile, fresh=True) != run
    other = replace(profile, decode=replace(profile.decode, max_new_tokens=5))
    assert speculative.run_speculative(other) not in (run,)
    assert not results.finished(run)                                             # left as it was


def test_a_run_finished_at_this_clean_commit_is_reused_not_measured_again(profile, monkeypatch, capsys):
    monkeypatch.setenv("STUDY_COMMIT", "abc123")
    run = speculative.run_speculative(profile)
    samples, done, cfg = results.read_records(run), (run / "DONE").read_text(), (run / "config.json").read_text()
    assert speculative.run_speculative(profile) == run and f"reusing finished run {run.name}" in capsys.readouterr().out
    assert results.read_records(run) == samples and (run / "DONE").read_text() == done
    assert (run / "config.json").read_text() == cfg                           # a finished run is never written to
    monkeypatch.setenv("STUDY_COMMIT", "abc123+dirty")                        # uncommitted code: measured anew
    assert speculative.run_speculative(profile) != run
    monkeypatch.setenv("STUDY_COMMIT", "def456")                              # another commit: measured anew
    assert speculative.run_speculative(profile) not in results.runs_of(profile.out_dir)[:2]


def test_a_named_finished_run_is_reused_and_a_wrong_name_or_configuration_refused(profile, capsys):
    run = speculative.run_speculative(profile)
    samples = results.read_records(run)
    assert speculative.run_speculative(profile, reuse=run.name) == run and results.read_records(run) == samples
    assert f"reusing finished run {run.name}" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no finished run"):
        speculative.run_speculative(profile, reuse="e2e-nonexistent")
    other = replace(profile, decode=replace(profile.decode, max_new_tokens=5))
    with pytest.raises(ValueError, match="profile differ"):
        speculative.run_speculative(other, reuse=run.name)


def test_a_reused_run_that_is_not_the_latest_says_how_notebook_04_analyses_it(profile, capsys):
    """Notebook 04 analyses the latest finished run of the profile's settings; notebook 03 reusing an older one says
    so, and notebook 04's parameter run names the one to analyse."""
    from lib.study import analysis
    older = speculative.run_speculative(profile)
    newer = speculative.run_speculative(profile, fresh=True)
    capsys.readouterr()
    assert speculative.run_speculative(profile, reuse=newer.name) == newer
    assert "notebook 04 analyses" not in capsys.readouterr().out
    assert speculative.run_speculative(profile, reuse=older.name) == older
    assert f"give it the parameter run='{older.name}'" in capsys.readouterr().out
    assert analysis.latest_run(profile) == newer and analysis.latest_run(profile, older.name) == older
    for wrong in ("e2e-nonexistent", f"../runs/{older.name}", str(older)):
        with pytest.raises(ValueError, match="no finished run of that name"):
            analysis.latest_run(profile, wrong)
    other = replace(profile, decode=replace(profile.decode, max_new_tokens=5))
    with pytest.raises(ValueError, match="end-to-end settings differ"):
        analysis.latest_run(other, older.name)
    renamed = older.with_name("e2e-copy")                                     # a run renamed by hand: not an e2e-* run
    shutil.copytree(older, renamed)
    for run in (newer, older):
        shutil.rmtree(run)
    assert speculative.run_speculative(profile, reuse="e2e-copy") == renamed
    assert "give it the parameter run='e2e-copy'" in capsys.readouterr().out


def test_side_study_settings_do_not_change_the_e2e_configuration(profile):
    run = speculative.run_speculative(profile)
    side = replace(profile, prompts=replace(profile.prompts, side_prompts=1),
                   sampling=replace(profile.sampling, temperatures=[0.7]))
    assert speculative.run_speculative(side, reuse=run.name) == run


def test_result_files_name_the_commit_that_wrote_them(profile, monkeypatch):
    monkeypatch.setenv("STUDY_COMMIT", "abc123")
    results.save_json(profile, "probe.json", {"x": 1})
    assert results.read_json(profile, "probe.json")["written"]["commit"] == "abc123"
    monkeypatch.setenv("STUDY_COMMIT", "def456")                              # a later notebook adds its part
    merged = results.update_json(profile, "probe.json", {"part": {"y": 2}})
    assert merged["part"]["written"]["commit"] == "def456" and merged["x"] == 1
    assert results.read_json(profile, "probe.json")["part"] == merged["part"]


def test_side_studies_are_the_profiles_unless_named(profile):
    assert common.side_studies(profile) == ["sampling", "adaptive", "peers", "context"]
    assert common.side_studies(replace(profile, side_studies=[])) == []
    assert common.side_studies(profile, "adaptive, peers") == ["adaptive", "peers"]
    with pytest.raises(ValueError, match=r"side_studies: unknown \['adaptiv'\]"):
        common.side_studies(profile, "adaptiv")


def test_notebook_02s_breakdown_can_run_again_over_its_own_file(profile):
    """A re-run reads back a stamped step_breakdown.json (and any part notebook 03 added) and still returns
    just the draft parts, each with its kinds."""
    flash_checkpoint.ensure_flash_checkpoint(profile)
    for _ in range(2):
        bd = microbench.draft_step_breakdown(profile)
        assert set(bd) == {"draft_dense", "draft_flash"} and all("by_kind_us" in v for v in bd.values())
    assert set(results.read_json(profile, "step_breakdown.json")) == {"draft_dense", "draft_flash", "written"}


def test_the_target_step_is_timed_whatever_verify_lengths_holds(profile):
    """bench.verify_lengths names the verify calls to time; the single-token step (target_step.json's own number,
    the baseline's and every append's cost) is timed beside them even where the list leaves 1 out."""
    p = replace(profile, bench=replace(profile.bench, verify_lengths=[2, 4, 7], warmup=1, iters=10))
    ts = microbench.target_step_bench(p)
    assert sorted(ts["verify_ms"], key=int) == ["1", "2", "4", "7"] and ts["fp32_ms"] == ts["single"]["mean_ms"] > 0


class _Step:                                                                    # a fused step's stand-in
    def __init__(self, runner):
        self.runner = runner


class _Runner:
    """Records which step was installed when each block was captured; replays a capture by its pick."""
    def __init__(self, graphs=True):
        self.graphs, self.captured = graphs, {}
        self.decode = _Step(self)

    def warm_chain(self, pick, m, kk, decode=None):
        self.captured[id(pick)] = decode or self.decode

    def chain(self, pick, ids, start, kk):
        return self.captured.get(id(pick), self.decode)


def test_a_block_is_timed_through_several_fused_steps_each_captured_with_its_own():
    r = _Runner()
    steps = microbench.fused_instances(r)
    assert len(steps) == microbench.BLOCK_INSTANCES > 1 and steps[0] is r.decode
    assert len({id(s) for s in steps}) == len(steps) and all(isinstance(s, _Step) for s in steps)
    installed, x = r.decode, torch.zeros(1, 1, dtype=torch.long)
    blocks = [microbench.instance_block(r, s, lambda h: h, x, 5, 3) for s in steps]
    assert r.decode is installed                                              # the runner's own step stays
    assert [b() for b in blocks] == steps                                     # each replays its own step
    plain, reference = _Runner(graphs=False), _Runner()
    reference.decode = None
    assert microbench.fused_instances(plain) == [plain.decode]                # replayed live: the installed one only
    assert microbench.fused_instances(reference) == [None]                    # the reference path: nothing to copy


def test_a_result_file_must_be_a_json_object(profile):
    with pytest.raises(TypeError, match="exit_depth.json: a result file holds a JSON object"):
        results.save_json(profile, "exit_depth.json", [{"depth": 1}])


def test_an_interrupted_write_leaves_the_previous_result_file_whole(profile, monkeypatch):
    """Ctrl-C while notebook 03 adds its part to notebook 02's step_breakdown.json: the failed notebook's stamp
    records the file as it is, so a half-written one would have been kept, and every later update_json failed
    on it."""
    import pathlib
    results.save_json(profile, "step_breakdown.json", {"draft": {"ms": 1.0}})
    real = pathlib.Path.write_text

    def torn(self, text, *a, **kw):
        real(self, text[:len(text) // 2], *a, **kw)
        raise KeyboardInterrupt
    monkeypatch.setattr(pathlib.Path, "write_text", torn)
    with pytest.raises(KeyboardInterrupt):
        results.update_json(profile, "step_breakdown.json", {"target": {"ms": 2.0}})
    monkeypatch.setattr(pathlib.Path, "write_text", real)
    assert results.read_json(profile, "step_breakdown.json")["draft"] == {"ms": 1.0}
    assert [f.name for f in profile.out_dir.iterdir()] == ["step_breakdown.json"]          # nothing left beside it


def test_side_study_results_are_kept_only_when_this_clean_commit_wrote_them(profile, monkeypatch):
    monkeypatch.setenv("STUDY_COMMIT", "abc123")
    assert results.kept_json(profile, "sampling.json") is None                   # nothing written yet
    results.save_json(profile, "sampling.json", {"rows": [1]})
    assert results.kept_json(profile, "sampling.json")["rows"] == [1]
    monkeypatch.setenv("STUDY_COMMIT", "def456")                              # other code: measure again
    assert results.kept_json(profile, "sampling.json") is None
    results.save_json(profile, "sampling.json", {"rows": [2]})
    monkeypatch.setenv("STUDY_COMMIT", "def456+dirty")                        # uncommitted changes: measure again
    assert results.kept_json(profile, "sampling.json") is None


def test_side_study_results_are_kept_only_for_the_profile_that_wrote_them(profile):
    """The same clean commit with other settings (a profile of one's own, untracked; or edited under a
    STUDY_COMMIT claim, which covers lib/ and notebooks/ only) measures again."""
    results.save_json(profile, "sampling.json", {"temperatures": [0.5, 1.0]})
    assert results.kept_json(profile, "sampling.json")["temperatures"] == [0.5, 1.0]
    hotter = replace(profile, sampling=replace(profile.sampling, temperatures=[2.0]))
    assert results.kept_json(hotter, "sampling.json") is None


def test_modes_leaving_the_baseline_at_one_point_share_one_gap_measurement(profile, monkeypatch):
    from lib.models import checkpoints
    recs = results.read_records(speculative.run_speculative(profile))
    base = next(r for r in recs if r["draft"] == "baseline")
    wrong = [{**base, "draft": "dense", "mode": m, "exact_match": False, "tokens": base["tokens"][:2] + [-5]}
             for m in ("dense_ordinary", "dense_deferred")]                  # both leave it at position 2
    calls = []
    measure = speculative.logit_gaps
    monkeypatch.setattr(speculative, "logit_gaps", lambda *a: calls.append(a) or measure(*a))
    out = speculative.divergences(profile, recs + wrong, checkpoints.load_target(profile))
    assert [d["position"] for d in out] == [2, 2] and len(calls) == 1
    assert out[0]["gap_stepwise"] == out[1]["gap_stepwise"] >= 0 and out[0]["gap_batched"] >= 0
    # notebook 04 reads back only the rows of the analysed run's divergent samples: none of a run equal to greedy
    # decoding (a file left by an earlier run, say), both of this one
    from lib.report.tables import records_frame
    from lib.study import analysis
    assert analysis.divergences(profile, records_frame(recs)).empty
    assert len(analysis.divergences(profile, records_frame(recs + wrong))) == 2


def test_a_missing_flash_checkpoint_is_rebuilt_without_redoing_notebook_01(profile, monkeypatch, tmp_path):
    """A fresh machine has notebook 01's results but not its checkpoint: the same seeded clustering is written
    again, and clustering.json stays as notebook 01 left it."""
    from lib.models.flash_checkpoint import read_flash_checkpoint
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path / "models"))
    reclustering.recluster(profile, progress=False)
    first = read_flash_checkpoint(profile.flash_dir)
    measured = (profile.out_dir / "clustering.json").read_text()
    shutil.rmtree(profile.flash_dir)
    assert flash_checkpoint.ensure_flash_checkpoint(profile) == profile.flash_dir
    again = read_flash_checkpoint(profile.flash_dir)
    assert torch.equal(first[2], again[2]) and torch.equal(first[1], again[1]) and first[0] == again[0]
    assert (profile.out_dir / "clustering.json").read_text() == measured
    # a checkpoint of another number of clusters is never used: loading it says so, and ensuring one makes it again
    fewer = replace(profile, clustering=replace(profile.clustering, n_clusters=profile.clustering.n_clusters // 2))
    with pytest.raises(ValueError, match="clusters, the profile asks for"):
        flash_checkpoint.flash_checkpoint_dir(fewer)
    flash_checkpoint.ensure_flash_checkpoint(fewer)
    assert read_flash_checkpoint(fewer.flash_dir)[1].shape[0] == fewer.clustering.n_clusters


def test_a_flash_checkpoint_of_other_clustering_settings_is_made_again(profile, monkeypatch, tmp_path):
    """Notebook 01 not run again after the k-means settings changed (a device call running notebook 03 alone, say):
    the checkpoint of the old settings is not this profile's clustering, whatever its number of clusters."""
    from lib.models.flash_checkpoint import read_flash_checkpoint
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path / "models"))
    flash_checkpoint.ensure_flash_checkpoint(profile)
    other = replace(profile, clustering=replace(profile.clustering, iterations=2, candidates=4))
    flash_checkpoint.ensure_flash_checkpoint(other)
    draft = flash_checkpoint.checkpoints.load_draft(other)
    want, _, _ = flash_checkpoint.equal_size_clusters(other, draft.get_output_embeddings().weight.detach().float())
    assert torch.equal(read_flash_checkpoint(other.flash_dir)[2], want)


def test_a_flash_checkpoint_made_by_other_code_is_made_again(profile, monkeypatch, tmp_path):
    """The clustering's code is part of what a checkpoint records it was made with (clustering_settings)."""
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path / "models"))
    flash_checkpoint.ensure_flash_checkpoint(profile)
    written, load = [], flash_checkpoint.checkpoints.load_draft                 # loaded only to cluster it again
    monkeypatch.setattr(flash_checkpoint.checkpoints, "load_draft", lambda *a, **kw: written.append(1) or load(*a, **kw))
    flash_checkpoint.ensure_flash_checkpoint(profile)
    assert written == []                                                      # the same code: kept
    real = flash_checkpoint.equal_size_clusters

    def changed(*a, **kw):                                                   # other clustering code, same clusters
        return real(*a, **kw)
    monkeypatch.setattr(flash_checkpoint, "equal_size_clusters", changed)
    flash_checkpoint.ensure_flash_checkpoint(profile)
    assert written == [1]
    flash_checkpoint.ensure_flash_checkpoint(profile)
    assert written == [1]                                                     # and recorded with it


# resuming never mixes code versions; a commit claim is checked against the tree

def interrupted_run(profile, monkeypatch):
    """A run of `profile` stopped by Ctrl-C after two samples."""
    import lib.study.runs
    real, calls = lib.study.runs.append_record, []

    def dies_after_two(run, rec, shard=(0, 1)):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(rec)
        real(run, rec, shard)
    monkeypatch.setattr(lib.study.runs, "append_record", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        speculative.run_speculative(profile)
    monkeypatch.setattr(lib.study.runs, "append_record", real)
    (run,) = results.runs_of(profile.out_dir)
    return run


@pytest.mark.parametrize("later", ["def456", "abc123+dirty"])
def test_resuming_a_run_started_at_another_commit_is_refused_in_one_line(profile, monkeypatch, later):
    run = interrupted_run(profile, monkeypatch)
    monkeypatch.setenv("STUDY_COMMIT", later)
    with pytest.raises(runs.ResumeRefused) as e:
        speculative.run_speculative(profile)
    msg = str(e.value)
    assert "\n" not in msg and run.name in msg and "abc123" in msg and later in msg and "FRESH=1" in msg
    assert len(results.read_records(run)) == 2                                     # left as it was
    assert speculative.run_speculative(profile, fresh=True) != run                    # FRESH=1 is the way out


# Formerly unclear: a run interrupted in a checkout with uncommitted changes, run again there, was refused as "started
# at commit abc123+dirty, this checkout is abc123+dirty: resuming would mix code versions", one commit named twice.
def test_resuming_a_run_of_uncommitted_code_says_why_it_is_refused(profile, monkeypatch):
    monkeypatch.setenv("STUDY_COMMIT", "abc123+dirty")
    run = interrupted_run(profile, monkeypatch)
    with pytest.raises(runs.ResumeRefused) as e:
        speculative.run_speculative(profile)
    msg = str(e.value)
    assert "\n" not in msg and run.name in msg and "uncommitted" in msg and "FRESH=1" in msg


def test_resume_across_commits_when_asked_and_the_summary_names_every_commit(profile, monkeypatch):
    from lib import report
    run = interrupted_run(profile, monkeypatch)
    monkeypatch.setenv("STUDY_COMMIT", "def456")
    monkeypatch.setenv("RESUME_ANY_COMMIT", "1")
    assert speculative.run_speculative(profile) == run and results.finished(run)
    assert report.run_source(profile, run)["sample_commits"] == ["abc123", "def456"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with lib/ and notebooks/ committed; runs' git commands run in it."""
    import subprocess
    root = tmp_path / "repo"
    for f, text in {"lib/a.py": "x = 1\n", "notebooks/n.ipynb": "{}\n", ".gitignore": "__pycache__/\n",
                    "README.md": "r\n"}.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(text)
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=root,
                                    check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    monkeypatch.setattr(results, "ROOT", root)
    monkeypatch.setattr(results, "tree_matches", REAL_TREE_MATCHES)
    return root, git("rev-parse", "HEAD")


def test_a_commit_claim_is_honoured_only_when_lib_and_notebooks_are_that_commits(repo, monkeypatch):
    root, head = repo
    monkeypatch.setenv("STUDY_COMMIT", head)
    (root / "README.md").write_text("changed\n")                               # not code: still that commit
    (root / "lib" / "__pycache__").mkdir()
    (root / "lib" / "__pycache__" / "a.pyc").write_text("ignored")
    assert results.git_commit() == head
    (root / "lib" / "new.py").write_text("y = 2\n")                             # untracked code counts
    with pytest.raises(ValueError, match=f"STUDY_COMMIT={head}: lib/ or notebooks/ differ"):
        results.git_commit()
    (root / "lib" / "new.py").unlink()
    (root / "notebooks" / "n.ipynb").write_text("{ }\n")
    with pytest.raises(ValueError, match="differ from that commit's"):
        results.git_commit()
    assert results.git("diff", "--cached", "--name-only") == ""                    # the checkout's index untouched
    monkeypatch.setenv("STUDY_COMMIT", "0" * 40)
    with pytest.raises(ValueError, match="cannot be checked"):
        results.git_commit()


def test_a_claim_with_a_code_digest_is_checked_without_git(repo, monkeypatch, tmp_path):
    """A GPU machine gets a copy of the tree without git metadata: the claim carries the code's digest."""
    root, head = repo
    monkeypatch.delenv("STUDY_COMMIT")                                          # claimed where the checkout is
    claim = results.commit_claim()
    assert claim == f"{head}:{results.code_digest()}"
    copy = tmp_path / "copy"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git"))
    monkeypatch.setattr(results, "ROOT", copy)
    monkeypatch.setenv("STUDY_COMMIT", claim)
    assert results.git_commit() == head
    (copy / "lib" / "a.py").write_text("x = 3\n")
    with pytest.raises(ValueError, match="differ from the claimed code digest"):
        results.git_commit()
    monkeypatch.setattr(results, "ROOT", root)
    monkeypatch.delenv("STUDY_COMMIT")
    (root / "lib" / "a.py").write_text("x = 3\n")                              # a dirty checkout cannot claim
    with pytest.raises(ValueError, match="needs a checkout whose lib/ and notebooks/ are exactly its commit"):
        results.commit_claim()
