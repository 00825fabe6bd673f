# The two commands that do all set-up on a fresh machine: `make demo` and `make test`.
# Everything is installed into .venv; nothing outside the project is touched.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TRACES ?= ../shared/traces

.PHONY: demo test lint pytest bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

## make demo: replay the example trace through each policy and print the comparison table.
demo: $(STAMP)
	$(BIN)/jupyter-gpusched replay examples/trace.csv \
		--cluster examples/cluster.yaml --queues examples/queues.yaml \
		--config examples/policy.yaml \
		--policy gpusched --policy fifo --out demo-out

## make test: lint, then the whole test suite ("no tests collected" fails: pytest exits 5).
test: lint pytest

lint: $(STAMP)
	$(BIN)/ruff check jupyter_gpusched tests benchmarks
	$(BIN)/ruff format --check jupyter_gpusched tests benchmarks

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache .hypothesis
