# make demo   fresh machine: creates .venv, installs, runs the demo on an embedded local Ray
# make test   same set-up, runs the whole test suite
# make bench  runs the benchmarks in bench/ (not part of the tests)

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/raysleuth demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	@for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
