# `make quick-test`: set up .venv and run a real GRPO run on the embedded model.
# `make test`: set up .venv and run the test suite (what CI runs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install bytecode quick-test test test-fast lint bench clean

install: $(STAMP) bytecode

# Byte-compile our own modules: where PYTHONDONTWRITEBYTECODE is set (CI, many containers) Python would otherwise
# recompile them on every start, ~40 ms of `--help`. Up to date files are skipped.
bytecode: $(STAMP)
	$(PY) -m compileall -q config rewards *.py > /dev/null

$(STAMP): requirements.txt requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $(STAMP)

quick-test: install
	$(PY) train_grpo.py --quick-test

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(PY) -m ruff check .

bench: install
	$(PY) bench/bench_startup.py

clean:
	rm -rf $(VENV) grpo_outputs
