"""Shared test helpers are imported from the ``tests.helpers`` package, never ``from conftest
import ...`` or by a bare test-file name: every directory's conftest is the module
``conftest``, so such an import finds whichever one pytest loaded last, and one pytest call
selecting tests from ``tests/prada_jax/lm`` and ``tests/prada_jax/traces`` failed to collect."""
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_BAD = re.compile(r"^\s*(from\s+(conftest|test_\w+)\s+import|import\s+(conftest|test_\w+))\b",
                  re.M)


def test_no_test_imports_a_conftest_or_a_test_module_by_bare_name():
    bad = [f"{p.relative_to(REPO)}: {m.group(0).strip()}"
           for p in sorted((REPO / "tests").rglob("*.py")) for m in _BAD.finditer(p.read_text())]
    assert not bad, bad


def test_one_call_collects_lm_and_traces_tests():
    """The order that failed: an lm test file first, a traces one second."""
    import importlib.util

    have_torch = importlib.util.find_spec("torch") is not None
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               JAX_PLATFORMS="cpu")
    lm = "tests/prada_jax/lm/test_lm_config_fields.py"
    traces = "tests/prada_jax/traces/test_prm.py"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "-p", "no:xdist", lm, traces],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    shown = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode in (0, 5) and "ERROR" not in proc.stdout, shown
    ids = proc.stdout.splitlines()
    if have_torch:   # without torch both files are skipped as a whole (importorskip)
        assert any(i.startswith(lm + "::") for i in ids), shown
        assert any(i.startswith(traces + "::") for i in ids), shown
