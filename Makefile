# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1

.PHONY: demo test lint bench clean

$(BIN)/memplan: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU build where no CUDA is present, never a CUDA pull by accident.
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(BIN)/memplan

demo: $(BIN)/memplan
	$(BIN)/python -m benchmarks.demo

test: $(BIN)/memplan
	$(BIN)/python -m pytest -q -p no:logging

lint: $(BIN)/memplan
	$(BIN)/ruff check memplan tests benchmarks
	$(BIN)/ruff format --check memplan tests benchmarks

bench: $(BIN)/memplan
	$(BIN)/python -m benchmarks.sweep
	$(BIN)/python -m benchmarks.bounds
	$(BIN)/python -m benchmarks.compiled
	$(BIN)/python -m benchmarks.training_loop
	$(BIN)/python -m benchmarks.inductor_peaks
	$(BIN)/python -m benchmarks.models
	$(BIN)/python -m benchmarks.roofline
	$(BIN)/python -m benchmarks.fit

clean:
	rm -rf $(VENV) out
