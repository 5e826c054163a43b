"""Issue 25 speed work: the rollout's pre-drawn action noise, the ``ppo.diagnostics`` switch,
the single-seed chunk without vmap, and why the env's ``sparse_decisions`` declaration is
enough (no decision is ever dropped silently)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import stage1
from prada_jax.configs import ppo as ppo_configs
from prada_jax.rl import learner, toy_env, trainer


def _toy_config(**ppo):
    c = ppo_configs.get_config("toy")
    for k, v in ppo.items():
        c.ppo[k] = v
    return c


def _one_chunk(config, env_and_params=None, num_seeds=1):
    config.num_seeds = num_seeds
    setup = (stage1.build_setup(config) if env_and_params is None
             else trainer.build_setup(config, env_and_params))
    states, m = trainer.make_jitted_chunk(setup)(setup.init_states(config), setup.env_params)
    return setup, states, {k: np.asarray(v) for k, v in m.items()}


def test_sample_action_gumbel_draws_the_softmax_distribution():
    """argmax(logits + Gumbel noise) against NumPy's softmax: frequencies of 40 000 draws per
    row within 5 binomial standard deviations; log-probabilities equal NumPy's log-softmax."""
    logits = np.array([[0.0, 1.0, -1.0, 2.0], [3.0, 3.0, 0.0, -2.0], [0.5, 0.0, 0.0, 0.0]],
                      np.float32)
    n = 40_000
    noise = jax.random.gumbel(jax.random.key(7), (n,) + logits.shape)
    action, logp = jax.jit(learner.sample_action_gumbel)(noise, jnp.asarray(logits)[None])
    action, logp = np.asarray(action), np.asarray(logp)
    z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    log_sm = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    p = np.exp(log_sm)
    for row in range(logits.shape[0]):
        freq = np.bincount(action[:, row], minlength=4) / n
        sd = np.sqrt(p[row] * (1 - p[row]) / n)
        assert np.all(np.abs(freq - p[row]) <= 5 * sd + 1e-12), (row, freq, p[row])
        np.testing.assert_allclose(logp[:, row], log_sm[row, action[:, row]], rtol=1e-5,
                                   atol=1e-6)
    assert action.dtype == np.int32


@pytest.mark.slow  # ≈ 16 s; default: the single-seed and declaration tests of this file
def test_diagnostics_off_trains_bit_identically(fast_compile):
    """``ppo.diagnostics = False`` leaves approx_kl, clip_frac, explained_variance,
    nominate_rate and mean_gain out and changes nothing else: same parameters, optimiser and
    env state bit for bit, same remaining metrics; the host loop's scalars still work."""
    _, on, m_on = _one_chunk(_toy_config())
    setup, off, m_off = _one_chunk(_toy_config(diagnostics=False))
    assert setup.settings.diagnostics is False
    dropped = {"approx_kl", "clip_frac", "explained_variance", "nominate_rate", "mean_gain"}
    assert set(m_on) - set(m_off) == dropped and set(m_off) <= set(m_on)
    for a, b in zip(jax.tree.leaves(on), jax.tree.leaves(off)):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for k in m_off:
        np.testing.assert_array_equal(m_on[k], m_off[k], err_msg=k)
    assert np.all(np.isfinite(m_on["approx_kl"]))          # they were computed with it on
    sc = trainer._chunk_scalars(m_off, 0, 1.0, 64)
    assert "train/approx_kl" not in sc and "train/policy_loss" in sc


def test_single_seed_chunk_equals_the_vmapped_chunk(fast_compile):
    """With one seed ``make_jitted_chunk`` runs the chunk without the size-1 vmap; the result
    equals the vmapped program's, and seed 0 of a two-seed run (vmapped) matches it too."""
    cfg = _toy_config()
    setup, s1, m1 = _one_chunk(cfg)
    chunk = learner.make_train_chunk(setup.settings, setup.env, setup.apply_fn, setup.tx,
                                     setup.action_fn)
    vm, mv = jax.jit(jax.vmap(chunk, in_axes=(0, None)))(setup.init_states(cfg),
                                                         setup.env_params)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(vm.params)):
        assert a.shape == b.shape and a.shape[0] == 1
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m1["total_loss"], np.asarray(mv["total_loss"]), rtol=1e-5)
    _, s2, m2 = _one_chunk(_toy_config(), num_seeds=2)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(np.asarray(a)[0], np.asarray(b)[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(m1["episodes"][0], m2["episodes"][0])


class _DeclaredSparse:
    """The toy env (decisions in ~70% of its user slots) wrongly declaring sparse decisions."""

    sparse_decisions = True

    def __init__(self, env):
        self.env = env
        self.name = "DeclaredSparseToy"

    def reset(self, key, params):
        return self.env.reset(key, params)

    def step(self, key, state, action, params):
        return self.env.step(key, state, action, params)

    def action_spec(self, params):
        return self.env.action_spec(params)


def test_the_declaration_is_enough_no_decision_is_dropped(tmp_path, fast_compile):
    """An env that declares nothing trains on every sample whatever its decision rate (the
    non-decision samples are masked out of the loss), so no decision is lost; an env that
    declares sparse decisions but decides more often than ``ppo.decision_capacity`` stops
    after its first chunk with one line naming the fields (exit 2)."""
    cfg = _toy_config()                               # decision_only None: the env decides
    env, params = toy_env.make(num_users=4)
    setup, _, m = _one_chunk(cfg, (env, params))
    batch = cfg.ppo.num_envs * cfg.ppo.rollout_len * cfg.env.num_users
    assert setup.settings.decision_only is False
    assert 0 < m["decisions"].max() < batch            # sparse, yet undeclared ...
    np.testing.assert_array_equal(m["decision_overflow"], 0)   # ... and nothing dropped

    declared = _toy_config(decision_capacity=0.25)
    with pytest.raises(trainer.config_utils.ConfigError) as e:
        trainer.train_and_evaluate(declared, str(tmp_path / "run"),
                                   env_and_params=(_DeclaredSparse(env), params), max_chunks=1)
    msg = str(e.value)
    assert "ppo.decision_capacity" in msg and "ppo.decision_only=False" in msg
    assert "\n" not in msg
    from prada_jax.errors import BadInput
    assert isinstance(e.value, BadInput)               # the CLI maps it to exit 2


def test_diagnostics_may_change_on_resume_and_old_runs_lack_it(tmp_path):
    """``ppo.diagnostics`` only changes what is logged, so a stored run may resume with it
    switched, and a config.json written before the field existed still resumes."""
    import json

    from prada_jax import config_utils, run_state

    cfg = _toy_config()
    stored = json.loads(config_utils.config_to_json(cfg))
    del stored["ppo"]["diagnostics"]                   # a run stored before the field
    (tmp_path / "config.json").write_text(json.dumps(stored))
    off = _toy_config(diagnostics=False)
    check = run_state.check_resume(off, tmp_path, trainer.observational_fields(off))
    assert list(check.changed) == ["ppo.diagnostics"]
    other = _toy_config(diagnostics=False, lr=1e-2)    # a computational field still refused
    with pytest.raises(run_state.ConfigMismatch):
        run_state.check_resume(other, tmp_path, trainer.observational_fields(other))


def test_executed_hlo_ops_multiplies_loop_bodies_by_their_trip_counts():
    """The benchmark's op count: one more iteration of a scan adds the same number of ops
    every time (linear in the trip count), and an outer loop of 3 triples an inner loop's."""
    from benchmarks.ppo_gymnax import executed_hlo_ops

    def body(c, _):
        return jnp.tanh(c @ c) + jnp.sin(c), None

    def ops(n, outer=1):
        def f(x):
            def inner(c, _):
                return jax.lax.scan(body, c, None, length=n)[0], None
            return jax.lax.scan(inner, x, None, length=outer)[0]
        return executed_hlo_ops(jax.jit(f).lower(jnp.ones((3, 3))).compile().as_text())

    d1, d2 = ops(12) - ops(6), ops(18) - ops(12)
    assert d1 == d2 > 0 and d1 % 6 == 0            # 6 more iterations, the same body each
    assert ops(12, outer=3) - ops(6, outer=3) == 3 * d1


def test_ratio_ci_is_the_t_interval_of_the_log_ratios():
    """The benchmark's geometric mean and interval against a direct computation: exp of the
    mean log ratio ± t(0.975, n−1)·sd/√n (scipy's t quantile for n = 5: 2.776)."""
    import math

    from benchmarks.ppo_gymnax import ratio_ci

    ratios = [0.9, 1.1, 1.25, 0.97, 1.02]
    logs = [math.log(r) for r in ratios]
    m = sum(logs) / 5
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 4)
    half = 2.7764451051977987 * sd / math.sqrt(5)
    g, lo, hi = ratio_ci(ratios)
    assert g == pytest.approx(math.exp(m), rel=1e-9)
    assert lo == pytest.approx(math.exp(m - half), rel=1e-6)
    assert hi == pytest.approx(math.exp(m + half), rel=1e-6)
    assert lo < 1.0 < hi                         # these ratios are parity, not a speed-up
