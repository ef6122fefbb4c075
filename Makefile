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

.PHONY: install demo test test-fast lint format bench bench-solver bench-executor bench-executor-depth bench-simulate bench-slicing clean

$(BIN)/pipesched: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(PIP_CONSTRAINTS) -e ".[all,dev]"
	touch $(BIN)/pipesched

install: $(BIN)/pipesched

demo: install
	$(BIN)/python -m optimizer.demo

# Test files run on TEST_WORKERS processes (pytest-xdist; each file stays on one worker, so
# its module fixtures are built once); `make test TEST_WORKERS=0` runs them in this one.
TEST_WORKERS ?= 2

test: install
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile,)

# The quick loop while editing: everything but the tests marked slow (about 40 s).
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile,)

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

# The executor at pipeline depth: the synthetic model on 8 and 16 ranks (sleeping ranks fit on 2 cores).
bench-executor-depth: install
	$(BIN)/python benchmarks/executor.py --model synthetic --devices 8
	$(BIN)/python benchmarks/executor.py --model synthetic --devices 16

bench: bench-simulate bench-slicing bench-solver bench-executor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
