"""Clairvoyant MILP bound: exact on tiny instances (plain-Python enumeration), serves all at
arrival with ample capacity, and dominates a causal greedy rule on the same stream."""
import itertools

import numpy as np
import pytest

pytest.importorskip("scipy")

from prada_jax.errors import BadInput  # noqa: E402
from prada_jax.sched.clairvoyant import (clairvoyant_bound, greedy_online, is_feasible,  # noqa: E402
                                         make_stream, plan_value, synthetic_stream)


def brute_force(stream, wait_cost, window):
    """Best feasible plan by trying every (local or start slot) choice per request; plain
    Python capacity check written separately from the library's."""
    t_len = len(stream.units)
    choices = []
    for a in stream.arrival:
        choices.append([-1] + list(range(int(a), min(int(a) + window, t_len))))
    best = 0.0
    for plan in itertools.product(*choices):
        units = [0] * t_len
        bw = [0.0] * t_len
        val = 0.0
        for i, s in enumerate(plan):
            if s < 0:
                continue
            val += float(stream.value[i]) - wait_cost * (s - int(stream.arrival[i]))
            for t in range(s, min(t_len, s + int(stream.service[i]))):
                units[t] += 1
                bw[t] += float(stream.bw[i])
        if all(units[t] <= stream.units[t] and bw[t] <= stream.bandwidth[t] + 1e-9
               for t in range(t_len)):
            best = max(best, val)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_milp_equals_enumeration_on_tiny_instances(seed):
    rng = np.random.default_rng(seed)
    n, t_len, window = int(rng.integers(2, 6)), int(rng.integers(3, 7)), int(rng.integers(1, 4))
    units = rng.integers(0, 3, t_len)  # time-varying, sometimes 0
    s = make_stream(rng.integers(0, t_len, n), rng.normal(0.5, 0.6, n), rng.integers(1, 4, n),
                    rng.uniform(0, 3, n), units, rng.uniform(2, 6, t_len))
    wait_cost = float(rng.uniform(0, 0.3))
    plan = clairvoyant_bound(s, wait_cost, window=window)
    assert is_feasible(s, plan.start)
    assert plan.value == pytest.approx(plan_value(s, plan.start, wait_cost))
    assert plan.value == pytest.approx(brute_force(s, wait_cost, window), abs=1e-9)


def test_ample_capacity_serves_every_positive_request_at_arrival():
    s = synthetic_stream(3, horizon=60, users=5, p_arrival=0.3, units=10_000, bandwidth_hz=1e12)
    plan = clairvoyant_bound(s, wait_cost=0.01)
    pos = s.value > 0
    assert pos.any() and (~pos).any()
    np.testing.assert_array_equal(plan.start[pos], s.arrival[pos])
    assert np.all(plan.start[~pos] == -1)
    assert plan.value == pytest.approx(float(np.sum(s.value[pos])))


@pytest.mark.parametrize("seed", range(4))
def test_bound_dominates_greedy_online(seed):
    s = synthetic_stream(seed, horizon=60, users=8, p_arrival=0.15, units=2, bandwidth_hz=12e6)
    wait_cost = 0.05
    bound = clairvoyant_bound(s, wait_cost)
    greedy = greedy_online(s, wait_cost)
    assert is_feasible(s, greedy.start)
    assert bound.value >= greedy.value - 1e-9
    # contended: capacity binds, so some positive-value request is left local by the bound
    assert np.any((s.value > 0) & (bound.start < 0))


def test_default_window_is_not_restrictive():
    # one unit, two 5-slot jobs arriving together: serving both makes one wait 5 slots
    # (cost 0.5); wait_cost 0.1 → default W = ceil(5/0.1) = 50 ≥ 5, so both are served
    s = make_stream([0, 0], [5.0, 1.0], [5, 5], [0.0, 0.0], 1, 1.0, horizon=12)
    plan = clairvoyant_bound(s, wait_cost=0.1)
    assert sorted(plan.start) == [0, 5]
    assert plan.value == pytest.approx(5.0 + 1.0 - 0.5)
    assert clairvoyant_bound(s, 0.1, window=2).value == pytest.approx(5.0)


@pytest.mark.parametrize("kwargs,field", [
    (dict(arrival=[0, 5]), "arrival"), (dict(service=[0, 1]), "service"),
    (dict(bw=[-1.0, 0.0]), "bw"), (dict(value=[np.nan, 0.0]), "value"),
    (dict(units=[1, 1]), "units"),
])
def test_bad_stream_names_the_field(kwargs, field):
    base = dict(arrival=[0, 1], value=[1.0, 1.0], service=[1, 1], bw=[0.0, 0.0], units=1,
                bandwidth=1.0, horizon=3)
    base.update(kwargs)
    with pytest.raises(BadInput, match=field):
        make_stream(**base)


def test_stream_from_env_rollout_bounds_the_rule_that_ran(stage2_env):
    """A stage-2 rollout (threshold rule, one env, contended: M = 1): the extracted stream has
    one request per new nomination, the rule's own schedule is feasible in the model, and the
    bound is ≥ the rule's and the greedy rule's value on that stream."""
    import jax

    from envs import stage2
    from prada_jax.dual import rollout
    from prada_jax.dual.stream import rollout_plan, stream_from_rollout
    from prada_jax.dual.problem import Multipliers

    params = stage2_env.params()  # structure-only traces, M = 1, U = 6
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(0), params, stage2_env.num_envs,
                                 lambda _: rollout.fixed_prices(Multipliers(0.0, 0.0)))
    _, out = stage2_env.rollout(carry, params)
    s = stream_from_rollout(out, env=1)
    assert len(s.arrival) == int(np.asarray(out["batch"].fresh)[:, 1].sum()) > 10
    wait_cost = float(params.beta * params.tau_s)
    rule = rollout_plan(s, out, wait_cost, env=1)
    assert is_feasible(s, rule.start)
    assert (rule.start >= 0).sum() > 5
    bound = clairvoyant_bound(s, wait_cost)
    assert bound.value >= rule.value - 1e-9
    assert bound.value >= greedy_online(s, wait_cost).value - 1e-9


def test_command_refuses_bad_flags_with_exit_2(tmp_path, run_command):
    """One real subprocess (the entry point), the other flags in-process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=root, HF_HUB_OFFLINE="1")
    flag = "--scenario=nope"
    r = subprocess.run([sys.executable, "-m", "evals.open_loop_bound", flag], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (flag, r.stderr)
    assert flag.split("=")[0] in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for flag in ("--lambda_s=-1", "--slots=0"):
        code, _, err = run_command("evals.open_loop_bound", flag, cwd=tmp_path)
        assert code == 2, (flag, err)
        assert flag.split("=")[0] in err and len(err.strip().splitlines()) == 1
        assert not any(tmp_path.iterdir())  # nothing written
