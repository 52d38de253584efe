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

bench: $(STAMP)
	$(VENV)/bin/het bench cache --alpha 1.05 --keys 1000000 --capacity-frac 0.1 --policy lfu --json
	$(VENV)/bin/het bench ps --json

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
