# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1

# Test workers: one per core, at most 8. Each test process reads its own allocator, so
# workers do not disturb one another's peaks; tests assert no times.
# The twenty slowest tests are listed at the end, to keep the run short.
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -p no:logging --durations=20 -n $(TEST_WORKERS) --maxprocesses 8 --dist worksteal

.PHONY: demo test test-slow lint bench clean

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
	$(PYTEST)

# The tests marked slow (long end-to-end runs, excluded from `make test`); `make bench` runs them.
test-slow: $(BIN)/memplan
	$(PYTEST) -m slow

lint: $(BIN)/memplan
	$(BIN)/ruff check memplan tests benchmarks
	$(BIN)/ruff format --check memplan tests benchmarks README.md docs

bench: test-slow
	$(BIN)/python -m benchmarks.sweep
	$(BIN)/python -m benchmarks.bounds
	$(BIN)/python -m benchmarks.compiled
	$(BIN)/python -m benchmarks.head_to_head
	$(BIN)/python -m benchmarks.training_loop
	$(BIN)/python -m benchmarks.inductor_peaks
	$(BIN)/python -m benchmarks.repeated_calls
	$(BIN)/python -m benchmarks.own_checkpointing
	$(BIN)/python -m benchmarks.graph_breaks
	$(BIN)/python -m benchmarks.changing_breaks
	$(BIN)/python -m benchmarks.models
	$(BIN)/python -m benchmarks.roofline
	$(BIN)/python -m benchmarks.fit

clean:
	rm -rf $(VENV) out
