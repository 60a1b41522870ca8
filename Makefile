# Two commands on a fresh machine with python3 + pip: `make demo`, `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench notebooks clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vtrm-gate demo

lint: $(STAMP)
	$(BIN)/ruff check vtrm_gate tests benchmarks

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -p no:cacheprovider tests
	VTRM_CI=1 $(BIN)/python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env notebooks

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
