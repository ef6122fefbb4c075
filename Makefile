# pipesched: every target uses .venv and creates it first when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned here (not in pyproject) so a fresh CPU machine takes the local CPU wheel;
# GPU users install their CUDA build of torch first and run `pip install -e ".[all]"` (see README).
TORCH_PIN ?= torch==2.13.0
# Versions the tests passed with; `make install CONSTRAINTS=` installs the newest instead.
CONSTRAINTS ?= constraints.txt
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)

.PHONY: install demo test test-fast lint format bench bench-solver bench-executor bench-simulate bench-slicing clean

$(BIN)/pipesched: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(PIP_CONSTRAINTS) -e ".[all,dev]"
	touch $(BIN)/pipesched

install: $(BIN)/pipesched

demo: install
	$(BIN)/python -m optimizer.demo

test: install
	$(BIN)/python -m pytest -q

# The quick loop while editing: everything but the tests marked slow (under a minute).
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-simulate: install
	$(BIN)/python benchmarks/simulate.py

bench-slicing: install
	$(BIN)/python benchmarks/slicing.py

bench-solver: install
	$(BIN)/python benchmarks/solver.py

bench-executor: install
	$(BIN)/python benchmarks/executor.py

bench: bench-simulate bench-slicing bench-solver bench-executor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
