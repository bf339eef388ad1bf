# make reproduce [PROFILE=smoke|h100|thesis]   run the four notebooks into outputs/$(PROFILE)/
# make test                                   unit tests + nbval on the committed notebooks
# make lab                                    JupyterLab on the same environment
PROFILE ?= smoke
LAUNCHER ?= local
VENV := .venv
PY := $(VENV)/bin/python
NOTEBOOKS := $(sort $(wildcard notebooks/0*.ipynb))
OUT := outputs/$(PROFILE)

.PHONY: env reproduce test lab notebooks data
SPEC_BENCH := data/spec_bench/question.jsonl
SPEC_BENCH_URL := https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl

env: $(VENV)/.done
$(VENV)/.done: environment.yml
	@if command -v conda >/dev/null 2>&1; then \
	  conda env update -p $(VENV) -f environment.yml; \
	else \
	  python3 -m venv $(VENV) && \
	  sed -n '/- pip:/,$$p' environment.yml | sed -n 's/^ *- \([A-Za-z0-9_.-]*==.*\)$$/\1/p' > $(VENV)/requirements.txt && \
	  $(PY) -m pip install -q --upgrade pip && \
	  $(PY) -m pip install -q -r $(VENV)/requirements.txt; \
	fi
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PY) -c "import site; open(site.getsitepackages()[0] + '/study_root.pth', 'w').write('$(CURDIR)\n')"
	touch $@

reproduce: env
	@mkdir -p $(OUT)
	@for nb in $(NOTEBOOKS); do \
	  echo "== $$nb ($(PROFILE))"; \
	  $(PY) -m papermill $$nb $(OUT)/$$(basename $$nb) -k python3 --cwd notebooks \
	    -p profile $(PROFILE) -p launcher $(LAUNCHER) || exit 1; \
	done
	@echo "results in $(OUT)/"

test: env
	$(PY) -m pytest -q tests
	$(PY) -m pytest -q -p no:cacheprovider --nbval --nbval-sanitize-with notebooks/sanitize.cfg --nbval-current-env $(NOTEBOOKS)

# Re-execute the committed notebooks on smoke (what nbval checks), then tidy them.
notebooks: env
	@for nb in $(NOTEBOOKS); do $(PY) -m papermill $$nb $$nb -k python3 --cwd notebooks -p profile smoke || exit 1; done
	$(PY) notebooks/tidy.py $(NOTEBOOKS)

# Spec-Bench's question file for the thesis profile (480 questions); offline, says where to put it.
data: $(SPEC_BENCH)
$(SPEC_BENCH):
	@mkdir -p $(dir $@)
	@curl -fsSL --max-time 60 $(SPEC_BENCH_URL) -o $@.part && mv $@.part $@ && echo "fetched $@" || \
	  { rm -f $@.part; echo "could not download Spec-Bench's question file (offline?)."; \
	    echo "Copy question.jsonl from https://github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl) to $(CURDIR)/$@"; exit 1; }

lab: env
	$(VENV)/bin/jupyter lab notebooks
