"""The evaluation loop on a crafted trace set whose answers are known.

Crafted set (one step per problem): the LLM's step is always right, the SLM's draft is right
on even problems only; feature 0 says which (+1: the draft is wrong); the PRM scores a right
draft 0.9 and a wrong one 0.1. No outages, ample M and B. Then, exactly on every seed:
All-LLM = RSD = an oracle screening policy = 1.0 accuracy; All-SLM ≈ 0.5; random screening
lies between; and the reductions (p95, rates) match NumPy references.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from evals import evaluate as ev
from evals import report
from evals.testing import crafted_traces, oracle_apply


@pytest.fixture(scope="module")
def results():
    params = edge.make_params(crafted_traces(), num_users=8, num_servers=8, bandwidth_hz=1e9,
                              arrival_rate_hz=12.0, snr_threshold_db=-np.inf)
    e = ev.Evaluator(params, seeds=3, num_slots=240, warmup_slots=20, apply_fn=oracle_apply,
                     net_params=jnp.zeros(()))
    rows = ev.baseline_specs() + ev.policy_specs(lambda_s=0.0, mu=0.0)
    out = e.run_all(rows)
    p, out["Random (matched)"] = ev.matched_random_probability(e, 0.5)
    return out, p


def test_known_accuracies_and_order(results):
    res, p = results
    acc = {k: v["accuracy"] for k, v in res.items()}
    for name in ("All-LLM", "RSD (online PRM)", "Policy (no limits)", "Policy + FIFO-greedy",
                 "PRADA", "PRADA (λ=µ=0)"):
        # Every finished answer is right; blocked and timed-out arrivals count as wrong.
        m = res[name]
        np.testing.assert_allclose(acc[name], 1.0 - m["blocked_rate"] - m["timeout_rate"],
                                   rtol=1e-12, err_msg=name)
        np.testing.assert_allclose(acc[name], m["finished"] / m["arrivals"], rtol=1e-12)
        assert np.all(acc[name] > 0.95)
    assert np.all((acc["All-SLM"] > 0.25) & (acc["All-SLM"] < 0.75))
    assert np.all(acc["Random (matched)"] > acc["All-SLM"])
    assert np.all(acc["Random (matched)"] < acc["All-LLM"])


def test_rates_and_delay_split(results):
    res, p = results
    slm, llm, pol = res["All-SLM"], res["All-LLM"], res["Policy (no limits)"]
    np.testing.assert_array_equal(slm["offload_rate"], 0.0)
    np.testing.assert_array_equal(slm["communication_s"], 0.0)
    np.testing.assert_array_equal(slm["queueing_s"], 0.0)
    np.testing.assert_array_equal(llm["offload_rate"], 1.0)   # M = U, no outage: all served
    np.testing.assert_array_equal(llm["outage_rate"], 0.0)
    assert np.all(llm["communication_s"] > 0)
    assert np.all((pol["offload_rate"] > 0.25) & (pol["offload_rate"] < 0.75))
    # Random matched to 50%: realised offload within sampling noise of the target.
    assert 0.3 < np.mean(res["Random (matched)"]["offload_rate"]) < 0.7 and 0 < p <= 1
    # Delay components add up to the end-to-end latency of the finished users (slot-quantised
    # accounting); the mean over arrivals puts every failure at the timeout.
    timeout = ev.DEFAULT_DRAIN_SLOTS * 0.05
    for name, m in res.items():
        total = m["processing_s"] + m["communication_s"] + m["queueing_s"]
        fail = m["arrivals"] - m["finished"]
        fin_mean = (m["latency_mean_s"] * m["arrivals"] - fail * timeout) / m["finished"]
        np.testing.assert_allclose(total, fin_mean, rtol=1e-4, err_msg=name)
        assert np.all(m["latency_p95_s"] >= m["latency_mean_s"] * 0.5)
        assert np.all(m["finished"] > 50)
    assert np.all(llm["latency_mean_s"] > slm["latency_mean_s"])
    for name, m in res.items():   # env objective with the default β = 0.2 PRM units / s
        np.testing.assert_allclose(m["objective"], m["accuracy"] - 0.2 * m["latency_mean_s"],
                                   rtol=1e-6, err_msg=name)


def test_reductions_match_numpy():
    rng = np.random.default_rng(0)
    tau = 0.05
    hist = rng.integers(0, 5, size=(2, 40)).astype(np.float64)
    totals = {k: rng.uniform(1, 10, size=2) for k in (
        "processing_s", "communication_s", "queueing_s",
        "offloads", "outages", "steps", "fallbacks", "server_busy", "slots",
        "decisions", "nominations", "queue_len", "capacity_bound",
        "bandwidth_bound", "offered_job_s", "capacity_s", "uplink_bound", "downlink_bound",
        "server_batch", "prefix_hit_tokens", "prefix_ctx_tokens", "evicted_tokens",
        "kv_in_use_tokens")}
    arr = rng.integers(20, 40, size=(2, 2)).astype(np.float64)
    blk = rng.integers(0, 5, size=(2, 2)).astype(np.float64)
    fin = arr - blk - rng.integers(0, 3, size=(2, 2))
    totals.update(half_arrivals=arr, half_blocked=blk, half_finished=fin,
                  half_correct=np.floor(fin * 0.7), half_latency_s=fin * 1.5,
                  timeout_s=np.full(2, 20.0), latency_hist=hist)
    m = ev.per_seed_metrics(totals, tau)
    for s in range(2):
        sample = np.repeat(np.arange(40), hist[s].astype(int)) * tau
        want = np.percentile(sample, 95, method="inverted_cdf")
        np.testing.assert_allclose(m["latency_p95_s"][s], want, rtol=1e-12)
        # Every arrival counted: failures at the 20 s timeout.
        lat_h = [(fin[s, h] * 1.5 + (arr[s, h] - fin[s, h]) * 20.0) / arr[s, h] for h in (0, 1)]
        lat = (fin[s].sum() * 1.5 + (arr[s] - fin[s]).sum() * 20.0) / arr[s].sum()
        np.testing.assert_allclose(m["latency_mean_s"][s], lat, rtol=1e-12)
        np.testing.assert_allclose(m["steady_drift"][s], (lat_h[1] - lat_h[0]) / lat,
                                   rtol=1e-12)
        np.testing.assert_allclose(m["accuracy"][s], np.floor(fin[s] * 0.7).sum() / arr[s].sum())
        np.testing.assert_allclose(
            m["rho"][s], totals["offered_job_s"][s] / totals["capacity_s"][s]
            * arr[s].sum() / (arr[s].sum() - blk[s].sum()), rtol=1e-12)
        np.testing.assert_allclose(m["goodput_hz"][s],
                                   np.floor(fin[s] * 0.7).sum() / (totals["slots"][s] * tau))
    np.testing.assert_allclose(m["outage_rate"],
                               totals["outages"] / (totals["offloads"] + totals["outages"]))
    np.testing.assert_allclose(m["queue_len"], totals["queue_len"] / totals["slots"])
    np.testing.assert_allclose(m["capacity_bound_share"],
                               totals["capacity_bound"] / totals["slots"])
    np.testing.assert_allclose(m["bandwidth_bound_share"],
                               totals["bandwidth_bound"] / totals["slots"])
    for metric, key in (("uplink_bound_share", "uplink_bound"),
                        ("downlink_bound_share", "downlink_bound"),
                        ("server_batch", "server_batch")):
        np.testing.assert_allclose(m[metric], totals[key] / totals["slots"])
    # the server's prefix cache (envs.prefix_cache)
    np.testing.assert_allclose(m["prefix_hit_rate"],
                               totals["prefix_hit_tokens"] / totals["prefix_ctx_tokens"])
    np.testing.assert_allclose(m["evicted_tokens_per_s"],
                               totals["evicted_tokens"] / (totals["slots"] * tau))
    np.testing.assert_allclose(m["kv_in_use_tokens"], totals["kv_in_use_tokens"] / totals["slots"])
    empty = dict(totals, half_arrivals=np.zeros((2, 2)), half_finished=np.zeros((2, 2)),
                 half_blocked=np.zeros((2, 2)), latency_hist=np.zeros((2, 40)))
    assert np.all(np.isnan(ev.per_seed_metrics(empty, tau)["accuracy"]))


def test_policy_row_needs_policy():
    params = edge.make_params(crafted_traces(), num_users=2)
    e = ev.Evaluator(params, seeds=1, num_slots=4, warmup_slots=0)
    with pytest.raises(ValueError, match="needs a screening policy"):
        e.run(ev.PolicySpec("PRADA", "policy", "threshold"))
    with pytest.raises(ValueError, match="warmup_slots"):
        ev.make_evaluator(10, 10)


@pytest.mark.parametrize("bandwidth_hz", [2e9, 3e4])
def test_binding_shares_match_a_manual_rollout(bandwidth_hz):
    """The evaluator's binding shares equal a plain-Python count over ``edge.step`` infos with
    the evaluator's key schedule: capacity binds where a request waits with all M_t units
    busy, bandwidth where one waits with a unit free. Ample bandwidth: it never binds."""
    import jax

    params = edge.make_params(crafted_traces(), num_users=8, num_servers=2,
                              bandwidth_hz=bandwidth_hz, arrival_rate_hz=20.0,
                              snr_threshold_db=-np.inf)
    # The sizes and policy of the ``results`` evaluator: both share one compilation.
    T, W, S = 240, 20, 3
    e = ev.Evaluator(params, seeds=S, num_slots=T, warmup_slots=W, apply_fn=oracle_apply,
                     net_params=jnp.zeros(()))
    got = e.run(ev.PolicySpec("All-LLM", "always", "offload_all"))
    p = ev.apply_spec(params, ev.PolicySpec("All-LLM", "always", "offload_all"))
    step = jax.jit(edge.step)
    p0 = p.replace(initial_users=jnp.zeros_like(p.initial_users))   # the evaluator's empty start
    for s in range(S):
        reset_key, run_key = jax.random.split(jax.random.key(s))
        obs, state = jax.jit(edge.reset)(reset_key, p0)
        cap = bw = 0
        for t in range(T):
            _, env_key = jax.random.split(jax.random.fold_in(run_key, t))
            act = edge.EdgeAction(jnp.ones((8,), jnp.int32),
                                  jnp.full((8,), p.default_gain, jnp.float32))
            obs, state, _, _, info = step(env_key, state, act, p0)
            if t < W:
                continue
            waits = bool(np.any(np.asarray(info["decision"]) == 1))
            full = int(info["server_in_use"]) >= int(info["num_servers_t"])
            cap += waits and full
            bw += waits and not full
        assert got["capacity_bound_share"][s] == pytest.approx(cap / (T - W))
        assert got["bandwidth_bound_share"][s] == pytest.approx(bw / (T - W))
        if bandwidth_hz > 1e9:
            assert bw == 0 and cap > 0
