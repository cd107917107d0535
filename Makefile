# make demo   fresh machine: creates .venv, installs, runs the demo on an embedded local Ray
# make test   same set-up, type-checks src/ (mypy, [tool.mypy] in pyproject.toml), then runs the whole test suite
# make bench  runs the benchmarks in bench/ (not part of the tests)

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test typecheck bench install clean browser

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q -e ".[dev,verl]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/raysleuth demo

typecheck: $(STAMP)
	$(PY) -m mypy

test: $(STAMP) browser typecheck
	$(PY) -m pytest -q

# The report's browser test needs Chromium; install it where we may (root or sudo, apt),
# never fail when we cannot (the test then skips and says why).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1 \
	  || { if command -v apt-get >/dev/null 2>&1; then \
	         if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium >/dev/null 2>&1 \
	           || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; \
	         elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo -n apt-get install -y -q chromium >/dev/null 2>&1; fi; \
	       fi; true; }

bench: $(STAMP)
	@status=0; for script in bench/bench_*.py; do echo "== $$script"; $(PY) $$script || { echo "!! $$script missed its target or failed"; status=1; }; done; exit $$status

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
