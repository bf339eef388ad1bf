# Profiles (params/<name>.yaml; params/thesis_tables.yaml holds the thesis's numbers, not a profile):
#   smoke    tiny synthetic pair, fp32 on a CPU (CI and nbval; about 2 minutes)
#   h100     shape-faithful synthetic pair, bf16 on one 80 GB GPU (every timing in the study)
#   h100awq  the h100 pair with the 32B-shaped target as AWQ int4 (the study's triton_w4a16 kernel; loads through gptqmodel, whose wheels the GPU needs)
#   two_gpu  the h100 pair on two GPUs of one host, adding the pipelined schedule
#   two_gpu_awq  two_gpu with h100awq's int4 target (triton_w4a16) on GPU 0
#   smollm2  real weights on a CPU: SmolLM2-135M as target, its first layers as early-exit drafts (the default;
#            sized for a first run: about 8 minutes on 2 cores)
#   smollm2_full  the smollm2 study at full size: adaptive drafts, block-length policies, every side study
#   thesis   the real checkpoints and Spec-Bench prompts (make data first)
# Targets:
#   make env        build .venv from environment.yml (every other target does this first)
#   make reproduce  run the notebooks into outputs/PROFILE/ (notebooks/run.py), skipping up-to-date ones
#   make test       unit tests + nbval on the committed notebooks; writes only to scratch (results and models)
#   make notebooks  re-execute the committed notebooks on smoke in place (nbval references), tidy them
#   make data       fetch Spec-Bench's question file (thesis profile)
#   make lab        JupyterLab on the same environment; prints its URL with the token
# Variables: PROFILE=smollm2 (a profile above), FRESH=1 (rerun every notebook, new e2e run), LAUNCHER=local|slurm|submitit-local,
#   RESUME_ANY_COMMIT=1 (resume an unfinished e2e run although other code started it)
PROFILE ?= smollm2
LAUNCHER ?= local
FRESH ?=
VENV := .venv
PY := $(VENV)/bin/python
NOTEBOOKS := $(sort $(wildcard notebooks/0*.ipynb))
NBVAL := --nbval --nbval-sanitize-with notebooks/sanitize.cfg --nbval-current-env
# No progress bars in executed notebooks (stderr outputs, widget state).
QUIET := TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error KINETO_LOG_LEVEL=6

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
	sed -n 's/^ *# no-deps: *\([A-Za-z0-9_.-]*==[^ ]*\).*$$/\1/p' environment.yml > $(VENV)/requirements-nodeps.txt
	$(PY) -m pip install -q --no-deps -r $(VENV)/requirements-nodeps.txt
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PY) -c "import site; open(site.getsitepackages()[0] + '/study_root.pth', 'w').write('$(CURDIR)\n')"
	touch $@

reproduce: env
	@$(PY) notebooks/run.py $(PROFILE) --launcher $(LAUNCHER) $(if $(filter-out 0,$(FRESH)),--fresh)

# Everything the tests write (results and models) goes to a scratch directory, removed afterwards: the checkout
# stays as it was.
SCRATCH_ENV = STUDY_OUTPUTS=$$scratch/outputs STUDY_MODELS=$$scratch/models $(QUIET)
test: env
	@scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	$(SCRATCH_ENV) $(PY) -m pytest -q -p no:cacheprovider tests && \
	$(SCRATCH_ENV) $(PY) -m pytest -q -p no:cacheprovider $(NBVAL) $(NOTEBOOKS)

# Re-execute the committed notebooks in place on smoke (what nbval checks; results to a scratch
# STUDY_OUTPUTS, outputs/smoke/ is left alone), then tidy them.
notebooks: env
	@scratch=$$(mktemp -d) && trap 'rm -rf "$$scratch"' EXIT && \
	for nb in $(NOTEBOOKS); do \
	  echo "== $$nb"; \
	  $(SCRATCH_ENV) $(PY) -m papermill $$nb $$nb -k python3 --cwd notebooks -p profile smoke \
	    --no-progress-bar --log-level WARNING || exit 1; \
	done
	$(PY) notebooks/tidy.py $(NOTEBOOKS)

# Spec-Bench's question file for the thesis profile (480 questions); offline, says where to put it.
data: $(SPEC_BENCH)
$(SPEC_BENCH):
	@mkdir -p $(dir $@)
	@curl -fsSL --max-time 60 $(SPEC_BENCH_URL) -o $@.part && mv $@.part $@ && echo "fetched $@" || \
	  { rm -f $@.part; echo "could not download Spec-Bench's question file (offline?)."; \
	    echo "Copy question.jsonl from https://github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl) to $(CURDIR)/$@"; exit 1; }

# Prints the URL with its token; --allow-root only when run as root (containers).
lab: env
	$(VENV)/bin/jupyter lab notebooks --ip=127.0.0.1 --ServerApp.open_browser=False \
	  $(if $(filter 0,$(shell id -u)),--allow-root)
