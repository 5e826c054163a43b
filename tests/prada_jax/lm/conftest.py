"""The ``hf_dirs`` fixture: tiny PyTorch Qwen2/Llama reference models saved as Hugging Face
folders (offline); the builders live in ``tests.helpers.hf_lm``."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.helpers.hf_lm import CASES, build_torch_model  # noqa: E402


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory):
    """Case name → (folder with save_pretrained output, torch model), built lazily once."""
    cache = {}

    def get(name):
        if name not in cache:
            model = build_torch_model(**CASES[name])
            d = tmp_path_factory.mktemp(name)
            model.save_pretrained(d)
            cache[name] = (str(d), model)
        return cache[name]

    return get
