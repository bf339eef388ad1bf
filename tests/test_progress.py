"""What a person sees while `make reproduce` runs: lib/progress.py's events, notebooks/watch.py's lines (with a
fake clock), and the closing summary (lib/report/headline.py)."""
import io
import json

import nbformat
import pytest

from lib import progress
from lib.report.headline import headline
from test_driver import driver, notebook, repo  # noqa: F401 - the fake checkout fixture
from watch import Watch, duration, running_cell


@pytest.fixture
def events(tmp_path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("STUDY_PROGRESS", str(path))
    return path


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_steps_report_every_item_once_the_driver_listens(events, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    assert list(progress.steps(["a", "b", "c"], "e2e", "samples", before=2)) == ["a", "b", "c"]
    got = [(e["stage"], e["done"], e["total"], e["start"]) for e in read(events)]
    assert got == [("e2e", 2, 5, 2), ("e2e", 3, 5, 2), ("e2e", 4, 5, 2), ("e2e", 5, 5, 2)]


def test_steps_are_throttled_but_the_last_one_always_goes_out(events):
    assert sum(progress.steps(range(1000), "k-means")) == sum(range(1000))
    dones = [e["done"] for e in read(events)]
    assert dones[0] == 0 and dones[-1] == 1000 and len(dones) < 10


def test_named_steps_report_each_item_as_it_starts(events, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    assert list(progress.steps(["mma", "marlin"], "int4 kernels", "kernels", name=str)) == ["mma", "marlin"]
    got = [(e["done"], e.get("now"), e.get("uneven")) for e in read(events)]
    assert got == [(0, None, True), (0, "mma", True), (1, None, True), (1, "marlin", True), (2, None, True)]


def test_notes_go_to_the_driver_and_the_notebook(events, capsys):
    progress.note("resuming run e2e-1 (10 samples already recorded)")
    assert read(events)[0]["note"] == "resuming run e2e-1 (10 samples already recorded)"
    assert capsys.readouterr().out == "resuming run e2e-1 (10 samples already recorded)\n"


def test_without_a_driver_steps_only_iterate(tmp_path, monkeypatch):
    monkeypatch.delenv("STUDY_PROGRESS", raising=False)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert list(progress.steps([1, 2], "x")) == [1, 2]
    assert not list(tmp_path.iterdir())


def test_a_driver_out_of_reach_is_no_driver(tmp_path, monkeypatch):
    # a Slurm shard on another node inherits the driver's path, whose folder is not there
    monkeypatch.setenv("STUDY_PROGRESS", str(tmp_path / "gone" / "progress.jsonl"))
    assert list(progress.steps([1, 2], "x")) == [1, 2]
    progress.note("still printed")


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def emit(path, **event):
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def test_log_lines_on_stage_changes_every_30_s_and_with_an_estimate(tmp_path):
    clock, ev = Clock(), tmp_path / "ev.jsonl"
    w = Watch("03_speculative", ev, tmp_path / "staging.ipynb", tty=False, clock=clock)
    emit(ev, stage="e2e", done=0, total=126, unit="samples", start=0, time=1000.0)
    assert w.poll() == ([], "03_speculative: 0 s · e2e: 0/126 samples, 0 s")
    clock.t += 10
    emit(ev, stage="e2e", done=20, total=126, unit="samples", start=0, time=clock.t)
    assert w.poll() == ([], None)                                  # nothing new to say before 30 s
    clock.t += 20
    emit(ev, stage="e2e", done=60, total=126, unit="samples", start=0, time=clock.t)
    assert w.poll()[1] == "03_speculative: 30 s · e2e: 60/126 samples, 30 s, about 33 s left"
    emit(ev, note="resuming run e2e-1")
    assert w.poll() == (["03_speculative: resuming run e2e-1"], None)


def test_an_uneven_stage_names_its_item_and_makes_no_estimate(tmp_path):
    clock, ev = Clock(), tmp_path / "ev.jsonl"
    w = Watch("02_microbench", ev, tmp_path / "staging.ipynb", tty=True, clock=clock)
    emit(ev, stage="int4 kernels", done=5, total=6, unit="kernels", start=0, uneven=True, time=clock.t - 120)
    emit(ev, stage="int4 kernels", done=5, total=6, unit="kernels", start=0, uneven=True, now="marlin", time=clock.t)
    assert w.poll()[1] == "02_microbench: 0 s · int4 kernels: 5/6 kernels, 2 m 00 s, now marlin"
    emit(ev, stage="int4 kernels", done=6, total=6, unit="kernels", start=0, uneven=True, time=clock.t)
    assert w.poll()[1] == "02_microbench: 0 s · int4 kernels: 6/6 kernels, done in 2 m 00 s"


def test_a_resumed_stage_estimates_from_this_run_only(tmp_path):
    clock, ev = Clock(), tmp_path / "ev.jsonl"
    w = Watch("03", ev, tmp_path / "staging.ipynb", tty=True, clock=clock)
    emit(ev, stage="e2e", done=100, total=120, unit="samples", start=100, time=clock.t)
    w.poll()
    clock.t += 10
    emit(ev, stage="e2e", done=110, total=120, unit="samples", start=100, time=clock.t)
    assert w.poll()[1].endswith("110/120 samples, 10 s, about 10 s left")


def test_silence_names_the_running_cell(tmp_path):
    clock, ev, staging = Clock(), tmp_path / "ev.jsonl", tmp_path / "staging.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("# why\ndiv = study.divergences(P)")]
    nb.cells[1].metadata.papermill = {"status": "running"}
    nbformat.write(nb, staging)
    assert running_cell(staging) == "cell 1: div = study.divergences(P)"
    w = Watch("03", ev, staging, tty=False, clock=clock)
    clock.t += 30
    assert w.poll() == ([], "03: 30 s")                           # the 30 s heartbeat
    clock.t += 35
    assert w.poll()[1] == "03: 1 m 05 s · nothing reported for 1 m 05 s; running cell 1: div = study.divergences(P)"


def test_a_terminal_gets_one_rewritten_line(tmp_path):
    out, ev = io.StringIO(), tmp_path / "ev.jsonl"
    w = Watch("01", ev, tmp_path / "s.ipynb", tty=True, clock=Clock(), out=out)
    emit(ev, note="kept clustering.json")
    w.show(*w.poll())
    assert out.getvalue() == "\r\033[K01: kept clustering.json\n\r\033[K01: 0 s"


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (4.4, 59.6, 130, 3725)] == ["4 s", "1 m 00 s", "2 m 10 s", "1 h 02 m"]


def test_the_driver_shows_a_notebooks_progress_and_its_notes(repo, capfd):  # noqa: F811
    notebook(repo / "notebooks" / "01_p.ipynb",
             "from lib.progress import note, steps\nnote('resuming run r (2 samples already recorded)')\n"
             "for _ in steps(range(3), 'e2e', 'samples'): pass")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    out = capfd.readouterr().out
    assert "01_p: resuming run r (2 samples already recorded)\n" in out
    assert "e2e: 3/3 samples" in out


SUMMARY = {"profile": "p", "device": "cpu", "acceptance_note": "synthetic pair: acceptance is artificial",
           "e2e": {"baseline": {"decode_tok_s": 10.0, "exact_match_rate": 1.0, "acceptance": None},
                   "dense_ordinary": {"decode_tok_s": 12.5, "acceptance": 0.5, "exact_match_rate": 1.0},
                   "flash_deferred": {"decode_tok_s": 15.0, "acceptance": 0.25, "exact_match_rate": 0.5},
                   "flash_deferred_grow": {"decode_tok_s": 16.0, "acceptance": 0.3, "exact_match_rate": 1.0}}}


def test_headline_names_exact_match_throughput_and_acceptance_per_draft():
    lines = headline(SUMMARY)
    assert lines[:4] == ["headline (p, cpu):", "  synthetic pair: acceptance is artificial",
                         "  exact match with greedy decoding: 0.50 to 1.00 per mode (lowest: flash_deferred)",
                         "  baseline decode: 10.0 tok/s"]
    dense, flash = (next(ln for ln in lines if ln.strip().startswith(d)) for d in ("Dense", "FlashHead"))
    assert dense.split()[1:] == ["12.5", "(0.500)", "-"] and flash.split()[1:] == ["-", "15.0", "(0.250)"]
    assert lines[-1] == "  and 1 block-length-policy modes: summary.json, notebook 04"
    assert headline({"e2e": {}}) == []


def test_headline_names_the_card_its_end_to_end_numbers_ran_on():
    """summary.json's `device` is notebook 02's card (microbench.json); the headline's tok/s are the e2e run's, which
    may have run on another card (a run reused, notebook 02 re-run elsewhere): the headline names the run's card."""
    lines = headline({**SUMMARY, "device": "NVIDIA H100 80GB HBM3", "run_device": "NVIDIA H200"})
    assert lines[0] == "headline (p, NVIDIA H200):"
    assert headline(SUMMARY)[0] == "headline (p, cpu):"                # summaries made before run_device


def test_headline_names_an_engine_whose_fused_step_fell_back():
    why = "fused step off the reference: relative error 0.173 > 0.15"
    lines = headline({**SUMMARY, "run_bodies": {"target": "reference", "dense": "fused", "flash": f"reference ({why})"}})
    assert lines[-1] == f"  NOTE flash ran its reference body, not the fused step: {why}"
    assert not any("NOTE" in ln for ln in headline({**SUMMARY, "run_bodies": {"target": "reference", "dense": "fused"}}))


def test_a_finished_stage_keeps_the_time_it_took(tmp_path):
    clock, ev = Clock(), tmp_path / "ev.jsonl"
    w = Watch("03", ev, tmp_path / "s.ipynb", tty=True, clock=clock)
    emit(ev, stage="sampling study", done=0, total=4, unit="samples", start=0, time=clock.t)
    emit(ev, stage="sampling study", done=4, total=4, unit="samples", start=0, time=clock.t + 20)
    clock.t += 50                                                   # the next stage has not reported yet
    assert w.poll()[1] == "03: 50 s · sampling study: 4/4 samples, done in 20 s"
