"""Every method's knob (issue 51 item 4): the knob API, θ's monotonicity, one compilation for a
grid, and the oracle screen wired into the evaluator as the DP plans it.

The oracle's env test is exact: with no outage and ample M and B, every cohort user that
finishes must end correct iff its problem has a reachable correct answer and must have spent
exactly the DP's minimum offloads (``prada_jax.traces.oracle``, checked by brute force in
tests/prada_jax/traces/test_trace_oracle.py); at budget 0 the oracle row equals All-SLM on every seed.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from evals import evaluate as ev
from evals import knobs
from evals.testing import crafted_traces, oracle_apply
from prada_jax.errors import BadInput
from prada_jax.rl.screen import critic_screen
from prada_jax.traces import oracle as oracle_lib
from prada_jax.traces.testing import random_traces


# ---- the knob API ---------------------------------------------------------------------------

def test_knob_specs_set_each_methods_knob_and_read_back():
    thetas = [0.1, -0.05, 0.0]
    rows = {m: knobs.knob_specs(m, thetas if m.startswith("prada") else None)
            for m in knobs.METHODS}
    assert [s.theta for s in rows["prada"]] == thetas
    assert all(s.screen == "critic" and s.scheduler == "threshold" for s in rows["prada"])
    assert [s.p_random for s in rows["random"]] == list(knobs.KNOBS["random"].grid)
    assert all(s.screen == "random" and s.scheduler == "fifo_greedy" for s in rows["random"])
    assert knobs.RSD_PAPER_THRESHOLD in [s.rsd_threshold for s in rows["rsd"]]
    assert all(s.screen == "always" and s.scheduler == "rsd" for s in rows["rsd"])
    assert [s.oracle_budget for s in rows["oracle"]] == [0, 1, 2, 3, 4, None]
    assert all(s.screen == "oracle" and s.scheduler == "offload_all" for s in rows["oracle"])
    for m, specs in rows.items():
        assert len({s.name for s in specs}) == len(specs), m     # distinct row labels
        want = thetas if m.startswith("prada") else list(knobs.KNOBS[m].grid)
        assert [knobs.knob_value(s) for s in specs] == want, m
    assert knobs.knob_specs("oracle", [float("inf")])[0].oracle_budget is None
    fifo = knobs.knob_specs("prada", [0.2], scheduler="fifo_greedy", lambda_s=0.3)[0]
    assert (fifo.scheduler, fifo.lambda_s, fifo.theta) == ("fifo_greedy", 0.3, 0.2)
    assert knobs.knob_value(ev.PolicySpec("RSD (online PRM)", "always", "rsd")) == 0.7
    assert knobs.knob_value(ev.PolicySpec("All-SLM", "never", "keep_local")) is None


@pytest.mark.parametrize("method,values,kw", [
    ("nope", [1], {}), ("prada", None, {}), ("prada", [float("nan")], {}),
    ("random", [1.5], {}), ("random", [-0.1], {}), ("rsd", [0.7], {"scheduler": "fifo_greedy"}),
    ("rsd", ["x"], {}), ("oracle", [-1], {}), ("oracle", [1.5], {})],
    ids=["method", "theta-grid", "theta-nan", "p>1", "p<0", "rsd-sched", "rsd-nan", "k<0",
         "k-frac"])
def test_knob_specs_refuse_bad_values(method, values, kw):
    with pytest.raises(BadInput):
        knobs.knob_specs(method, values, **kw)


def test_apply_spec_sets_the_rsd_threshold_leaf():
    params = edge.make_params(crafted_traces(), num_users=2)
    base = float(params.rsd_threshold)
    p = ev.apply_spec(params, knobs.knob_specs("rsd", [0.9])[0])
    assert float(p.rsd_threshold) == pytest.approx(0.9) and base == pytest.approx(0.7)
    p0 = ev.apply_spec(params, ev.PolicySpec("RSD", "always", "rsd"))
    assert float(p0.rsd_threshold) == pytest.approx(base)


# ---- θ: higher θ nominates fewer (a subset) -------------------------------------------------

def test_theta_monotone_on_fixed_states():
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(512, 6)), jnp.float32)
    params = edge.make_params(crafted_traces(), num_users=512)
    prev = None
    counts = []
    for theta in np.linspace(-5.0, 5.0, 21):
        screen, gain = ev._screen(oracle_apply, None, obs, jax.random.key(0),
                                  ev.screen_mode("critic"), 0.0, params, theta=theta)
        s = np.asarray(screen)
        np.testing.assert_array_equal(s, np.asarray(gain) > theta)
        if prev is not None:
            assert np.all(s <= prev) and s.sum() <= prev.sum()   # a subset of the last θ's
        prev = s
        counts.append(int(s.sum()))
    assert counts[0] == 512 and counts[-1] == 0 and len(set(counts)) > 8
    np.testing.assert_array_equal(critic_screen(jnp.asarray([-1.0, 0.0, 1.0])), [0, 0, 1])


def test_theta_grid_spans_the_target_shares_and_decreases():
    traces = random_traces(seed=2, problems=60, depth=6, p_terminal=0.1, p_expand=0.8)
    gains = np.random.default_rng(1).normal(size=traces.num_nodes)
    thetas, shares = knobs.theta_grid(traces, gains, shares=(0.05, 0.2, 0.5, 0.8))
    assert np.all(np.diff(thetas) < 0) and len(thetas) >= 3
    assert shares[0] < 0.15 and shares[-1] > 0.65
    for t, s in zip(thetas, shares):   # each predicted share is the walk's share at that θ
        w = oracle_lib.walk(traces, gains > t)
        assert s == pytest.approx(w["offloads"].sum() / w["steps"].sum())
    with pytest.raises(BadInput):
        knobs.theta_grid(traces, np.full(traces.num_nodes, np.nan))


# ---- through the evaluator ------------------------------------------------------------------

@pytest.fixture(scope="module")
def crafted_eval():
    params = edge.make_params(crafted_traces(), num_users=6, num_servers=6, bandwidth_hz=1e9,
                              arrival_rate_hz=8.0, snr_threshold_db=-np.inf)
    return ev.Evaluator(params, seeds=2, num_slots=80, warmup_slots=10, apply_fn=oracle_apply,
                        net_params=jnp.zeros(()), drain_slots=60)


def test_every_knob_grid_runs_in_one_compilation(crafted_eval):
    e = crafted_eval
    e.run(ev.PolicySpec("All-SLM", "never", "keep_local"))
    n0 = e.evaluate_fn._cache_size()
    specs = (knobs.knob_specs("prada", [2.0, 0.0, -2.0], scheduler="fifo_greedy")
             + knobs.knob_specs("random", [0.0, 1.0]) + knobs.knob_specs("rsd", [0.0, 1.0])
             + knobs.knob_specs("oracle", [0, None]))
    res = {s.name: e.run(s) for s in specs}
    assert e.evaluate_fn._cache_size() == n0
    nom = {k: v["nomination_rate"] for k, v in res.items()}
    # θ above every ΔQ (±1 here): nothing; below: everything; 0: the wrong drafts only.
    np.testing.assert_array_equal(nom["PRADA θ=+2"], 0.0)
    np.testing.assert_array_equal(nom["PRADA θ=-2"], 1.0)
    assert np.all((nom["PRADA θ=+0"] > 0) & (nom["PRADA θ=+0"] < 1))
    np.testing.assert_array_equal(nom["Random p=0"], 0.0)
    np.testing.assert_array_equal(nom["Random p=1"], 1.0)
    # RSD threshold 0: every draft kept (PRM ≥ 0); 1: every step to the LLM (PRM < 1 here).
    np.testing.assert_array_equal(res["RSD τ_PRM=0"]["offload_rate"], 0.0)
    np.testing.assert_array_equal(res["RSD τ_PRM=1"]["offload_rate"], 1.0)
    # The oracle offloads exactly the wrong drafts: every answer right, as the critic at θ = 0.
    m = res["Oracle k=∞"]
    np.testing.assert_allclose(m["accuracy"], 1.0 - m["blocked_rate"] - m["timeout_rate"])
    np.testing.assert_array_equal(m["offload_rate"], res["PRADA θ=+0"]["offload_rate"])


def test_oracle_at_budget_zero_is_all_slm(crafted_eval):
    a = crafted_eval.run(ev.PolicySpec("All-SLM", "never", "keep_local"))
    b = crafted_eval.run(knobs.knob_specs("oracle", [0])[0])
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_oracle_screen_reads_the_budget_column():
    tab = jnp.asarray(np.array([[0, 0, 1], [0, 1, 1]], np.int8))
    state = edge.EnvState(**{f: None for f in edge.EnvState.__dataclass_fields__}).replace(
        node=jnp.asarray([0, 0, 1, 1, 1]), offloads=jnp.asarray([0, 1, 0, 1, 5]))
    got = ev.oracle_screen(ev.OracleInputs(tab, jnp.asarray(2)), state)
    # budget left 2 − offloads: 2, 1, 2, 1, clipped 0
    np.testing.assert_array_equal(got, [1, 0, 1, 1, 0])
    big = ev.oracle_screen(ev.OracleInputs(tab, jnp.asarray(99)), state)
    np.testing.assert_array_equal(big, [1, 1, 1, 1, 1])   # 99 − 5 = 94 → column K = 2


def test_oracle_in_the_env_ends_as_the_dp_plans():
    """Manual rollout with the evaluator's screen: each finished user ends correct iff its
    problem has a reachable correct answer, with exactly the DP's minimum offloads."""
    traces = random_traces(seed=5, problems=12, depth=5, p_terminal=0.15, p_expand=0.6)
    rng = np.random.default_rng(5)
    keep = np.stack([rng.uniform(size=traces.num_nodes) < 0.3,
                     rng.uniform(size=traces.num_nodes) < 0.8], 1)
    traces = traces.replace(correct=(traces.correct.astype(bool) & keep).astype(np.uint8))
    tables = oracle_lib.oracle_tables(traces)
    min_off = oracle_lib.problem_min_offloads(traces, tables)
    assert {0, 1}.issubset(set(min_off.tolist())) and -1 in min_off
    u = 6
    params = edge.make_params(traces, num_users=u, num_servers=u, bandwidth_hz=1e9,
                              arrival_rate_hz=6.0, snr_threshold_db=-np.inf)
    params = ev.apply_spec(params, knobs.knob_specs("oracle", [None])[0])
    orc = ev.OracleInputs(jnp.asarray(tables.nominate), jnp.asarray(tables.max_budget))

    @jax.jit
    def slot(key, obs, state):
        act_key, env_key = jax.random.split(key)
        screen, gain = ev._screen(ev._zero_apply, None, obs, act_key, ev.screen_mode("oracle"),
                                  0.0, params, state, 0.0, orc)
        return edge.step(env_key, state, edge.EdgeAction(screen, gain), params)

    obs, state = edge.reset(jax.random.key(1), params.replace(initial_users=jnp.zeros_like(params.initial_users)))
    problem_of = np.full(u, -1)
    prob = np.asarray(traces.problem)
    checked = 0
    for t in range(400):
        prev_arrival = np.asarray(state.arrival_slot)
        obs, state, _, done, info = slot(jax.random.fold_in(jax.random.key(2), t), obs, state)
        done = np.asarray(done)
        for i in np.flatnonzero(done):
            p = problem_of[i]
            assert bool(info["user_correct"][i]) == (min_off[p] >= 0), (t, i, p)
            assert int(info["user_offloads"][i]) == max(int(min_off[p]), 0), (t, i, p)
            checked += 1
        new = np.asarray(state.arrival_slot) != prev_arrival
        problem_of[new] = prob[np.asarray(state.node)[new]]
    assert checked > 40


def test_actor_margin_knob_is_the_greedy_action_at_zero_and_monotone():
    rng = np.random.default_rng(1)
    obs = jnp.asarray(rng.normal(size=(256, 6)), jnp.float32)
    params = edge.make_params(crafted_traces(), num_users=256)
    key = jax.random.key(0)
    greedy, _ = ev._screen(oracle_apply, None, obs, key, ev.screen_mode("policy"), 0.0, params)
    at0, _ = ev._screen(oracle_apply, None, obs, key, ev.screen_mode("margin"), 0.0, params,
                        theta=0.0)
    np.testing.assert_array_equal(at0, greedy)
    prev = None
    for theta in np.linspace(-10.0, 10.0, 21):
        s = np.asarray(ev._screen(oracle_apply, None, obs, key, ev.screen_mode("margin"), 0.0,
                                  params, theta=theta)[0])
        assert prev is None or np.all(s <= prev)
        prev = s
    assert prev.sum() == 0
    spec = knobs.knob_specs("prada_actor", [0.5])[0]
    assert (spec.screen, spec.theta, knobs.knob_value(spec)) == ("margin", 0.5, 0.5)
    # oracle_apply: logits (−f, f), ΔQ f: margin 2f, so the two scores order nodes alike
    sc = {m: knobs.node_scores(oracle_apply, None, params, m) for m in ("prada", "prada_actor")}
    np.testing.assert_allclose(sc["prada_actor"], 2 * sc["prada"])
    with pytest.raises(BadInput):
        knobs.node_scores(oracle_apply, None, params, "random")
