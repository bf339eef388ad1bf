"""The notebook driver behind `make reproduce` (notebooks/run.py) and notebooks/tidy.py, on tiny notebooks
and a fake repository layout under tmp_path (a few seconds: each executed notebook starts a kernel)."""
import importlib.util
import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("study_driver", ROOT / "notebooks" / "run.py")
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)
from tidy import tidy  # noqa: E402 - notebooks/ is on sys.path once the driver is loaded

WIDGET = "application/vnd.jupyter.widget-view+json"


def notebook(path: Path, *cells: str) -> Path:
    """A notebook with the study's parameters cell followed by `cells`."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "smoke"\nlauncher = "local"\nfresh = False')
    params.metadata.tags = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A fake checkout: params/p.yaml, lib/a.py and notebooks/; outputs under tmp_path/out."""
    (tmp_path / "params").mkdir()
    (tmp_path / "params" / "p.yaml").write_text("seed: 0\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "a.py").write_text("x = 1\n")
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path / "out"))
    for key in driver.QUIET_ENV:                 # run_all sets these for its kernels; undone after the test
        monkeypatch.setenv(key, "")
    return tmp_path


def stamped(repo: Path, names: list[str]) -> dict:  # noqa: D103
    """Pretend each notebook ran: executed notebook and stamp; returns the dependencies per name."""
    out = repo / "out" / "p"
    out.mkdir(parents=True, exist_ok=True)
    deps = {}
    for i, name in enumerate(names):
        (out / f"{name}.ipynb").write_text("{}")
        deps[name] = driver.dependencies(repo, "p", repo / "notebooks" / f"{name}.ipynb", out, names[:i])
        driver.write_stamp(out, name, deps[name])
    return deps


def up_to_date_by_name(repo: Path, names: list[str]) -> dict[str, bool]:
    out = repo / "out" / "p"
    return {name: driver.up_to_date(out, name, driver.dependencies(repo, "p", repo / "notebooks" / f"{name}.ipynb",
                                                                    out, names[:i]))
            for i, name in enumerate(names)}


NAMES = ["01_a", "02_b", "03_c"]


@pytest.fixture
def ran(repo):
    for name in NAMES:
        notebook(repo / "notebooks" / f"{name}.ipynb", f"print({name!r})")
    stamped(repo, NAMES)
    assert up_to_date_by_name(repo, NAMES) == dict.fromkeys(NAMES, True)
    return repo


@pytest.mark.parametrize("change", ["params/p.yaml", "lib/a.py", "lib/new.py"])
def test_profile_or_lib_change_makes_every_notebook_stale(ran, change):
    (ran / change).write_text("changed\n")
    assert up_to_date_by_name(ran, NAMES) == dict.fromkeys(NAMES, False)


def test_notebook_change_makes_it_and_later_ones_stale_only_after_it_reruns(ran):
    notebook(ran / "notebooks" / "02_b.ipynb", "print('edited')")
    assert up_to_date_by_name(ran, NAMES) == {"01_a": True, "02_b": False, "03_c": True}
    stamped(ran, ["01_a", "02_b"])                # 01 and 02 rerun (01 again: its stamp changes too)
    assert up_to_date_by_name(ran, NAMES) == {"01_a": True, "02_b": True, "03_c": False}


def test_rerun_of_an_earlier_notebook_makes_later_ones_stale(ran):
    out = ran / "out" / "p"
    driver.write_stamp(out, "01_a", driver.dependencies(ran, "p", ran / "notebooks" / "01_a.ipynb", out, []))
    assert up_to_date_by_name(ran, NAMES) == {"01_a": True, "02_b": False, "03_c": False}


def test_missing_executed_notebook_or_stamp_is_stale(ran):
    (ran / "out" / "p" / "01_a.ipynb").unlink()
    (ran / "out" / "p" / ".stamps" / "03_c.json").unlink()
    assert up_to_date_by_name(ran, NAMES) == {"01_a": False, "02_b": True, "03_c": False}   # 02 waits for 01's rerun


def test_run_all_executes_then_skips_then_fresh_reruns(repo, capsys):
    notebook(repo / "notebooks" / "01_ok.ipynb", "print('fresh is', fresh)")
    notebook(repo / "notebooks" / "02_ok.ipynb", "print(profile, launcher)")
    out = repo / "out" / "p"
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4:2] == ["01_ok: running (no record of an earlier run here)",
                           "02_ok: running (no record of an earlier run here)"]
    assert lines[1].startswith("01_ok: done in") and lines[3].startswith("02_ok: done in")
    assert lines[4] == f"results in {driver.shown(out)}/" and lines[5].startswith("time: 01 ") and len(lines) == 6
    assert sorted(p.name for p in out.iterdir()) == [".logs", ".stamps", "01_ok.ipynb", "02_ok.ipynb"]
    assert "fresh is False" in (out / "01_ok.ipynb").read_text()
    assert "p local" in (out / "02_ok.ipynb").read_text()

    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["01_ok: up to date, skipped", "02_ok: up to date, skipped"]
    assert lines[-1] == "time: 01 skipped · 02 skipped"

    assert driver.run_all("p", "local", fresh=True, root=repo) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        f"the earlier settings' results are kept in {driver.shown(next((out / driver.KEPT).iterdir()))}/",
        "01_ok: running (FRESH=1)"]
    assert "fresh is True" in (out / "01_ok.ipynb").read_text()


def test_failure_keeps_previous_notebook_and_prints_the_error_in_two_lines(repo, capsys):
    notebook(repo / "notebooks" / "01_fail.ipynb", "x = 1", "raise ValueError('no such thing\\nsecond line')")
    out = repo / "out" / "p"
    out.mkdir(parents=True)
    (out / "01_fail.ipynb").write_text("previous results")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 1
    lines = capsys.readouterr().out.splitlines()
    failed = out / "01_fail.failed.ipynb"
    assert lines[-2:] == ["ValueError: no such thing", driver.shown(failed)]
    assert lines[1].startswith("01_fail: failed after")
    assert len(lines) == 4
    assert (out / "01_fail.ipynb").read_text() == "previous results"
    assert failed.exists() and not (out / "01_fail.running.ipynb").exists()
    assert "dependencies" not in driver.read_stamp(out, "01_fail")            # a failed run's stamp: never current
    assert driver.stale_reason(out, "01_fail", {}) == "its last run did not finish"
    nb = nbformat.read(failed, as_version=4)
    assert any(o.get("ename") == "ValueError" for c in nb.cells if c.cell_type == "code" for o in c.outputs)


# stamps cover what a notebook wrote: stale results are never reported current

WRITES = "import os, pathlib\nout = pathlib.Path(os.environ['STUDY_OUTPUTS']) / profile\n"


@pytest.fixture
def wrote(repo, capsys):
    """01 writes a.json and shared.json, 02 rewrites shared.json; both ran once."""
    notebook(repo / "notebooks" / "01_w.ipynb", WRITES + "(out / 'a.json').write_text('1')\n"
                                                         "(out / 'shared.json').write_text('from 01')")
    notebook(repo / "notebooks" / "02_w.ipynb", WRITES + "(out / 'shared.json').write_text('from 02')")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    capsys.readouterr()
    return repo / "out" / "p"


def rerun_lines(repo, capsys) -> list[str]:
    """What the driver says of each notebook on a second run: skipped, or running and why."""
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("0") and "done in" not in ln]


def test_stamp_records_the_result_files_each_notebook_wrote(wrote, repo, capsys):
    assert driver.read_stamp(wrote, "01_w")["results"].keys() == {"a.json", "shared.json"}
    assert driver.read_stamp(wrote, "02_w")["results"].keys() == {"shared.json"}
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped", "02_w: up to date, skipped"]


def test_a_changed_result_file_reruns_its_notebook_and_says_why(wrote, repo, capsys):
    (wrote / "a.json").write_text("restored from another commit")
    assert rerun_lines(repo, capsys) == ["01_w: running (a.json is not the one its run wrote)",
                                         "02_w: running (01_w ran again since)"]


def test_a_replaced_executed_notebook_or_a_missing_result_reruns(wrote, repo, capsys):
    (wrote / "02_w.ipynb").write_text("{}")
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped",
                                         "02_w: running (02_w.ipynb is not the one its run wrote)"]
    (wrote / "shared.json").unlink()                 # 01's too (02 may have added only its part): both rerun
    assert rerun_lines(repo, capsys) == ["01_w: running (shared.json is missing)",
                                         "02_w: running (01_w ran again since)"]


def test_other_settings_keep_the_earlier_results_and_a_code_change_does_not(wrote, repo, capsys):
    """A changed profile (or FRESH=1) starts another study: the result set it replaces is copied to earlier/<UTC>/
    first, executed notebooks, result files and stamps (runs/ keeps every run itself); a code change redoes the same
    study and keeps nothing. Nothing under earlier/ is a result of the new run."""
    (wrote / "runs" / "e2e-1").mkdir(parents=True)
    (wrote / "runs" / "e2e-1" / "samples.jsonl").write_text("{}")
    (repo / "lib" / "a.py").write_text("x = 2\n")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    assert not (wrote / driver.KEPT).exists() and "kept" not in capsys.readouterr().out
    before = {f: (wrote / f).read_bytes() for f in ("01_w.ipynb", "02_w.ipynb", "a.json", "shared.json")}
    (repo / "params" / "p.yaml").write_text("seed: 1\n")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    lines = capsys.readouterr().out.splitlines()
    (kept,) = (wrote / driver.KEPT).iterdir()
    assert lines[:2] == [f"the earlier settings' results are kept in {driver.shown(kept)}/",
                         "01_w: running (the profile changed: seed 0 -> 1)"]
    assert {f: (kept / f).read_bytes() for f in before} == before
    assert (kept / ".stamps" / "01_w.json").exists() and not (kept / "runs").exists()
    assert driver.read_stamp(wrote, "01_w")["results"].keys() == {"a.json", "shared.json"}
    assert driver.run_all("p", "local", fresh=True, root=repo) == 0
    assert len(list((wrote / driver.KEPT).iterdir())) == 2


def test_a_profile_change_names_the_settings_that_differ(wrote, repo, capsys):
    (repo / "params" / "p.yaml").write_text("seed: 0\n# a comment\n")
    assert rerun_lines(repo, capsys)[0] == "01_w: running (the profile changed)"      # the text only
    (repo / "params" / "p.yaml").write_text("seed: 0\ndecode: {k: 4, policy: grow}\nz: [1]\nzz: 2\n")
    assert rerun_lines(repo, capsys)[0] == ("01_w: running (the profile changed: decode.k None -> 4, "
                                            "decode.policy None -> grow, z None -> [1] (and 1 more))")


def test_a_lib_change_is_named(wrote, repo, capsys):
    (repo / "lib" / "a.py").write_text("x = 2\n")
    assert rerun_lines(repo, capsys)[0] == "01_w: running (lib/a.py changed)"


# Formerly a bug: a driver killed inside a notebook (kill, a time limit's SIGTERM: no Python code runs after it) had
# removed the notebook's stamp, so the next run said "running (no record of an earlier run here)" while notebook 03
# resumed the killed run's samples.
def test_a_notebook_whose_run_was_killed_says_so_when_it_runs_again(wrote, repo, capsys, monkeypatch):
    (repo / "lib" / "a.py").write_text("x = 2\n")
    with monkeypatch.context() as m:
        m.setattr(driver.papermill, "execute_notebook", lambda *a, **k: sys.exit("killed"))   # nothing after it runs
        with pytest.raises(SystemExit):
            driver.run_all("p", "local", fresh=False, root=repo)
    capsys.readouterr()
    assert rerun_lines(repo, capsys) == ["01_w: running (its last run did not finish)",
                                         "02_w: running (lib/a.py changed)"]


# Formerly a bug: SIGTERM (kill, a time limit) ended the driver at once, with no line, no failed notebook and no stamp
# naming the files the notebook had rewritten (notebook 03 adds its part to notebook 02's step breakdown: 02 ran again).
def test_sigterm_stops_a_notebook_as_ctrl_c_does(wrote, repo, capsys, monkeypatch):
    import signal

    def terminated(*a, **k):                      # the signal's handler, called as the signal would call it
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), "SIGTERM would end the driver at once"
        handler(signal.SIGTERM, None)
    (repo / "lib" / "a.py").write_text("x = 2\n")
    monkeypatch.setattr(driver.papermill, "execute_notebook", terminated)
    assert driver.run_all("p", "local", fresh=False, root=repo) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("01_w: stopped after") and lines[2] == "KeyboardInterrupt: stopped by SIGTERM"
    assert "failed" in driver.read_stamp(wrote, "01_w")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL            # the handler is the driver's only meanwhile


def test_a_later_notebook_that_fails_after_rewriting_a_result_leaves_the_earlier_one_current(wrote, repo, capsys):
    # 02 rewrites 01's shared.json, then fails (Ctrl-C in notebook 03 after it updated 02's step breakdown, say):
    # only 02 runs again
    notebook(repo / "notebooks" / "02_w.ipynb", WRITES + "(out / 'shared.json').write_text('half')\nraise KeyError")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 1
    capsys.readouterr()
    notebook(repo / "notebooks" / "02_w.ipynb", WRITES + "(out / 'shared.json').write_text('from 02')")
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped", "02_w: running (its last run did not finish)"]


def test_the_prompt_file_and_cuda_sources_are_dependencies(wrote, repo, capsys, monkeypatch):
    (repo / "params" / "p.yaml").write_text("seed: 0\nprompts: {file: mine.jsonl}\n")
    questions = repo / "mine.jsonl"
    questions.write_text("{}\n")
    monkeypatch.setattr(driver, "profile_prompt_file", lambda file: (questions, "questions"))
    assert rerun_lines(repo, capsys)[0] == "01_w: running (the profile changed: prompts.file None -> mine.jsonl)"
    questions.write_text('{"more": 1}\n')                  # `make data` arriving under prompts.file: auto, say
    assert rerun_lines(repo, capsys)[0] == "01_w: running (the prompt file changed (mine.jsonl))"
    (repo / "lib" / "kernel.cu").write_text("// a kernel\n")
    assert rerun_lines(repo, capsys)[0] == "01_w: running (lib/kernel.cu changed)"


def test_a_profile_given_as_its_file_runs_under_its_name(repo, monkeypatch):
    ran = []
    monkeypatch.setattr(driver, "preflight", ran.append)
    monkeypatch.setattr(driver, "run_all", lambda profile, launcher, fresh: ran.append(profile) or 0)
    assert driver.main(["params/p.yaml"]) == 0 and ran == ["p", "p"]


# Formerly a bug: an unknown launcher (make reproduce LAUNCHER=bogus) ran notebooks 01 and 02, then stopped in
# notebook 03 (ValueError: unknown launcher 'bogus'), leaving a failed notebook.
def test_an_unknown_launcher_stops_in_one_line_before_any_notebook(repo, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(driver, "preflight", ran.append)
    monkeypatch.setattr(driver, "run_all", lambda *a: ran.append(a) or 0)
    with pytest.raises(SystemExit) as e:
        driver.main(["p", "--launcher", "bogus"])
    assert e.value.code == 2 and ran == []
    out = capsys.readouterr()
    assert out.out + out.err == "error: unknown launcher 'bogus': use local, slurm or submitit-local\n"


# `make reproduce PROFILE=` passes no profile: argparse's usage line and "run.py: error: the following arguments are
# required: profile" named neither the make variable nor a profile to give.
def test_no_profile_stops_in_one_line_naming_the_make_variable(repo, capsys):
    with pytest.raises(SystemExit) as e:
        driver.main(["--launcher", "local"])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.err == "" and out.out.count("\n") == 1
    assert out.out.startswith("error: no profile given: make reproduce PROFILE=<profile>") and "'smoke'" in out.out
    assert not (repo / "out").exists()


def test_preflight_failure_stops_before_any_output(repo, monkeypatch, capsys):
    monkeypatch.setattr(driver, "PREFLIGHT", [sys.executable, "-c",
                                              "import sys; print('error: no GPU for', sys.argv[1]); sys.exit(2)"])
    with pytest.raises(SystemExit) as e:
        driver.main(["p"])
    assert e.value.code == 2
    assert capsys.readouterr().out == "error: no GPU for p\n"
    assert not (repo / "out").exists()


def test_preflight_is_lib_preflight_and_rejects_an_unknown_profile(repo, capsys):
    assert driver.PREFLIGHT[1:] == ["-m", "lib.study.preflight"]
    with pytest.raises(SystemExit) as e:
        driver.main(["no_such_profile"])
    assert e.value.code == 2
    out = capsys.readouterr().out
    assert out.startswith("error:") and out.count("\n") == 1
    assert not (repo / "out").exists()


def test_tidy_drops_widget_state_and_timing_keeps_outputs_of_executed_notebooks(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata.widgets = {"application/vnd.jupyter.widget-state+json": {"state": {"abc123": {}}}}
    nb.metadata.papermill = {"duration": 1.0}
    cell = nbformat.v4.new_code_cell("work()")
    cell.metadata.papermill = {"duration": 1.0}
    cell.metadata.execution = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    cell.outputs = [nbformat.v4.new_output("display_data", data={WIDGET: {"model_id": "abc123"}, "text/plain": "bar"}),
                    nbformat.v4.new_output("stream", name="stderr", text="a warning\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="res"),
                    nbformat.v4.new_output("stream", name="stdout", text="ult\n")]   # one print, split by the kernel
    nb.cells = [cell]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)

    tidy(path, keep_outputs=True)
    text = path.read_text()
    assert "abc123" not in text and "widget" not in text and "papermill" not in text and "iopub" not in text
    assert [o.get("name") for o in nbformat.read(path, as_version=4).cells[0].outputs] == ["stderr", "stdout"]
    assert nbformat.read(path, as_version=4).cells[0].outputs[1].text == "result\n"

    tidy(path)                                                 # committed nbval references: no stderr either
    assert [o.get("name") for o in nbformat.read(path, as_version=4).cells[0].outputs] == ["stdout"]


def test_tidy_writes_run_names_and_commits_as_nbval_reads_them(tmp_path):
    """Re-executing the nbval references with no change must change no line: run names and commits vary."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(run)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="run runs/e2e-20261126T035422 (commit 7f2b78680fd3c8bf3eaab4de4a8c7a2f1e2c0350+dirty)\n")]
    nb.cells = [cell]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    tidy(path, keep_outputs=True)                              # executed notebooks keep the real names
    assert "e2e-20261126T035422" in nbformat.read(path, as_version=4).cells[0].outputs[0].text
    tidy(path)
    assert nbformat.read(path, as_version=4).cells[0].outputs[0].text == "run runs/e2e-RUN (commit HASH)\n"


def test_make_test_writes_results_and_models_to_scratch_only():
    makefile = (ROOT / "Makefile").read_text()
    scratch = next(line for line in makefile.splitlines() if line.startswith("SCRATCH_ENV"))
    assert "STUDY_OUTPUTS=$$scratch/" in scratch and "STUDY_MODELS=$$scratch/" in scratch
    recipe = makefile.split("\ntest: env\n")[1].split("\n\n")[0]
    assert recipe.count("$(SCRATCH_ENV) $(PY) -m pytest") == 2


def test_the_thesis_tables_are_a_dependency_of_the_analysis_notebook(repo, capsys):
    """Notebook 04 sets our tables beside params/thesis_tables.yaml's published numbers: a change to them is a
    change to its results."""
    notebook(repo / "notebooks" / "01_w.ipynb", "x = 1")
    notebook(repo / "notebooks" / "04_analysis.ipynb", "x = 2")
    tables = repo / "params" / "thesis_tables.yaml"
    tables.write_text("table_4_5: {dense_ordinary: {acceptance: 0.5}}\n")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    capsys.readouterr()
    tables.write_text("table_4_5: {dense_ordinary: {acceptance: 0.6}}\n")
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped",
                                         "04_analysis: running (params/thesis_tables.yaml changed)"]


def test_the_summaries_of_the_compared_profiles_are_a_dependency_of_the_analysis_notebook(repo, capsys):
    """Notebook 04 sets the summary.json of each profile under compare_with beside this one's: a re-run of one of
    them changes its results."""
    (repo / "params" / "p.yaml").write_text("seed: 0\ncompare_with: [q]\n")
    notebook(repo / "notebooks" / "01_w.ipynb", "x = 1")
    notebook(repo / "notebooks" / "04_analysis.ipynb", "x = 2")
    other = repo / "out" / "q" / "summary.json"
    other.parent.mkdir(parents=True)
    other.write_text('{"tok_s": 100}')
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    capsys.readouterr()
    other.write_text('{"tok_s": 120}')
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped", "04_analysis: running (q/summary.json changed)"]


def test_a_changed_file_that_a_later_notebook_added_to_reruns_every_notebook_that_wrote_it(repo, capsys):
    """02 adds its part to 01's shared.json (as notebook 03 adds the target's part to notebook 02's
    step_breakdown.json): put back from another commit, 01's part is stale too, so 01 runs again, not only 02."""
    merge = WRITES + "import json\nf = out / 'shared.json'\n"
    notebook(repo / "notebooks" / "01_m.ipynb", merge + "f.write_text(json.dumps({'a': 'from 01'}))")
    notebook(repo / "notebooks" / "02_m.ipynb",
             merge + "f.write_text(json.dumps({**json.loads(f.read_text()), 'b': 2}))")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    capsys.readouterr()
    out = repo / "out" / "p"
    (out / "shared.json").write_text('{"a": "old", "b": "old"}')
    assert rerun_lines(repo, capsys) == ["01_m: running (shared.json is not the one its run wrote)",
                                         "02_m: running (01_m ran again since)"]
    assert json.loads((out / "shared.json").read_text()) == {"a": "from 01", "b": 2}
    (out / "shared.json").unlink()
    assert rerun_lines(repo, capsys) == ["01_m: running (shared.json is missing)",
                                         "02_m: running (01_m ran again since)"]
    assert json.loads((out / "shared.json").read_text()) == {"a": "from 01", "b": 2}


def test_a_relative_study_models_is_the_one_preflight_checked(repo, capsys, monkeypatch):
    """STUDY_MODELS=scratch/models given to `make reproduce`: preflight (run in the repository) counted disk and
    checked the models there, the kernels (run in notebooks/) wrote them under notebooks/ (into the code a commit
    claim covers)."""
    monkeypatch.chdir(repo)
    monkeypatch.setenv("STUDY_MODELS", "scratch/models")
    notebook(repo / "notebooks" / "01_m.ipynb",
             WRITES + "(out / 'models.txt').write_text(str(pathlib.Path(os.environ['STUDY_MODELS']).resolve()))")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    assert (repo / "out" / "p" / "models.txt").read_text() == str(repo / "scratch" / "models")


def test_the_run_the_analysis_reads_is_a_dependency_of_the_analysis_notebook(repo, capsys):
    """Notebook 04 analyses the latest finished e2e run: one made without notebook 03 (a script, or put back by git)
    is a new input, and 04 runs again though nothing else changed."""
    notebook(repo / "notebooks" / "01_w.ipynb", "x = 1")
    notebook(repo / "notebooks" / "04_analysis.ipynb", "x = 2")
    assert driver.run_all("p", "local", fresh=False, root=repo) == 0
    capsys.readouterr()
    run = repo / "out" / "p" / "runs" / "e2e-20261129T120000"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "samples.jsonl").write_text('{"mode": "baseline"}\n')
    (run / "DONE").write_text('{"finished": "2026-11-29T12:00:00+00:00"}')
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped", "04_analysis: running (the analysed run changed)"]
    assert rerun_lines(repo, capsys) == ["01_w: up to date, skipped", "04_analysis: up to date, skipped"]
