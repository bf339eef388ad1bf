import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

import lib.bench as bench
import lib.study.runs as runs_lib
from lib import results


# stats

def test_stats_known_list():
    s = bench.stats([1.0, 2.0, 3.0, 4.0])
    assert s == {"mean_ms": pytest.approx(2.5), "p50_ms": pytest.approx(2.5), "p95_ms": pytest.approx(3.85),
                 "tok_s": pytest.approx(400.0), "n": 4}


def test_stats_one_to_hundred_unordered():
    s = bench.stats([float(x) for x in reversed(range(1, 101))])
    assert s["mean_ms"] == pytest.approx(50.5)
    assert s["p50_ms"] == pytest.approx(50.5)
    assert s["p95_ms"] == pytest.approx(95.05)
    assert s["tok_s"] == pytest.approx(1000 / 50.5)
    assert s["n"] == 100


def test_stats_single_value_and_types():
    s = bench.stats([4])
    assert s == {"mean_ms": 4.0, "p50_ms": 4.0, "p95_ms": 4.0, "tok_s": 250.0, "n": 1}
    assert all(type(v) is float for k, v in s.items() if k != "n") and type(s["n"]) is int
    json.dumps(s)                                                        # plain Python numbers


# clock and call timing on a fake clock (behaviour, not wall time)

@pytest.fixture
def fake_time(monkeypatch):
    t = SimpleNamespace(now=0.0)
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: t.now))
    return t


def test_clock_spans_add_up(fake_time):
    clock = bench.Clock("cpu")
    for ms in (2.0, 3.0):
        with clock.span("a"):
            fake_time.now += ms / 1000
            with clock.span("b"):
                fake_time.now += 1 / 1000
    assert clock.totals() == {"a": pytest.approx(7.0), "b": pytest.approx(2.0)}


def test_time_calls_counts_and_measures(fake_time):
    calls = []

    def fn():
        calls.append(1)
        fake_time.now += len(calls) / 1000
    out = bench.time_calls(fn, warmup=3, iters=4, device="cpu")
    assert len(calls) == 7
    assert out == pytest.approx([4.0, 5.0, 6.0, 7.0])                 # warm-up calls not measured


def test_interleaved_alternates_order(fake_time):
    log = []
    fns = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    out = bench.interleaved(fns, warmup=2, iters=4, device="cpu")
    assert log == ["a", "a", "b", "b"] + ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert {k: len(v) for k, v in out.items()} == {"a": 4, "b": 4}


# run directories

class FrozenDatetime(datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def user_keys(run):
    """config.json without the keys new_run adds (start time, commit)."""
    cfg = json.loads((run / "config.json").read_text())
    assert set(cfg) >= {"started", "commit"}
    return {k: v for k, v in cfg.items() if k not in ("started", "commit")}


@pytest.fixture
def same_second(monkeypatch):
    monkeypatch.setattr(runs_lib, "datetime", FrozenDatetime)


def test_new_run_never_reuses_a_directory(tmp_path, same_second):
    cfg = {"profile": "tiny", "path": Path("/x")}
    runs = [runs_lib.new_run(tmp_path, cfg) for _ in range(3)]
    assert len(set(runs)) == 3
    for r in runs:
        assert r.parent == tmp_path / "runs" and r.name.startswith("e2e-20250102T030405")
        assert user_keys(r) == {"profile": "tiny", "path": "/x"}
        assert results.read_records(r) == []
        assert not results.finished(r)


def test_new_run_real_clock_twice_in_a_row(tmp_path):
    a, b = runs_lib.new_run(tmp_path, {"n": 1}), runs_lib.new_run(tmp_path, {"n": 2})
    assert a != b
    assert user_keys(a) == {"n": 1}
    assert user_keys(b) == {"n": 2}


def test_new_run_name(tmp_path, same_second):
    assert runs_lib.new_run(tmp_path, {}, name="micro").name == "micro-20250102T030405"


def test_append_and_read_records(tmp_path):
    run = runs_lib.new_run(tmp_path, {})
    recs = [{"mode": "baseline", "tokens": [1, 2]}, {"mode": "flash_ordinary", "tokens": [3]}]
    for r in recs:
        runs_lib.append_record(run, r)
    assert results.read_records(run) == recs


@pytest.mark.parametrize("dies_at", ["replace", "unlink"])
def test_a_merge_interrupted_midway_loses_no_record(tmp_path, monkeypatch, dies_at):
    """finish_run merges the shard files into samples.jsonl: stopped between any two of its file operations (a job
    killed, say), the run still reads every record (it had unlinked the shards before putting their merge in place:
    their records were left only in samples.jsonl.tmp, which nothing reads), and finishing again keeps each once."""
    run = runs_lib.new_run(tmp_path, {})
    recs = [{"iteration": 0, "question_id": q, "mode": "baseline", "tokens": [q]} for q in range(4)]
    for r in recs:
        runs_lib.append_record(run, r, shard=(r["question_id"] % 2, 2))

    def dies(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(Path, dies_at, dies)
    with pytest.raises(KeyboardInterrupt):
        runs_lib.finish_run(run)
    monkeypatch.undo()
    key = lambda r: r["question_id"]
    assert {key(r) for r in results.read_records(run)} == {0, 1, 2, 3}
    assert sorted(runs_lib.finish_run(run), key=key) == [{**r, "exact_match": True} for r in recs]
    assert len(results.read_records(run)) == 4 and results.finished(run)


def test_append_record_refuses_a_finished_run(tmp_path):
    run = runs_lib.new_run(tmp_path, {})
    runs_lib.append_record(run, {"i": 0})
    runs_lib.mark_finished(run)
    assert results.finished(run)
    with pytest.raises(RuntimeError, match="finished"):
        runs_lib.append_record(run, {"i": 1})
    assert results.read_records(run) == [{"i": 0}]


def test_latest_run_without_runs(tmp_path):
    with pytest.raises(FileNotFoundError):
        results.latest_run(tmp_path)                                      # no runs/ folder at all
    runs_lib.new_run(tmp_path, {})                                         # an unfinished run only
    with pytest.raises(FileNotFoundError, match="no finished e2e run"):
        results.latest_run(tmp_path)


def test_latest_run_ignores_unfinished_and_other_names(tmp_path, monkeypatch):
    stamps = iter(range(60))

    class Ticking(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2025, 1, 1, 0, 0, next(stamps), tzinfo=timezone.utc)
    monkeypatch.setattr(runs_lib, "datetime", Ticking)
    monkeypatch.setattr(results, "datetime", Ticking)                       # finish times (mark_finished)
    old = runs_lib.new_run(tmp_path, {})
    runs_lib.mark_finished(old)
    newer = runs_lib.new_run(tmp_path, {})
    runs_lib.mark_finished(newer)
    pending = runs_lib.new_run(tmp_path, {})                               # newest, but unfinished
    other = runs_lib.new_run(tmp_path, {}, name="micro")
    runs_lib.mark_finished(other)
    assert results.latest_run(tmp_path) == newer
    assert results.latest_run(tmp_path, name="micro") == other
    copy = tmp_path / "runs" / "e2e-copy"                                  # a copy renamed by hand is not a run
    shutil.copytree(newer, copy)
    assert results.runs_of(tmp_path) == [old, newer, pending]
    assert results.latest_run(tmp_path) == newer


def test_latest_run_same_second(tmp_path, same_second):
    runs = [runs_lib.new_run(tmp_path, {}) for _ in range(3)]
    for r in runs:
        runs_lib.mark_finished(r)
    assert results.latest_run(tmp_path) == runs[-1]


# Formerly a bug (latest_run): run names are compared as strings, so the same-second suffixes
# sort "-1" < "-10" < "-11" < "-2" < ... < "-9": from the 11th run started within one second on,
# latest_run returns an older run (here "-9" instead of "-11").
def test_latest_run_many_in_the_same_second(tmp_path, same_second):
    runs = [runs_lib.new_run(tmp_path, {}) for _ in range(12)]
    for r in runs:
        runs_lib.mark_finished(r)
    assert results.latest_run(tmp_path) == runs[-1]


# Formerly a bug (latest_run): notebook 03 reuses a finished run of the profile's settings, but notebook 04 analysed
# the run that finished last, whatever its settings: a profile run at K = 3, then K = 4, then K = 3 again reported the
# K = 4 run's numbers in its summary.json and tables under K = 3.
def test_the_analysed_run_is_the_latest_of_the_profiles_settings(tmp_path, monkeypatch):
    from dataclasses import replace
    from lib.config import as_dict, load_profile
    from lib.study import analysis
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path))
    p = load_profile("smoke")
    ours = runs_lib.new_run(p.out_dir, {"profile": as_dict(p)})
    runs_lib.mark_finished(ours)
    other = replace(p, decode=replace(p.decode, k=p.decode.k + 1))
    theirs = runs_lib.new_run(p.out_dir, {"profile": as_dict(other)})
    runs_lib.mark_finished(theirs)                                       # finished last
    assert results.latest_run(p.out_dir) == theirs
    assert analysis.latest_run(p) == ours                                # what notebook 04 calls
    assert results.latest_run(p.out_dir, profile=p) == ours
    side = replace(p, sampling=replace(p.sampling, temperatures=[0.7]))  # side-study settings: same samples
    assert results.latest_run(p.out_dir, profile=side) == ours
    assert results.latest_run(p.out_dir, profile=replace(p, seed=1)) == theirs   # none of its settings: the last


def test_kernel_kinds_name_hopper_gemms_and_compiled_fusions():
    from lib.bench import kernel_kind
    assert kernel_kind("nvjet_sm90_hsh_64x8_64x16_4x1_v_bz_TNT") == "GEMV/GEMM"
    assert kernel_kind("void marlin::Marlin<__half, 256, 1, 8>(int4 const*)") == "GEMV/GEMM"
    assert kernel_kind("triton_per_fused__scaled_dot_product_cudnn_attention_add_cat_mean") == "fused elementwise and norms (compiled)"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16") == "attention"
    assert kernel_kind("void at::native::reduce_kernel<ArgMaxOps<float>>") == "argmax/top-k"
    assert kernel_kind("aten::le") == "other"
    assert kernel_kind("triton_red_fused__unsafe_view_add_mm_mul_silu_split_t_view_9") == \
        "GEMV fused with norms and elementwise ops (compiled)"                  # coordinate-descent tuned inductor
    heads = ("_flash_scores", "_flash_probes", "_flash_tokens", "_dense_argmax")
    assert {kernel_kind(k) for k in heads} == {"LM head (Triton)"}          # not "attention" for the word flash
    assert kernel_kind("_w4a16_kernel") == "W4A16 int4 GEMM (Triton)"
    assert kernel_kind("void w4a16_mma<false>(unsigned short const*, uint4 const*, unsigned int const*, ...)") == \
        "W4A16 int4 GEMM (CUDA mma)"
    assert kernel_kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_w4a16_matmul_4") == \
        "fused elementwise and norms (compiled)"                                 # inductor's fusion named after the op
    assert kernel_kind("_layer_attention") == "layer attention (Triton)"
    assert kernel_kind("_layer_rms_norm") == "layer norm (Triton)"
    assert kernel_kind("_layer_rope_cache") == "layer q/k norms, RoPE and cache write (Triton)"
    assert kernel_kind("triton_per_fused__to_copy_add_cached_attention_cat_mean_mul_neg_pow_rsqrt_split") == \
        "fused elementwise and norms (compiled)"                                 # named after the custom op


def test_exposed_time_counts_overlapping_kernels_once_and_sums_to_their_union():
    from lib.bench import exposed, group_kernels
    spans = [(0.0, 10.0), (5.0, 12.0), (20.0, 25.0), (11.0, 30.0), (40.0, 41.0)]
    shares = exposed(spans)
    assert shares == [10.0, 2.0, 5.0, 13.0, 1.0]          # (11, 30) overlaps (5, 12) by 1 and (20, 25) by 5
    assert sum(shares) == 31.0                            # the union: [0, 30] and [40, 41]
    assert exposed([(0.0, 4.0), (1.0, 2.0)]) == [3.0, 1.0]   # a kernel inside another ends first: it owns its part
    rows = [{"kernel": "_decode_gemv", "launches": 2, "us": 9.0, "exposed_us": 5.0},
            {"kernel": "_dense_argmax", "launches": 1, "us": 3.0, "exposed_us": 3.0}]
    g = group_kernels(rows)
    assert g["exposed_us"] == 8.0 and g["exposed_by_kind_us"]["LM head (Triton)"] == 3.0 and g["total_us"] == 12.0


def test_kernel_breakdown_of_a_cpu_call_lists_its_ops():
    import torch
    from lib.bench import kernel_breakdown
    a = torch.randn(64, 64)
    rows = kernel_breakdown(lambda: (a @ a).argmax(-1), 5, "cpu")
    assert {"aten::mm", "aten::argmax"} <= {r["kernel"] for r in rows}
    assert all(r["launches"] == 1.0 and r["us"] > 0 for r in rows if r["kernel"] in ("aten::mm", "aten::argmax"))


def test_a_breakdown_asks_the_profiler_to_let_go_of_cupti(monkeypatch):
    """Left attached after a profile, CUPTI slowed every later kernel (h100awq's step +0.4 ms, one H100): the
    breakdown asks kineto to tear it down, and says whether it did."""
    import os
    import torch
    from lib.bench import breakdown
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    a = torch.randn(16, 16)
    bd = breakdown(lambda: a @ a, "cpu", iters=2)
    assert os.environ["TEARDOWN_CUPTI"] == "1" and bd["cupti_torn_down"] is True
    assert bd["launches"] >= 1


def test_before_cuda_12_6_the_breakdown_leaves_cupti_as_torch_has_it(monkeypatch):
    """Graphs crash on CUPTI's re-init before CUDA 12.6: there the breakdown does not ask for the teardown, and
    says that CUPTI stayed attached."""
    import os
    import torch
    from lib.bench import breakdown
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    bd = breakdown(lambda: torch.ones(4) * 2, "cpu", iters=2)
    assert os.environ["TEARDOWN_CUPTI"] == "0" and bd["cupti_torn_down"] is False


def test_the_step_floor_counts_the_kv_cache_it_attends_to():
    """notebook 02's floor of a draft step: its layers' weights, the KV cache at the positions it attends to (2 x layers x
    kv heads x head_dim x positions x element size) and its head; the weights alone are body_bytes."""
    import torch
    from lib.engine.runner import KVCache
    from lib.study.microbench import floors
    cache = KVCache(n_layers=3, n_kv=2, max_len=64, head_dim=8, dtype=torch.bfloat16, device="cpu")
    assert cache.bytes_at(10) == 2 * 3 * 2 * 8 * 10 * 2
    layers = [torch.nn.Linear(100, 10, bias=False).to(torch.bfloat16)]             # 2,000 bytes of weights
    dense = SimpleNamespace(runner=SimpleNamespace(layers=layers, cache=cache))
    fh = SimpleNamespace(weight=torch.zeros(50, 4, dtype=torch.bfloat16), n_probes=2, n_clusters=4,
                         bytes_read=lambda p: 100 * p)
    f = floors(dense, fh, bandwidth=1e6, positions=10)                              # 1 byte a microsecond
    assert f["body_bytes"] == 2000 and f["kv_cache_bytes"] == 1920
    assert f["body_ms"] == pytest.approx(3.92) and f["dense_step_ms"] == pytest.approx(3.92 + 0.4)
    assert f["flash_step_ms"] == pytest.approx(3.92 + 0.2)


def test_a_file_written_whole_keeps_the_old_one_when_interrupted(tmp_path, monkeypatch):
    """results.write_whole (result files, a resumed run's config.json): stopped before the rename, the old file
    stays as it was and no partial file is left beside it."""
    import os
    path = tmp_path / "config.json"
    path.write_text('{"old": 1}')

    def stopped(*_):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        results.write_whole(path, '{"new": 2}')
    assert path.read_text() == '{"old": 1}' and [p.name for p in tmp_path.iterdir()] == ["config.json"]
    monkeypatch.undo()
    results.write_whole(path, '{"new": 2}')
    assert path.read_text() == '{"new": 2}'
