"""The admission price (the threshold rule charges λ_s + µ·b to queueing too). Checked against
plain-Python enumeration / greedy references (written here), NumPy softmax, the learner's own
relaxation, and the env running it as a registered scheduler."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from envs import stage2
from prada_jax import sched
from prada_jax.sched import IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams
from prada_jax.sched import registry
from prada_jax.sched.threshold import threshold_decide
from prada_jax.dual import problem, rollout

_admit = jax.jit(threshold_decide)
_decide = jax.jit(sched.threshold_decide)
_hard = jax.jit(problem.hard_decision)
_soft_rule = jax.jit(sched.threshold_rule, static_argnames=("temperature",))


def _inputs(rng, c, p_cand=0.9, wait_max=1):
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    return SchedInputs(
        candidate=jnp.asarray(rng.uniform(size=c) < p_cand),
        gain=f32(rng.normal(0.05, 0.1, size=c)), delay_s=f32(rng.uniform(0.005, 0.3, size=c)),
        bandwidth_hz=f32(rng.uniform(1e5, 3e6, size=c)),
        wait_slots=jnp.asarray(rng.integers(0, wait_max, size=c), jnp.int32),
        ctx_tokens=jnp.full(c, 100, jnp.int32), snr=jnp.ones(c, jnp.float32),
        draft_prm=f32(rng.uniform(size=c)), u_rand=f32(rng.uniform(size=c)),
        queue_len=jnp.asarray(rng.integers(0, 6), jnp.int32),
        comm_s=f32(rng.uniform(0.0, 0.1, size=c)))


def _sp(rng, **kw):
    base = dict(lambda_s=float(rng.uniform(0, 0.08)), mu=float(rng.uniform(0, 2e-8)), beta=0.3,
                tau_s=0.05, num_servers=2, max_wait_slots=3, rsd_threshold=0.7)
    base.update(kw)
    return SchedParams(**{k: jnp.asarray(v) for k, v in base.items()})


def _scalars(x, sp):
    """Plain-Python per-candidate (w, w̄, price) in float64, written from docs/design.md §6 (coarse
    policy: w = ΔQ − β·communication, w̄ = w − β·τ·(1+q))."""
    q = int(x.queue_len) / int(sp.num_servers)
    beta, tau = float(sp.beta), float(sp.tau_s)
    out = []
    for i in range(np.asarray(x.candidate).shape[0]):
        g, cm, b = float(x.gain[i]), float(x.comm_s[i]), float(x.bandwidth_hz[i])
        out.append((g - beta * cm, g - beta * (cm + tau * (1 + q)),
                    float(sp.lambda_s) + float(sp.mu) * b))
    return out


def test_admission_rule_maximises_priced_lagrangian_by_enumeration():
    """Ample resources (repair idle): the decisions maximise Σ_i u_i(d_i) over all 3^C
    vectors with u(local)=0, u(queue)=w̄−λ_s−µb, u(immediate)=w−λ_s−µb."""
    rng = np.random.default_rng(0)
    c = 5  # one shape (one compile); the candidate mask varies
    for trial in range(40):
        x = _inputs(rng, c, p_cand=0.8, wait_max=1)
        # Prices large enough that the priced queue/local choice matters for many candidates.
        sp = _sp(rng, lambda_s=float(rng.uniform(0, 0.1)), max_wait_slots=100)
        got = np.asarray(_admit(x, jnp.int32(100), jnp.float32(1e12), sp))
        vals = _scalars(x, sp)
        cand = np.asarray(x.candidate)
        best, best_d = -np.inf, None
        for d in itertools.product((LOCAL, QUEUE, IMMEDIATE), repeat=c):
            total = 0.0
            for i, di in enumerate(d):
                w, wb, price = vals[i]
                if not cand[i]:
                    total += 0.0 if di == LOCAL else -1e9
                elif di == QUEUE:
                    total += wb - price
                elif di == IMMEDIATE:
                    total += w - price
            if total > best + 1e-9:
                best, best_d = total, d
        np.testing.assert_array_equal(got, np.asarray(best_d), err_msg=f"trial {trial}")
        # The learner's unrepaired rule agrees (its own code path).
        w, wb, _ = (np.asarray(a) for a in sched.advantages(x, sp))
        mine = _hard(w, wb, np.asarray(x.bandwidth_hz), sp.lambda_s, sp.mu, cand)
        np.testing.assert_array_equal(np.asarray(mine), got)


def test_admission_price_sends_queue_candidates_local():
    """The finding it addresses: a candidate with w̄ > 0 but w − λ_s − µb < 0 queued under the
    old rule (price on running now only) and is kept local under the admission price."""
    x = SchedInputs(candidate=jnp.array([True]), gain=jnp.array([0.1], jnp.float32),
                    delay_s=jnp.array([0.1], jnp.float32),
                    bandwidth_hz=jnp.array([1e6], jnp.float32),
                    wait_slots=jnp.zeros(1, jnp.int32), ctx_tokens=jnp.ones(1, jnp.int32),
                    snr=jnp.ones(1), draft_prm=jnp.zeros(1), u_rand=jnp.zeros(1),
                    queue_len=jnp.asarray(0, jnp.int32), comm_s=jnp.array([0.1], jnp.float32))
    # w = 0.1 − 0.2·0.1 = 0.08, w̄ = 0.08 − 0.2·0.05 = 0.07 > 0; price 0.09 > w.
    sp = SchedParams(lambda_s=0.09, mu=0.0, beta=0.2, tau_s=0.05, num_servers=1,
                     max_wait_slots=20)
    assert int(_decide(x, 1, 1e12, sp)[0]) == LOCAL
    # Below the price it runs now; with no unit free it queues (w̄ − price > 0).
    sp = sp.replace(lambda_s=0.05)
    assert int(_decide(x, 1, 1e12, sp)[0]) == IMMEDIATE
    assert int(_decide(x, 0, 1e12, sp)[0]) == QUEUE
    # Rejected with w̄ − price ≤ 0 < w − price: kept local, not queued.
    sp = sp.replace(lambda_s=0.075)
    assert int(_decide(x, 0, 1e12, sp)[0]) == LOCAL


def _ref_repair(x, sp, free_units, free_bw):
    """Plain-Python admission rule with its greedy repair."""
    vals = _scalars(x, sp)
    beta, tau = float(sp.beta), float(sp.tau_s)
    q = int(x.queue_len) / int(sp.num_servers)
    c = len(vals)
    live = [bool(x.candidate[i]) and int(x.wait_slots[i]) < int(sp.max_wait_slots)
            for i in range(c)]
    want, key = [], {}
    for i, (w, wb, price) in enumerate(vals):
        g = w - price
        if live[i] and g >= max(wb - price, 0.0):
            want.append(i)
            # value lost if rejected: g − max(w̄ − price, 0) = β·τ·(1+q) if queueing pays
            red = beta * tau * (1 + q) if wb - price > 0 else g
            key[i] = (-red, -g, i)
    out = [LOCAL] * c
    units, bw = free_units, free_bw
    for i in sorted(want, key=lambda j: key[j]):
        b = float(x.bandwidth_hz[i])
        if units >= 1 and b <= bw:
            out[i], units, bw = IMMEDIATE, units - 1, bw - b
    for i, (w, wb, price) in enumerate(vals):
        if out[i] == IMMEDIATE or not live[i]:
            continue
        if i in key:
            out[i] = QUEUE if wb - price > 0 else LOCAL
        else:
            out[i] = QUEUE if wb - price > 0 and wb - price > w - price else LOCAL
    return np.array(out)


def test_admission_repair_matches_plain_python_and_is_feasible():
    rng = np.random.default_rng(3)
    for trial in range(40):
        x = _inputs(rng, 7, wait_max=4)
        sp = _sp(rng)
        fu, fb = int(rng.integers(0, 4)), float(rng.uniform(0, 6e6))
        got = np.asarray(_admit(x, jnp.int32(fu), jnp.float32(fb), sp))
        want = _ref_repair(x, sp, fu, fb)
        cand = np.asarray(x.candidate)
        np.testing.assert_array_equal(got[cand], want[cand], err_msg=f"trial {trial}")
        imm = (got == IMMEDIATE) & cand
        assert imm.sum() <= fu
        assert np.asarray(x.bandwidth_hz)[imm].sum() <= fb * (1 + 1e-6)
        assert not np.any((got == QUEUE) & (np.asarray(x.wait_slots) >= 3))


def test_soft_admission_rule_matches_numpy_softmax_and_learner():
    rng = np.random.default_rng(5)
    temp = 0.03
    for _ in range(10):
        x = _inputs(rng, 6, wait_max=4)
        sp = _sp(rng)
        probs, units, bw = _soft_rule(x, 1, 1e6, sp, temperature=temp)
        vals = np.array(_scalars(x, sp))
        logits = np.stack([np.zeros(6), vals[:, 1] - vals[:, 2], vals[:, 0] - vals[:, 2]], -1)
        z = np.exp((logits - logits.max(-1, keepdims=True)) / temp)
        ref = z / z.sum(-1, keepdims=True)
        ref[np.asarray(x.wait_slots) >= 3] = [1.0, 0.0, 0.0]
        ref[~np.asarray(x.candidate)] = 0.0
        np.testing.assert_allclose(np.asarray(probs), ref, atol=1e-5)
        adm = ref[:, 1] + ref[:, 2]
        np.testing.assert_allclose(float(units), adm.sum(), atol=1e-5)
        np.testing.assert_allclose(float(bw), (adm * np.asarray(x.bandwidth_hz)).sum(),
                                   rtol=1e-4)
        w, wb, _ = (np.asarray(a) for a in sched.advantages(x, sp))
        live = np.asarray(x.candidate) & (np.asarray(x.wait_slots) < 3)
        mine = problem.soft_decision(w, wb, np.asarray(x.bandwidth_hz), float(sp.lambda_s),
                                  float(sp.mu), temp)
        np.testing.assert_allclose(np.asarray(mine)[live], ref[live], atol=1e-5)


def test_registry_names_the_rule_once():
    """The threshold rule is registered once, under ``threshold`` (the old alias
    ``threshold_admission`` is gone); the paper schedulers keep their indices."""
    assert registry.SCHEDULER_NAMES == ("keep_local", "offload_all", "random", "fifo_greedy",
                                        "threshold", "rsd", "threshold_fifo")
    assert len(registry.SCHEDULERS) == len(registry.SCHEDULER_NAMES)
    assert registry.SCHEDULERS[registry.THRESHOLD_INDEX] is sched.threshold_decide
    with pytest.raises(ValueError, match="scheduler must be one of"):
        registry.scheduler_index("threshold_admission")


def test_env_runs_the_admission_rule(stage2_env):
    """The env decides what the rule decides on the candidate sets read by
    ``envs.edge.candidate_set`` (outages aside, which the env makes local), with both
    admitted and locally kept candidates present."""
    params = stage2_env.params()
    lam = 0.004  # between typical w's so both admitted and locally kept candidates occur
    carry = rollout.init_rollout(stage2.EDGE, jax.random.key(0), params, stage2_env.num_envs,
                                 lambda _: rollout.fixed_prices(problem.Multipliers(lam, 0.0)))
    _, out = stage2_env.rollout(carry, params)
    np.testing.assert_allclose(np.asarray(out["lambda_s"]), lam, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out["mu"]), 0.0)
    _, d, env_d, cand, outage = stage2_env.rule_on_slots(out, params)
    keep = cand & ~outage
    assert keep.sum() > 40
    np.testing.assert_array_equal(env_d[keep], d[keep])
    assert np.any(d[keep] == IMMEDIATE) and np.any(d[keep] == LOCAL)
