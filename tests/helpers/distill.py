"""Shared pieces of the distillation tests: the tiny cache (a module-scoped ``cache`` fixture;
import it into the test module), a ``:smoke`` config on it, and a run's TensorBoard scalars.
Import after ``pytest.importorskip("torch")`` (the cache's teacher is a PyTorch model)."""
import pytest

from prada_jax import config_utils as cu


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A tiny cache: a pool of solved episodes, a random tiny PyTorch teacher and its top-k
    logits (``prada_jax.distill.task.teacher.tiny_cache``)."""
    from prada_jax.distill.task.teacher import tiny_cache
    return tiny_cache(tmp_path_factory.mktemp("cache"))


def smoke_config(cache, *variants, **overrides):
    """``configs/distill.py:smoke[,variants]`` reading ``cache``; ``overrides`` are dotted
    fields (``**{"train.steps": 6}``) set last."""
    from prada_jax.configs.distill import get_config
    c = get_config(",".join(("smoke",) + variants))
    c.data.cache = str(cache)
    for k, v in overrides.items():
        cu.set_field(c, k, v)
    return c


def tb_scalars(tb_dir):
    """``{tag: [(step, value), ...]}``: every scalar point under ``tb_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    ea.Reload()
    return {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
