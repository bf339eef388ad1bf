"""Checks before any work: devices, inputs and disk, each refused in one line naming what is wrong."""
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from lib import results
from lib.study import preflight
from lib.config import load_profile

REPO = Path(__file__).resolve().parents[1]


def test_smoke_passes():
    preflight.check(load_profile("smoke"))


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="this machine has a second GPU")
def test_missing_cuda_device_names_the_key():
    p = replace(load_profile("smoke"), draft_device="cuda:1")
    with pytest.raises(preflight.PreflightError, match=r"draft_device is cuda:1.*CUDA device"):
        preflight.check(p)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_h100_profile_stops_at_once_on_a_cpu_machine(tmp_path):
    """The command make reproduce runs first: one line, exit 2, well under 30 s, nothing written."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lib.study.preflight", "h100"], cwd=REPO, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "STUDY_OUTPUTS": str(tmp_path), "STUDY_MODELS": str(tmp_path)})
    assert out.returncode == 2 and time.perf_counter() - t < 30
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "target_device is cuda:0" in lines[0]
    assert not any(tmp_path.iterdir())


def test_bad_profile_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lib.study.preflight", "no_such_profile"], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "known profiles" in out.stderr


def test_missing_spec_bench_file_is_named(monkeypatch, tmp_path):
    from lib import prompts
    monkeypatch.setattr(prompts, "SPEC_BENCH", tmp_path / "question.jsonl")
    p = load_profile("smoke")
    p = replace(p, prompts=replace(p.prompts, file="spec_bench"))
    with pytest.raises(preflight.PreflightError, match="question.jsonl"):
        preflight.check(p)


def test_too_little_disk_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path / "models"))
    p = load_profile("h100")
    need = preflight.disk_needed(p)
    assert 60e9 < need < 80e9 or not p.models.synthetic.save_target          # the draft alone when the target is rebuilt
    assert need > 2e9                                                        # two 0.6B-shaped bf16 copies
    monkeypatch.setattr(preflight, "free_bytes", lambda path: 10**9)
    monkeypatch.setattr(preflight, "check_devices", lambda p: None)
    with pytest.raises(preflight.PreflightError, match=r"needs about .* GiB free"):
        preflight.check(p)


def test_no_disk_needed_once_the_models_exist(monkeypatch, tmp_path):
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path))
    p = load_profile("smoke")
    assert preflight.disk_needed(p) > 0
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "stamp.json").write_text("{}")                   # another seed's pair: made again
    assert preflight.disk_needed(p) > 0
    from lib.models.checkpoints import synthetic_stamp
    (tmp_path / "smoke" / "stamp.json").write_text(json.dumps(synthetic_stamp(p)))
    assert preflight.disk_needed(p) == 0


def test_awq_target_is_counted_at_its_packed_size(monkeypatch, tmp_path):
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path))
    awq, bf16 = load_profile("h100awq"), load_profile("h100")
    need = preflight.disk_needed(awq)
    assert 19e9 < need - preflight.disk_needed(bf16) < 20e9                  # the 19.3 GB int4 checkpoint
    assert need * preflight.HEADROOM < 60 * 2**30                             # fits the GPU machine's 64 GB disk


def test_a_wrong_commit_claim_stops_before_any_work(monkeypatch):
    from lib.study import preflight
    monkeypatch.setenv("STUDY_COMMIT", "0" * 40)
    monkeypatch.setattr(results, "tree_matches", lambda commit, paths=results.CODE: False)
    with pytest.raises(preflight.PreflightError, match="lib/ or notebooks/ differ from that commit's"):
        preflight.check_commit_claim()


def test_the_models_bytes_are_asked_of_the_models_disk_not_of_the_outputs_one(monkeypatch, tmp_path):
    """The checkpoints go under models/ ($STUDY_MODELS), the results under outputs/ ($STUDY_OUTPUTS): on two disks
    the outputs' one needs room for the results alone, and the models' one for the checkpoints."""
    models, outputs = tmp_path / "models", tmp_path / "outputs"
    monkeypatch.setenv("STUDY_MODELS", str(models))
    monkeypatch.setenv("STUDY_OUTPUTS", str(outputs))
    p = load_profile("h100")
    assert preflight.disk_needed(p) > 2 * 2**30                              # two 0.6B-shaped bf16 copies at least
    free = {models: 100 * 2**30, outputs: 2**30}                               # 100 GiB for models, 1 GiB for results
    monkeypatch.setattr(preflight, "free_bytes", lambda path: free[path])
    preflight.check_disk(p)
    free[models] = 2**30
    with pytest.raises(preflight.PreflightError, match=r"needs about .* GiB free under .*models"):
        preflight.check_disk(p)
