# The two commands a new user runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-all bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch 2.13.0 (CPU build) first, exactly pinned: a looser pin fetches a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The default job: Wide&Deep on synthetic Criteo, 2 workers + 1 PS shard on this machine.
run: $(STAMP)
	$(VENV)/bin/het train

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" het tests

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow tests

test-all: $(STAMP)
	$(PY) -m pytest -q het tests

# The evaluation suite, short versions (about 5 minutes): results, tables and plots in
# runs/bench-quick/. The full suite, which rewrites docs/RESULTS.md's report region and
# docs/img/: `het bench report --run` (about 30 minutes).
bench: $(STAMP)
	$(VENV)/bin/het bench report --run --quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
