# The two commands a new user runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

NATIVE := het/native/.built
# het's own bytecode, written before a command runs: where PYTHONDONTWRITEBYTECODE is set, Python
# would compile every module of het at every start of a process (workers, shards, the tests' own).
BYTECODE := $(PY) -m compileall -q het > /dev/null

.PHONY: run test test-slow test-all bench native clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch 2.13.0 (CPU build) first, exactly pinned: a looser pin fetches a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The native core (het/native/*.cpp, one file per component, compiled in a few groups that each
# parse torch's headers once; wire.h, what it knows of the PS messages, written first from
# het/ps/protocol/schema.py) with the system g++, for this machine's CPU (for a build shared by machines of several kinds: HET_NATIVE_MARCH=x86-64-v2
# .venv/bin/python -m het.native.build); one line, the compiler's output only if it fails; nothing
# when a module of these sources is built already. If it cannot be built, het runs its PyTorch
# reference path and says so once.
$(NATIVE): $(wildcard het/native/*.cpp het/native/*.h) het/native/build.py het/ps/protocol/schema.py $(STAMP)
	$(PY) -m het.ps.protocol.schema
	$(PY) -m het.native.build --if-stale
	touch $(NATIVE)

native: $(NATIVE)

# The default job: Wide&Deep on synthetic Criteo, 2 workers + 1 PS shard on this machine.
run: $(STAMP) $(NATIVE)
	$(BYTECODE)
	$(VENV)/bin/het train

# Two test processes (pytest-xdist): most tests wait on processes they start, so two share this
# 2-core machine's cores at 1.4x one's pace; every test starts its own on free ports and files.
test: $(STAMP) $(NATIVE)
	$(BYTECODE)
	$(PY) -m pytest -q -n 2 -m "not slow" het tests

test-slow: $(STAMP) $(NATIVE)
	$(BYTECODE)
	$(PY) -m pytest -q -m slow tests

test-all: $(STAMP) $(NATIVE)
	$(BYTECODE)
	$(PY) -m pytest -q het tests

# The evaluation suite, short versions (about 5 minutes): results, tables and plots in
# runs/bench-quick/. The full suite, which rewrites docs/RESULTS.md's report region and
# docs/img/: `het bench report --run` (about 30 minutes).
bench: $(STAMP) $(NATIVE)
	$(BYTECODE)
	$(VENV)/bin/het bench report --run --quick

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis $(NATIVE) het/native/_het_native*.so het/native/_het_native*.cpu
	find het -type d -name __pycache__ -prune -exec rm -rf {} +
