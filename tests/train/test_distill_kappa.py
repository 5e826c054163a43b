"""The distillation trainer honours ``config.sampler.kappa``: trained at κ = 0.3 (not the
default 0.6), the histogram of the turns it supervised matches p(t) ∝ κ^t within each
trajectory (a chi-square test against the closed form over the pool's turn counts), and is
far from what κ = 0.6 would give."""
import numpy as np
import pytest

pytest.importorskip("torch")
from scipy import stats  # noqa: E402

from prada_jax import config_utils as cu  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from prada_jax.distill.task.teacher import tiny_cache
    return tiny_cache(tmp_path_factory.mktemp("cache"))


def _expected_turn_probs(turns_per_traj, kappa, num_turns):
    """Closed form: each trajectory equally likely, turn t of a K-turn one ∝ κ^t."""
    p = np.zeros(num_turns)
    for k in turns_per_traj:
        w = np.array([kappa ** t for t in range(k)], np.float64)
        p[:k] += w / w.sum()
    return p / len(turns_per_traj)


def test_trainer_samples_turns_with_the_configured_kappa(cache, tmp_path):
    from prada_jax.configs.distill import get_config

    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill.trainer import train_and_evaluate
    c = get_config("smoke")
    c.data.cache = str(cache)
    # 640 sampled turns; the :smoke batch size (8), so the compiled step is the one the other
    # :smoke runs use (the session's compilation cache)
    for k, v in {"sampler.kappa": 0.3, "train.steps": 80, "log.every": 40,
                 "log.ckpt_every": 80, "sampler.refresh_every": 80,
                 "eval.n_problems": 0}.items():
        cu.set_field(c, k, v)
    assert c.train.batch_size == 8
    res = train_and_evaluate(c, tmp_path / "run")
    hist = np.asarray(res["turn_histogram"], np.float64)
    assert hist.sum() == 80 * 8
    counts = np.diff(np.asarray(pool_lib.load_pool(cache / "pool").turn_offsets))
    assert counts.max() >= 3   # the pool has trajectories with several turns
    n = hist.sum()
    for kappa, should_fit in ((0.3, True), (0.6, False), (1.0, False)):
        exp = _expected_turn_probs(counts, kappa, len(hist)) * n
        p = stats.chisquare(hist, exp).pvalue
        if should_fit:
            assert p > 1e-3, (kappa, hist, exp)
        else:
            assert p < 1e-6, (kappa, hist, exp)
