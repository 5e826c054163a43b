# Two entry points (README): `make demo` runs the main job, `make test` runs the tests.
# Both create .venv and install the project with pinned versions (constraints.txt) first.
# Tests: 2 workers, each test module on one worker (--dist loadscope) so its module-scoped
# fixtures (tiny caches, trained smoke runs) are built once; compiled programs are shared
# through one JAX cache under .pytest_cache (tests/conftest.py).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo demo-full test test-all bench install clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,torch,gymnax]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m train.main --workdir=checkpoints/demo

demo-full: $(STAMP)
	$(PY) -m train.main --workdir=checkpoints/demo_full --full

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadscope -q

test-all: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadscope -q -m ''

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) checkpoints/demo checkpoints/demo_full
