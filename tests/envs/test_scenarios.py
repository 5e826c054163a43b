"""Scenario schedules: presets, validation, invariants, NumPy equivalence, no retrace."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge, scenarios
from envs.testing import rollout
from prada_jax.errors import BadInput
from prada_jax.traces.testing import random_traces
from tests.helpers.edge_pair import jax_rollout, replay_on_numpy

S, T, U = 3, 240, 8
# Schedule length of the rollouts here: one length (one compiled rollout) for the presets and
# the mixed schedule, shorter than T so every run wraps around.
L = 60
TRACES = random_traces(seed=3, problems=10, depth=5, feature_dim=4)
BASE = dict(num_servers=4, bandwidth_hz=8e6, arrival_rate_hz=6.0, max_wait_slots=8)
FULL_DEFAULTS = dict(num_users=U, tau_s=0.05, beta=0.2, lambda_s=0.0, mu=0.0, num_servers=4,
                     bandwidth_hz=20e6, arrival_rate_hz=4.0, initial_users=U, default_gain=0.05,
                     max_wait_slots=20, rsd_threshold=0.7, reward_mode="coarse",
                     server_kv_cache=False, downlink=True, ctx_scale=1e-3)


def _actions(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 2, (S, T, U)).astype(np.int32),
            rng.normal(0.05, 0.1, (S, T, U)).astype(np.float32))


def _mixed(length=L):
    """All four factors move, with a wrap-around inside T slots."""
    t = np.arange(length)
    return scenarios.Scenario(arrival=np.where(t % 20 < 5, 5.0, 0.5),
                              bandwidth=np.where(t < 30, 1.0, 0.25),
                              channel_db=np.where(t % 15 < 7, -8.0, 3.0),
                              servers=np.where((t >= 20) & (t < 45), 0.5, 1.0))


def test_presets_shapes_and_stated_properties():
    n = scenarios.DEFAULT_LENGTH
    ps = {k: scenarios.preset(k) for k in scenarios.PRESETS}
    assert {"nominal", "heavy", "burst", "diurnal", "degraded"} <= set(ps)
    for p in ps.values():
        assert all(np.shape(a) == (n,) for a in p)
    assert np.all(ps["nominal"].arrival == 1) and np.all(ps["nominal"].servers == 1)
    b = ps["burst"].arrival
    assert b.max() >= 3 * b.mean()  # bursts several times the mean rate
    d = ps["diurnal"].arrival
    assert d.min() < 0.5 and d.max() > 2.5 and np.argmax(d) < np.argmin(d)  # one slow cycle
    g = ps["degraded"]
    assert g.bandwidth.min() < 0.5 and g.servers.min() < 1 and g.bandwidth[0] == 1


@pytest.mark.parametrize("field,value,needle", [
    ("arrival", -1.0, "scenario.arrival"), ("bandwidth", 0.0, "scenario.bandwidth"),
    ("servers", 1.5, "scenario.servers"), ("channel_db", np.nan, "scenario.channel_db")])
def test_bad_values_name_the_field(field, value, needle):
    scn = scenarios.static(10)
    arr = getattr(scn, field).copy()
    arr[3] = value
    with pytest.raises(BadInput, match=needle):
        edge.make_params(TRACES, num_users=U, scenario=scn._replace(**{field: arr}))


def test_wrong_length_names_the_field():
    scn = scenarios.static(10)._replace(servers=np.ones(9, np.float32))
    with pytest.raises(scenarios.ScenarioError, match="scenario.servers has length 9"):
        scenarios.validate(scn)
    params = edge.make_params(TRACES, num_users=U, scenario=scenarios.static(10))
    with pytest.raises(BadInput, match="scenario.arrival"):
        edge.with_scenario(params, scenarios.static(10)._replace(arrival=np.ones((2, 5))))
    with pytest.raises(BadInput, match="--scenarios"):
        scenarios.parse_names("nominal,rush")


_slot_conditions = jax.jit(edge.slot_conditions)


def test_slot_conditions_follow_the_schedule_modulo_length():
    scn = _mixed()
    p = edge.make_params(TRACES, num_users=U, scenario=scn, **BASE)
    for t in (0, 5, 25, 59, 60, 85, 239):
        c = jax.device_get(_slot_conditions(p, t))
        i = t % 60
        assert c["arrival_rate_hz"] == pytest.approx(6.0 * scn.arrival[i])
        assert c["bandwidth_hz"] == pytest.approx(8e6 * scn.bandwidth[i])
        assert int(c["num_servers"]) == (2 if 20 <= i < 45 else 4)
        assert c["channel_gain"] == pytest.approx(10 ** (scn.channel_db[i] / 10), rel=1e-5)


def _invariants(info, params):
    inuse = np.asarray(info["server_in_use"])
    m_t = np.asarray(info["num_servers_t"])
    bw = np.asarray(info["bandwidth_in_use_hz"])
    b_t = np.asarray(info["bandwidth_t_hz"])
    admitted = (np.asarray(info["decision"]) == 2).sum(-1)
    prev_use = np.concatenate([np.zeros_like(inuse[:, :1]), inuse[:, :-1]], 1)
    prev_bw = np.concatenate([np.zeros_like(bw[:, :1]), bw[:, :-1]], 1)
    # New jobs only within M_t / B_t; a running job may outlive a drop (no preemption).
    assert np.all(inuse[admitted > 0] <= m_t[admitted > 0])
    assert np.all(bw[admitted > 0] <= b_t[admitted > 0] * (1 + 1e-5))
    assert np.all(inuse <= np.maximum(m_t, prev_use))
    assert np.all(bw <= np.maximum(b_t, prev_bw) * (1 + 1e-5))
    arrived, fin = np.asarray(info["arrived"]), np.asarray(info["finished"])
    blocked, flight = np.asarray(info["blocked_total"]), np.asarray(info["in_flight"])
    np.testing.assert_array_equal(arrived, fin + blocked + flight)  # no user lost


@pytest.mark.parametrize("sched", ["threshold", "fifo_greedy", "offload_all"])
def test_invariants_under_every_preset_one_compile(sched):
    screens, gains = _actions(7)
    keys = jax.random.split(jax.random.key(7), S)
    base = edge.make_params(TRACES, num_users=U, scheduler=sched,
                            scenario=scenarios.preset("nominal", L), **BASE)
    compiles = []
    arrivals = {}
    for name in scenarios.PRESETS:
        p = edge.with_scenario(base, scenarios.preset(name, L))
        before = rollout._cache_size()
        *_, (_, _, _, info) = jax.device_get(rollout(keys, p, screens, gains))
        compiles.append(rollout._cache_size() - before)
        _invariants(info, p)
        arrivals[name] = np.asarray(info["arrivals"]).mean()
        if name == "degraded":  # M_t drops to 2 for the middle of the schedule
            assert set(np.unique(info["num_servers_t"])) == {2, 4}
    assert sum(compiles[1:]) == 0  # every preset after the first reuses the compiled rollout
    assert arrivals["heavy"] > 1.8 * arrivals["nominal"]


def test_no_retrace_across_scenarios_chex():
    params = edge.make_params(TRACES, num_users=U, scenario=scenarios.preset("nominal", 50))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(key, p):
        obs, st = edge.reset(key, p)

        def body(st, k):
            _, st, r, _, info = edge.step(k, st, jnp.ones((U,), jnp.int32), p)
            return st, info["arrivals"]
        return jax.lax.scan(body, st, jax.random.split(key, 50))[1].sum()

    totals = {}
    for name in scenarios.PRESETS:
        totals[name] = int(run(jax.random.key(0), edge.with_scenario(
            params, scenarios.preset(name, 50))))
    assert totals["heavy"] > totals["nominal"]
    chex.clear_trace_counter()


@pytest.mark.parametrize("sched", ["threshold", "fifo_greedy", "offload_all"])
def test_dynamic_scenario_matches_numpy_reference(sched):
    scn = _mixed()
    cfg = dict(BASE, lambda_s=0.005, reward_mode="true")
    params = edge.make_params(TRACES, num_users=U, scheduler=sched, scenario=scn, **cfg)
    screens, gains = _actions(11)
    out = jax_rollout(11, params, screens, gains)
    finished, _, infos = replay_on_numpy(
        TRACES, dict(FULL_DEFAULTS, scheduler=sched, scenario=scn, **cfg), params, screens,
        gains, out, label=sched, check_obs=True)
    m_seen = {int(i["num_servers_t"]) for i in infos}
    assert finished >= 20 and m_seen == {2, 4}


def test_binding_presets_state_their_env_and_outage_at_m_ge_2():
    """outage_burst: M_t drops from 4 to 1 (8 → 2, 2 → 1) for 120 of every 400 slots, and a
    4× arrival burst starts with each outage; the other binding presets act through their env
    scalars (scenarios.PRESET_ENV)."""
    scn = scenarios.preset("outage_burst", 800)
    t = np.arange(800)
    out = (t % 400) < 120
    for m, low in ((4, 1), (8, 2), (2, 1)):
        p = edge.make_params(TRACES, num_users=U, scenario=scn, num_servers=m)
        for i in (0, 119, 120, 399, 400, 519, 520):
            c = jax.device_get(edge.slot_conditions(p, i))
            assert int(c["num_servers"]) == (low if out[i] else m), (m, i)
    assert np.all(scn.arrival[(t % 400) == 0] == 4.0) and scn.arrival.min() == pytest.approx(0.6)
    assert scenarios.preset_env("outage_burst") == {"num_servers": 4}
    assert scenarios.preset_env("bandwidth_bound") == {"num_servers": 16, "bandwidth_hz": 3e6}
    assert scenarios.preset_env("nominal") == {}
    with pytest.raises(scenarios.ScenarioError, match="unknown scenario"):
        scenarios.preset_env("rush")


def test_binding_variants_share_their_originals_schedule_at_a_higher_load():
    """The validation-chosen variants (studies/stage2_verdict/registration.md): the original preset's
    per-slot factors, with more users and a higher arrival rate (and M = 2 for the outage);
    an env built from them has those U, λ, M and B."""
    for name, base in (("bandwidth_bound_dense", "bandwidth_bound"),
                       ("outage_burst_m2", "outage_burst")):
        a, b = scenarios.preset(name, 800), scenarios.preset(base, 800)
        for f in scenarios.FIELDS:
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    dense = scenarios.preset_env("bandwidth_bound_dense")
    assert dense == {"num_servers": 16, "bandwidth_hz": 3e6, "arrival_rate_hz": 48.0,
                     "num_users": 128}
    m2 = scenarios.preset_env("outage_burst_m2")
    assert m2 == {"num_servers": 2, "arrival_rate_hz": 24.0, "num_users": 64}
    for env in (dense, m2):
        p = edge.make_params(TRACES, scenario=scenarios.preset("nominal", 10), **env)
        assert int(p.num_users) == env["num_users"] and int(p.num_servers) == env["num_servers"]
        assert float(p.arrival_rate_hz) == pytest.approx(env["arrival_rate_hz"])
    # M = 2 in an outage of the m2 variant: M_t = 1 (⌊2 · 0.25 + ½⌋ = 1, at least 1)
    p = edge.make_params(TRACES, num_users=U, scenario=scenarios.preset("outage_burst_m2", 800),
                         num_servers=2)
    assert int(jax.device_get(edge.slot_conditions(p, 0))["num_servers"]) == 1
    assert int(jax.device_get(edge.slot_conditions(p, 120))["num_servers"]) == 2


def test_slow_server_scales_the_server_compute_time():
    """server_speed 0.1 → the server's peak FLOP/s × 0.1, so its compute delay (latency model,
    compute-bound) is 10× the default's; an invalid factor names the field."""
    from prada_jax import latency

    kw = scenarios.latency_overrides(scenarios.preset_env("slow_server"))
    d = latency.default_latency_params()
    assert kw["server_peak_flops"] == pytest.approx(0.1 * d.server_peak_flops)
    slow = latency.default_latency_params(**kw)
    a = float(latency.server_delay_s(d, 512, 0, 64))
    b = float(latency.server_delay_s(slow, 512, 0, 64))
    assert b == pytest.approx(10 * a, rel=1e-3)
    assert scenarios.latency_overrides({}) == {}
    with pytest.raises(scenarios.ScenarioError, match="server_speed"):
        scenarios.latency_overrides({"server_speed": 0.0})


def test_contended_presets_of_the_roofline_clock():
    """issue 33 item 5: ``contended`` is the nominal schedule at M = 4 and load √2 per server
    slot; ``outage_burst_m4`` is outage_burst's schedule at M = 4 and 2 users/s (M_t = 1 in an
    outage); an env built from them has those M and λ."""
    import math
    np.testing.assert_array_equal(scenarios.preset("contended", 50).arrival, np.ones(50))
    c = scenarios.preset_env("contended")
    assert c == {"num_servers": 4, "arrival_rate_hz": pytest.approx(4 * math.sqrt(2))}
    assert c["arrival_rate_hz"] / c["num_servers"] == pytest.approx(2 ** 0.5)
    a, b = scenarios.preset("outage_burst_m4", 800), scenarios.preset("outage_burst", 800)
    for f in scenarios.FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    o = scenarios.preset_env("outage_burst_m4")
    assert o == {"num_servers": 4, "arrival_rate_hz": 2.0}
    p = edge.make_params(TRACES, num_users=U, scenario=a, **o)
    assert float(p.arrival_rate_hz) == pytest.approx(2.0) and int(p.num_servers) == 4
    assert int(jax.device_get(edge.slot_conditions(p, 0))["num_servers"]) == 1
    assert int(jax.device_get(edge.slot_conditions(p, 120))["num_servers"]) == 4
    assert "contended" in scenarios.parse_names("contended,outage_burst_m4")
