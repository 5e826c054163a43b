"""Helpers shared by test modules, imported as ``tests.helpers.<module>`` (never ``from
conftest import ...`` or by a bare test-file name).

Why a package under ``tests/`` and not ``prada_jax/testing.py``: these helpers build PyTorch /
transformers reference models, and the library keeps torch out of ``import prada_jax`` (only
exporter modules behind the ``[torch]`` extra use it); the library-side helpers that need no
torch already live next to their code (``prada_jax.traces.testing``, ``evals.testing``).
Why not a conftest: every directory's ``conftest.py`` is imported under the one module name
``conftest``, so ``from conftest import x`` finds whichever conftest pytest loaded last, and one
pytest call selecting tests from two such directories failed at collection. ``pyproject.toml``
puts the repository root on ``sys.path`` (``pythonpath = ["."]``), so ``tests.helpers`` imports
the same way from any test, whatever else is collected.

* ``distill``: the distillation tests' tiny cache fixture, ``:smoke`` config and TensorBoard
  scalars.
* ``hf_lm``: tiny random Qwen2 / Llama PyTorch models, padded batches and their logits (the
  references of ``tests/prada_jax/lm``).
* ``hf_traces``: tiny offline HF folders (LMs, BPE tokenizer, value-head and step-tag PRMs,
  problems per benchmark schema) for the trace builder's tests.
"""
