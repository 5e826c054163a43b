"""The measurement under load (docs/design.md §8, ``evals.evaluate``'s rule), each part against
an independent computation:

1. baselines served in arrival order (a plain-Python "longest wait first" choice; Little's law
   for the server LLM alone at M = 1, whose latency grows with load);
2. every arrival counted (a plain-Python cohort reduction of a separate rollout, with blocked
   and timed-out users);
3. an empty start (a backlog in the params changes nothing) and the steady-state flag;
4. the offered load ρ (equal to the measured utilisation when everything offered is served),
   and a ρ ≥ 1 row flagged unstable with its latencies withheld in table, JSON, CSV and
   TensorBoard.

Env: the crafted one-step traces (``evals.testing``) with a 300-token LLM step, the server LLM
alone (``llm_only``) at M = 1, τ = 5 ms, ample B, no outage: every job holds the unit for 12
slots (60 ms, the paper clock), so the server serves 16.7 jobs/s.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import edge
from evals import evaluate as ev
from evals import report, suite
from evals.testing import crafted_traces
from prada_jax.sched import baselines
from prada_jax.sched.base import IMMEDIATE, SchedInputs, SchedParams

TAU = 0.005
T, W, D, S = 1200, 100, 400, 4
ALL_LLM = ev.PolicySpec(suite.ALL_LLM, "always", "offload_all")


def _traces():
    tr = crafted_traces()
    tok = np.asarray(tr.cand_tokens).copy()
    tok[:, 1] = 300
    return tr.replace(cand_tokens=tok)


def _params(**kw):
    base = dict(num_users=16, num_servers=1, bandwidth_hz=1e9, arrival_rate_hz=8.0,
                snr_threshold_db=-np.inf, tau_s=TAU, scheduler="offload_all")
    base.update(kw)
    return edge.make_params(_traces(), **base)


@pytest.fixture(scope="module")
def evaluator():
    return ev.Evaluator(_params(), seeds=S, num_slots=T, warmup_slots=W, drain_slots=D)


def _llm(evaluator, **kw):
    return suite.run_row(evaluator, ALL_LLM, **kw)


# ----------------------------------------------------------------------------- 1. order

def _inputs(wait):
    c = len(wait)
    ones = jnp.ones((c,), jnp.float32)
    return SchedInputs(candidate=jnp.ones((c,), bool), gain=ones, delay_s=ones,
                       bandwidth_hz=ones, wait_slots=jnp.asarray(wait, jnp.int32),
                       ctx_tokens=jnp.ones((c,), jnp.int32), snr=ones,
                       draft_prm=jnp.zeros((c,), jnp.float32),
                       u_rand=jnp.full((c,), 0.9, jnp.float32),   # random: wants immediate
                       queue_len=jnp.asarray(0, jnp.int32))


@pytest.mark.parametrize("rule", ["offload_all", "rsd", "random_sched", "fifo_greedy"])
@pytest.mark.parametrize("wait", [[0, 4, 2, 0, 7, 1], [3, 3, 0, 5, 5, 1]], ids=["a", "b"])
def test_baselines_admit_the_oldest_requests_first(rule, wait):
    """With k free units, the k requests that waited longest run (ties by user slot): a plain
    Python sort of the waits. Today's index order admitted slots 0..k-1 instead."""
    fn = getattr(baselines, rule)
    for k in (1, 2, 3):
        dec = np.asarray(jax.jit(fn)(_inputs(wait), jnp.asarray(k, jnp.int32),
                                     jnp.asarray(1e9, jnp.float32), SchedParams(
                                         max_wait_slots=100)))
        want = sorted(range(len(wait)), key=lambda i: (-wait[i], i))[:k]
        assert sorted(np.flatnonzero(dec == IMMEDIATE).tolist()) == sorted(want), (rule, k)


def _nominate_all(p, keys, slots, gain, out):
    """Every user nominated every slot (gain ``gain``), started empty, one env per key with
    the evaluator's key schedule, written apart from the evaluator: the per-slot
    ``out(state before the step, done, info)`` stacked [keys, slots, ...]."""
    p = p.replace(initial_users=jnp.zeros_like(p.initial_users))
    u = p.num_users

    def one(key):
        reset_key, run_key = jax.random.split(key)
        _, state = edge.reset(reset_key, p)

        def body(state, t):
            _, env_key = jax.random.split(jax.random.fold_in(run_key, t))
            act = edge.EdgeAction(jnp.ones((u,), jnp.int32), jnp.full((u,), gain, jnp.float32))
            _, new, _, done, info = edge.step(env_key, state, act, p)
            return new, out(state, done, info)

        return jax.lax.scan(body, state, jnp.arange(slots))[1]

    return jax.jit(jax.vmap(one))(keys)


def _occupancy(params, seeds, slots, warmup):
    """Mean users in the system over slots [warmup + 1, slots] and admitted arrivals per slot
    of the window, from a rollout of ``edge.step`` with the evaluator's key schedule, written
    apart from the evaluator (Little's law: N = λ_admitted · mean latency)."""
    p = ev.apply_spec(params, ALL_LLM).replace(
        **{k: jnp.asarray(v, getattr(params, k).dtype)
           for k, v in suite.LLM_ONLY_OVERRIDES.items()})
    n, adm = _nominate_all(
        p, jax.vmap(jax.random.key)(jnp.arange(seeds)), slots, 0.0,
        lambda before, done, info: (info["in_flight"], info["arrivals"] - info["blocked"]))
    n, adm = np.asarray(n, float)[:, warmup:], np.asarray(adm, float)[:, warmup:]
    return n.mean(1), adm.mean(1)


def test_llm_alone_obeys_littles_law_and_slows_with_load(evaluator):
    """The server LLM alone at M = 1: the evaluator's mean latency (over every arrival) is
    what Little's law gives from the occupancy of a separate rollout, within 10 %, and it
    grows with the arrival rate. Served by user-slot index and averaged over survivors, the
    latency read far below Little's (users in high slots starved out of the window)."""
    lat = {}
    for lam in (6.0, 12.0):
        m = _llm(evaluator, arrival_rate_hz=lam)
        assert np.all(m["rho"] < 0.95) and np.all(m["timeout_rate"] == 0), lam
        n, adm = _occupancy(ev.apply_spec(_params(arrival_rate_hz=lam), ALL_LLM), S, T, W)
        little = n / adm * TAU
        np.testing.assert_allclose(m["latency_mean_s"], little, rtol=0.10, err_msg=str(lam))
        lat[lam] = m["latency_mean_s"]
    assert np.mean(lat[12.0]) > 1.3 * np.mean(lat[6.0])


# ----------------------------------------------------------------------------- 2. cohort

def test_every_arrival_counts_by_one_rule():
    """A plain-Python reduction of a separate rollout (per-user arrival slots, finishes,
    answers): the cohort arriving in [W, T), blocked and unfinished-at-the-timeout users at
    accuracy 0 and latency D·τ. The server LLM alone overloaded (U = 4, M = 1, 12-slot jobs,
    a 40-slot timeout) so that both kinds of failure occur beside users that finish."""
    t_, w_, d_, s_ = 300, 40, 40, 2
    params = _params(num_users=4, arrival_rate_hz=60.0, **suite.LLM_ONLY_OVERRIDES)
    spec = ALL_LLM
    e = ev.Evaluator(params, seeds=s_, num_slots=t_, warmup_slots=w_, drain_slots=d_)
    got = e.run(spec)
    p = ev.apply_spec(params, spec)
    u = p.num_users
    outs = jax.device_get(_nominate_all(
        p, e.keys, t_ + d_, 0.05,
        lambda before, done, info: (before.arrival_slot, done, info["user_correct"],
                                    info["user_latency_s"], info["arrivals"], info["blocked"])))
    timeout = d_ * TAU
    for s in range(s_):
        arr, done, corr, lat, n_arr, n_blk = (np.asarray(x[s]) for x in outs)
        arrivals = int(n_arr[w_:t_].sum())
        blocked = int(n_blk[w_:t_].sum())
        correct = lat_sum = finished = 0
        for t in range(t_ + d_):
            for i in range(u):
                if not done[t, i]:
                    continue
                a = int(arr[t, i]) - 1            # the slot the arrival was counted in
                slots = round(float(lat[t, i]) / TAU)
                if w_ <= a < t_ and slots <= d_:
                    finished += 1
                    correct += int(corr[t, i])
                    lat_sum += slots * TAU
        fails = arrivals - finished
        assert blocked > 0 and fails > blocked and finished > 0, "blocks, timeouts, finishes"
        np.testing.assert_allclose(got["accuracy"][s], correct / arrivals, rtol=1e-9)
        np.testing.assert_allclose(got["latency_mean_s"][s],
                                   (lat_sum + fails * timeout) / arrivals, rtol=1e-5)
        np.testing.assert_allclose(got["blocked_rate"][s], blocked / arrivals, rtol=1e-9)
        np.testing.assert_allclose(got["timeout_rate"][s], (fails - blocked) / arrivals,
                                   rtol=1e-9)
        # A survivor-only mean would hide the failures: it is below the rule's numbers.
        assert correct / finished > got["accuracy"][s]
        assert lat_sum / finished < got["latency_mean_s"][s]
    np.testing.assert_allclose(got["objective"],
                               got["accuracy"] - float(p.beta) * got["latency_mean_s"])


# ----------------------------------------------------------------------------- 3. start

def test_evaluations_start_empty(evaluator):
    """A backlog in the params (U users at slot 0) changes nothing: the evaluator starts
    from an empty system; with no arrivals nothing is measured at all."""
    full = _params(initial_users=16)
    e0 = ev.Evaluator(full, seeds=S, num_slots=T, warmup_slots=W, drain_slots=D)
    a = _llm(e0, arrival_rate_hz=8.0)
    b = _llm(evaluator, arrival_rate_hz=8.0)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    e1 = ev.Evaluator(full, seeds=S, num_slots=T, warmup_slots=0, drain_slots=D)
    none = _llm(e1, arrival_rate_hz=0.0)
    np.testing.assert_array_equal(none["finished"], 0)
    np.testing.assert_array_equal(none["arrivals"], 0)


def test_steady_state_flag(evaluator):
    """Stationary load: the halves of the window agree (no flag). A load that steps up
    half-way through the window (arrivals at 0.4× then 1.4× of 10 users/s, a schedule of
    ``envs.scenarios``; every part stable, ρ < 1 overall): the second half is slower and the
    row is flagged ``not steady``, not reported as one steady latency."""
    from envs import scenarios

    calm = report.summarize({"r": _llm(evaluator, arrival_rate_hz=10.0)})["r"]
    assert report.row_flags(calm) == []
    half = W + (T - W + 1) // 2
    factor = np.where(np.arange(T + D) < half, 0.4, 1.4)
    step_up = edge.with_scenario(_params(arrival_rate_hz=10.0),
                                 scenarios.static(T + D)._replace(arrival=factor))
    e = ev.Evaluator(step_up, seeds=S, num_slots=T, warmup_slots=W, drain_slots=D)
    hot = report.summarize({"r": _llm(e)})["r"]
    assert hot["rho"].mean < 1.0
    assert hot["steady_drift"].low > report.STEADY_TOL
    assert report.row_flags(hot) == [report.NOT_STEADY]


# ----------------------------------------------------------------------------- 4. rho

def test_rho_is_the_utilisation_when_everything_offered_is_served(evaluator):
    """Server LLM alone, no outage, no expiry, no blocking: every requested server second is
    served, so ρ equals the measured mean busy share of the unit (mean over seeds, within 4 %:
    work offered near the window's edges is served outside it and vice versa)."""
    for lam in (4.0, 12.0):
        m = _llm(evaluator, arrival_rate_hz=lam)
        assert np.all(m["blocked_rate"] == 0)
        np.testing.assert_allclose(np.mean(m["rho"]), np.mean(m["server_util"]), rtol=0.04,
                                   err_msg=str(lam))
    # Twice the arrivals, about twice the load.
    r4 = _llm(evaluator, arrival_rate_hz=4.0)["rho"]
    r8 = _llm(evaluator, arrival_rate_hz=8.0)["rho"]
    np.testing.assert_allclose(r8 / r4, 2.0, rtol=0.15)


def test_unstable_row_is_flagged_and_shows_no_latency(evaluator, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from prada_jax.metric_writer import MetricWriter

    per_seed = {"calm": _llm(evaluator, arrival_rate_hz=8.0),
                "hot": _llm(evaluator, arrival_rate_hz=40.0)}
    assert np.mean(per_seed["hot"]["rho"]) >= 1.0 > np.mean(per_seed["calm"]["rho"])
    summ = report.summarize(per_seed)
    assert report.UNSTABLE in report.row_flags(summ["hot"])
    table = report.format_table(summ)
    hot_line = next(ln for ln in table.splitlines() if ln.startswith("hot"))
    calm_line = next(ln for ln in table.splitlines() if ln.startswith("calm"))
    assert hot_line.count("unstable") >= len(report.LATENCY_METRICS)
    assert "unstable" not in calm_line
    js = json.loads(json.dumps(report.to_json_dict(per_seed, summ)))
    for m in report.LATENCY_METRICS:
        assert js["policies"]["hot"][m]["mean"] is None
        assert js["policies"]["calm"][m]["mean"] is not None
    assert report.UNSTABLE in js["flags"]["hot"]
    rows = [r.split(",") for r in report.csv_text(summ).splitlines()[1:]]
    hot_lat = [r for r in rows if r[0] == "hot" and r[1] == "latency_mean_s"][0]
    assert hot_lat[2] == "" and "unstable" in hot_lat[-1]
    with MetricWriter(tmp_path) as w:
        w.write_scalars(0, report.tb_scalars(summ))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "eval/hot/latency_mean_s" not in tags and "eval/calm/latency_mean_s" in tags
    assert acc.Scalars("eval/hot/unstable")[0].value == 1.0
    assert acc.Scalars("eval/calm/unstable")[0].value == 0.0
    # The headline withholds every latency ratio against an unstable reference.
    h = suite.headline({"PRADA": per_seed["calm"], suite.ALL_LLM: per_seed["hot"],
                        "All-SLM": per_seed["calm"]})
    assert h["latency_share"] is None and h["slm_latency_share"] is None
    assert h["flags"][suite.ALL_LLM] == [report.UNSTABLE] or \
        report.UNSTABLE in h["flags"][suite.ALL_LLM]
    text = suite.headline_text(h, synthetic=True)
    assert "withheld" in text and "latency 100" not in text
    h2 = suite.headline({"PRADA": per_seed["calm"], suite.ALL_LLM: per_seed["calm"]})
    assert h2["latency_share"].mean == pytest.approx(1.0)
