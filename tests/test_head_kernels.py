"""Which head kernels ran (issue 22 item 4): every engine of a run says which kernel path picks its tokens,
config.json records it, and the aggregate and summary.json's e2e rows name it ("unrecorded" for older runs)."""
import json
from dataclasses import replace

import pytest

from lib import results
from lib.models import build as engines
from lib import modes
from lib import report
from lib.study import runs, speculative
from lib.config import load_profile

DRAFTS = ["dense", "flash", "dense_shared", "flash_adaptive", "bandit_ucb"]
MICRO = {"head": {"dense": {"mean_ms": 1.0}, "flash": {"mean_ms": 1.0}, "speedup": 1.0}, "n_probes": 8,
         "model_step": {"dense": {"mean_ms": 1.0}, "flash": {"mean_ms": 1.0}, "speedup": 1.0}}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """smoke (fp32 on a CPU, bench.head_kernel: triton, the default), cut to a few short samples, writing to its
    own outputs (never the scratch smoke outputs that nbval's notebooks read after the unit tests)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUDY_OUTPUTS", str(tmp_path_factory.mktemp("outputs")))
        p = load_profile("smoke")
        assert p.bench.head_kernel == "triton"
        yield replace(p, prompts=replace(p.prompts, per_group=1, limit=1),
                      decode=replace(p.decode, max_new_tokens=4, modes=["baseline", *DRAFTS], schedules=["ordinary"],
                                     k_policies=["fixed"]),
                      bench=replace(p.bench, e2e_warmup=0))


@pytest.fixture(scope="module")
def run(profile):
    return speculative.run_speculative(profile, fresh=True)


def test_a_run_records_the_kernel_of_every_engine_cpu_torch(run):
    """On a CPU every head runs torch ops (the profile's triton applies to CUDA): recorded as such, per draft."""
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["kernels"] == {"target": "torch", **{d: "torch" for d in DRAFTS}}
    assert report.run_kernels(run) == cfg["kernels"]


def test_engines_report_the_path_their_heads_run(profile):
    target, drafts = engines.build_engines(profile)
    assert engines.kernels(target, drafts) == {"target": "torch", **{d: "torch" for d in DRAFTS}}
    bandit = drafts["bandit_ucb"]
    assert set(bandit.arms) >= {"dense", "flash_p8"} and bandit.kernel_ran == "torch"
    for h in bandit.arms.values():                                        # a mixed bandit says which arm runs what
        h.head.fused = object()
        break
    assert bandit.kernel_ran.startswith("mixed (") and "triton" in bandit.kernel_ran


def test_aggregate_and_summary_name_the_kernel(profile, run):
    agg = report.aggregate(report.records_frame(results.read_records(run)), report.run_kernels(run))
    assert set(agg.index) == {modes.BASELINE, *(modes.name(d, "ordinary") for d in DRAFTS)}
    assert (agg.head_kernel == "torch").all()
    s = report.summary(profile, "cpu", {}, MICRO, agg, run)
    assert {m: r["head_kernel"] for m, r in s["e2e"].items()} == {m: "torch" for m in agg.index}


def test_older_runs_without_the_record_read_as_unrecorded(profile, run):
    old = run.with_name("e2e-20000101T000000")                           # a run made before kernels were recorded
    old.mkdir()
    cfg = json.loads((run / "config.json").read_text())
    del cfg["kernels"]
    (old / "config.json").write_text(json.dumps(cfg))
    (old / "samples.jsonl").write_text((run / "samples.jsonl").read_text())
    assert report.run_kernels(old) == {}
    agg = report.aggregate(report.records_frame(results.read_records(old)), report.run_kernels(old))
    assert (agg.head_kernel == "unrecorded").all()
    assert (report.aggregate(report.records_frame(results.read_records(old))).head_kernel == "unrecorded").all()
    s = report.summary(profile, "cpu", {}, MICRO, agg, old)
    assert all(r["head_kernel"] == "unrecorded" for r in s["e2e"].values())
    # resuming such a run leaves its kernels unrecorded rather than claim them for its earlier samples
    runs.record_kernels(old, {"target": "torch", "dense": "torch"})
    assert "kernels" not in json.loads((old / "config.json").read_text())


def test_a_run_never_mixes_kernels(tmp_path):
    new = tmp_path / "e2e-x"
    new.mkdir()
    (new / "config.json").write_text(json.dumps({"profile": {}}))
    runs.record_kernels(new, {"target": "torch", "flash": "triton"})
    runs.record_kernels(new, {"target": "torch", "flash": "triton"})      # the same again (a resume, a shard): fine
    assert json.loads((new / "config.json").read_text())["kernels"] == {"target": "torch", "flash": "triton"}
    with pytest.raises(RuntimeError, match="flash: triton then torch"):
        runs.record_kernels(new, {"target": "torch", "flash": "torch"})
    runs.record_kernels(new, {"target": "reference", "flash": "fused"}, "bodies")   # the bodies beside them
    cfg = json.loads((new / "config.json").read_text())
    assert cfg["bodies"] == {"target": "reference", "flash": "fused"} and cfg["kernels"]["flash"] == "triton"
    with pytest.raises(RuntimeError, match="recorded other bodies .*flash: fused then reference"):
        runs.record_kernels(new, {"flash": "reference"}, "bodies")
