"""κ^t sampler: frequencies (chi-square), verbatim prefixes, static shapes, bad κ."""
import numpy as np
import pytest
from scipy import stats

from prada_jax.distill import pool as P
from prada_jax.distill.sampler import TurnSampler, pair_weights, turn_weights


def _pool(turn_counts, seed=0):
    rng = np.random.default_rng(seed)
    trajs, spans = [], []
    for k in turn_counts:
        toks, sp = list(rng.integers(2, 20, size=3)), []
        for _ in range(k):
            a = int(rng.integers(1, 4))
            sp.append((len(toks), len(toks) + a))
            toks += list(rng.integers(2, 20, size=a)) + list(rng.integers(2, 20, size=2))
        trajs.append(toks)
        spans.append(sp)
    arr = P.build_arrays(trajs, spans, [1] * len(trajs))
    P.validate_arrays(arr, 20)
    return P.make_pool(arr, {})


@pytest.mark.parametrize("kappa,schedule", [(0.6, "kappa"), (1.0, "kappa"), (0.5, "late")],
                         ids=["k0.6", "uniform", "late0.5"])
def test_turn_frequencies_chi_square(kappa, schedule):
    counts = [5, 5, 3, 1, 4]
    pool = _pool(counts)
    s = TurnSampler(pool, kappa=kappa, schedule=schedule)
    n = 100_000
    pairs = s.draw(np.random.default_rng(0), n)
    observed = np.bincount(pairs, minlength=sum(counts))
    # independent expectation: trajectory uniform, then t within it (plain loops)
    expected = []
    for k in counts:
        w = [kappa ** (t if schedule == "kappa" else k - 1 - t) for t in range(k)]
        expected += [n / len(counts) * x / sum(w) for x in w]
    chi = stats.chisquare(observed, np.array(expected))
    assert chi.pvalue > 1e-3, chi
    # per-turn-index histogram on the 5-turn trajectories alone: ∝ κ^t
    t_of = s.pair_turn[pairs][np.isin(s.pair_traj[pairs], [0, 1])]
    obs_t = np.bincount(t_of, minlength=5)
    w = np.array([kappa ** (t if schedule == "kappa" else 4 - t) for t in range(5)])
    assert stats.chisquare(obs_t, w / w.sum() * obs_t.sum()).pvalue > 1e-3


def test_rows_mode_matches_fanned_out_rows():
    counts = [4, 2]
    pool = _pool(counts)
    w = pair_weights(pool, 0.6, per_trajectory=False)
    ref = np.array([0.6 ** t for k in counts for t in range(k)])
    np.testing.assert_allclose(w, ref / ref.sum(), rtol=1e-12)


def test_batch_replays_prefix_verbatim():
    pool = _pool([3, 2, 4], seed=1)
    s = TurnSampler(pool, kappa=0.6)
    b = s.batch(np.arange(pool.num_turns))
    assert b.prompt.shape == (pool.num_turns, s.P) and b.action.shape == (pool.num_turns, s.A)
    for k in range(pool.num_turns):
        i = s.pair_traj[k]
        st, en = pool.turn_starts[k], pool.turn_ends[k]
        prefix = pool.tokens[pool.traj_offsets[i]:st]
        np.testing.assert_array_equal(b.prompt[k][b.prompt_mask[k] == 1], prefix)
        np.testing.assert_array_equal(b.action[k][b.action_mask[k] == 1], pool.tokens[st:en])
        assert (b.prompt_mask[k][: s.P - len(prefix)] == 0).all()  # left padded
        assert b.turn[k] == k - pool.turn_offsets[i]
    # the same static shapes for any batch
    b2 = s.sample(np.random.default_rng(0), pool.num_turns)
    assert b2.prompt.shape == b.prompt.shape and b2.action.shape == b.action.shape


@pytest.mark.parametrize("kappa", [0.0, -0.1, 1.5, float("nan")])
def test_bad_kappa(kappa):
    with pytest.raises(ValueError, match=r"kappa must lie in \(0, 1\]"):
        TurnSampler(_pool([2]), kappa=kappa)
    with pytest.raises(ValueError, match="kappa"):
        turn_weights(3, kappa)


def test_pool_without_agent_turns_is_refused():
    pool = _pool([2, 1])
    bad = pool.replace(turn_offsets=np.array([0, 2, 2], np.int64))
    with pytest.raises(ValueError, match="trajectory 1 .*no agent turns"):
        TurnSampler(bad)
