"""Stage-2 rollouts: edge-env slots run with the threshold rule and given or learned prices.

The env builds each slot's candidate set (``envs.edge.candidate_set``); this module turns it
into the learner's ``prada_jax.dual.SlotBatch``, computes the load features the server can
observe, runs E envs for T slots under ``lax.scan`` and (in the online modes) updates the
multipliers every slot, or (differentiable mode) after the rollout. ``envs`` is imported inside
functions (``prada_jax`` never needs it at import time).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from prada_jax import dual
from prada_jax.dual import DualConfig, DualState, Multipliers, SlotBatch

#: Load features (all observable by the server at the start of a slot, scaled to O(1)):
#: queue length / M, active users / U, free server units / M, new nominations / U (request
#: arrivals at the server), mean uplink spectral efficiency log2(1 + SNR) of this slot's
#: candidates / 10 (channel quality; 0 without candidates). M, U: the env's nominal values.
LOAD_FEATURES = 5


def load_features(x, free_units, state, params) -> jax.Array:
    """[LOAD_FEATURES] float32 of one env slot (see ``LOAD_FEATURES``).

    x: ``SchedInputs`` [U] of the slot; free_units: int32 scalar; state: ``EnvState``;
    params: ``EnvParams``. Reads only what the server observes, so it keeps working when the
    env's capacity or channel change from slot to slot.
    """
    m = jnp.asarray(params.num_servers, jnp.float32)
    u = float(params.num_users)
    cand = x.candidate.astype(jnp.float32)
    fresh = (x.candidate & (x.wait_slots == 0)).astype(jnp.float32)
    se = jnp.log2(1.0 + jnp.maximum(x.snr.astype(jnp.float32), 0.0))
    chan = jnp.sum(cand * se) / jnp.maximum(jnp.sum(cand), 1.0)
    return jnp.stack([x.queue_len.astype(jnp.float32) / m,
                      jnp.mean(state.active.astype(jnp.float32)),
                      jnp.asarray(free_units, jnp.float32) / m,
                      jnp.sum(fresh) / u, chan / 10.0]).astype(jnp.float32)


def slot_from_sched(x, free_units, free_bw_hz, sp, load, capacity_units=None,
                    capacity_bw=None) -> SlotBatch:
    """SlotBatch of one slot from the scheduler's view (``prada_jax.sched`` types).

    ``w``/``w̄`` are the threshold rule's own values (``sched.threshold.advantages``); expired
    candidates are not valid; ``fresh`` = valid with ``wait_slots == 0`` (a queued request has
    waited ≥ 1 slot); ``work`` = service slots ``max(1, ceil(delay_s / τ))``; capacities
    default to ``sp.num_servers`` and ``free_bw_hz`` (pass the env's B). x: SchedInputs [U];
    load: [K].
    """
    from prada_jax.sched.base import expired
    from prada_jax.sched.threshold import advantages

    w, w_bar, _ = advantages(x, sp)
    valid = x.candidate & ~expired(x, sp)
    tau = jnp.asarray(sp.tau_s, jnp.float32)
    work = jnp.maximum(jnp.ceil(x.delay_s.astype(jnp.float32) / tau), 1.0)
    cap_u = sp.num_servers if capacity_units is None else capacity_units
    cap_b = free_bw_hz if capacity_bw is None else capacity_bw
    return SlotBatch(w=w, w_bar=w_bar, b=x.bandwidth_hz.astype(jnp.float32), valid=valid,
                     free_units=jnp.asarray(free_units, jnp.float32),
                     free_bw=jnp.asarray(free_bw_hz, jnp.float32),
                     load=jnp.asarray(load, jnp.float32), work=work,
                     fresh=valid & (x.wait_slots == 0),
                     capacity_units=jnp.asarray(cap_u, jnp.float32),
                     capacity_bw=jnp.asarray(cap_b, jnp.float32))


def env_slot(state, action, params, noise):
    """``(cs, batch)``: the env's candidate set of this slot (``envs.edge.candidate_set``) and
    the learner's SlotBatch of it (capacities: the env's M_t and B_t of this slot under its
    scenario schedule, ``envs.edge.slot_conditions``)."""
    from envs import edge

    cs = edge.candidate_set(state, action, params, noise)
    load = load_features(cs.x, cs.free_units, state, params)
    cond = edge.slot_conditions(params, state.t)  # the scenario's M_t, B_t this slot
    batch = slot_from_sched(cs.x, cs.free_units, cs.free_bw_hz, edge.sched_params(params), load,
                            capacity_units=cond["num_servers"], capacity_bw=cond["bandwidth_hz"])
    return cs, batch


def edge_slot_inputs(state, action, params, noise):
    """``(x, free_units, free_bw_hz, load)`` of the slot (older interface of
    :func:`env_slot`)."""
    cs, batch = env_slot(state, action, params, noise)
    return cs.x, cs.free_units, cs.free_bw_hz, batch.load


def make_trace_rule_policy(threshold: float = 0.0):
    """A simple nomination rule for runs without a trained PPO policy (tests, smoke runs).

    It is *privileged*: it reads the trace's PRM scores of both candidates (which the real
    edge cannot see). ``gain = cand_prm[node, 1] − cand_prm[node, 0]`` (PRM units, no latency
    cost; the scheduler treats it as a ``coarse`` ΔQ) is carried to the server and the step is
    nominated iff ``gain > threshold``. Returns ``policy_fn(key, obs [U, D], state, params)``.
    """
    from envs import edge

    def policy_fn(key, obs, state, params):
        del key, obs
        cp = params.traces.cand_prm[state.node]
        gain = (cp[:, 1] - cp[:, 0]).astype(jnp.float32)
        return edge.EdgeAction(screen=(gain > threshold).astype(jnp.int32), gain=gain)

    return policy_fn


NOMINATE_BY = ("actor", "critic")


def make_ppo_policy(apply_fn, net_params, greedy: bool = True, nominate_by: str = "actor"):
    """The trained screening policy: ``apply_fn(params, obs) -> (logits [U,2], q [U,2])``.

    ``nominate_by="actor"``: nominates by argmax of the logits (``greedy``) or by sampling;
    ``"critic"``: nominates iff ΔQ > 0 (greedy with respect to the policy's own critic, so a
    nomination always carries a positive value; an actor whose critic disagrees with it has
    nominations with ΔQ < 0, which the threshold rule keeps local even at λ_s = µ = 0).
    Either way the nomination carries the critic's ΔQ = Q(s,1) − Q(s,0).
    Returns ``policy_fn(key, obs, state, params)``.
    """
    from envs import edge

    if nominate_by not in NOMINATE_BY:
        from prada_jax.errors import BadInput
        raise BadInput(f"config.policy.nominate_by must be one of {NOMINATE_BY}, got "
                       f"{nominate_by!r}")

    def policy_fn(key, obs, state, params):
        del state, params
        logits, q = apply_fn(net_params, obs)
        gain = (q[..., 1] - q[..., 0]).astype(jnp.float32)
        if nominate_by == "critic":
            screen = gain > 0
        else:
            screen = (jnp.argmax(logits, -1) if greedy
                      else jax.random.categorical(key, logits, axis=-1))
        return edge.EdgeAction(screen=screen.astype(jnp.int32), gain=gain)

    return policy_fn


class RolloutCarry(NamedTuple):
    """Scan carry of the env rollout: env_state [E, ...], obs [E, U, D], dual DualState,
    key (typed), slots (int32, slots simulated per env so far)."""

    env_state: Any
    obs: jax.Array
    dual: DualState
    key: jax.Array
    slots: jax.Array


def init_rollout(key, env_params, config: DualConfig, num_envs: int) -> RolloutCarry:
    """Resets ``num_envs`` edge envs and the dual state."""
    from envs import edge

    k_dual, k_reset, k_next = jax.random.split(key, 3)
    obs, env_state = jax.vmap(edge.reset, in_axes=(0, None))(
        jax.random.split(k_reset, num_envs), env_params)
    return RolloutCarry(env_state=env_state, obs=obs, dual=dual.init(config, k_dual),
                        key=k_next, slots=jnp.zeros((), jnp.int32))


def make_rollout(config: DualConfig, policy_fn, rollout_len: int, learn: bool = True):
    """``rollout(carry, env_params) -> (carry, out)``: ``rollout_len`` slots of E envs.

    Every env runs its scheduler (``env_params.scheduler``, the threshold rule for stage 2)
    with the current multipliers (per env and slot from its load features when conditioned).
    In the online modes the dual state is updated every slot on the E envs' slots (inside
    the scan); in the differentiable mode (or with ``learn=False``, for evaluation) it is left
    unchanged (see :func:`make_train_chunk`).

    ``out``: ``batch`` SlotBatch [T, E, U], ``x`` SchedInputs [T, E, U], ``lambda_s``/``mu``
    [T, E] used, ``reward`` [T, E] (sum over users), and per-slot env metrics [T, E]
    (``server_in_use``, ``bandwidth_in_use_hz``, ``queue_len``, ``finished``, ``correct``,
    ``latency_s`` (sum over finished users), ``blocked``), and the env's own
    ``decision`` / ``outage`` [T, E, U] (after its enforcement).
    """
    from envs import edge

    def _one_env(key, env_state, obs, dual_state, env_params):
        k_noise, k_pol = jax.random.split(key)
        noise = edge.draw_noise(k_noise, env_params)
        action = policy_fn(k_pol, obs, env_state, env_params)
        cs, batch = env_slot(env_state, action, env_params, noise)
        mult = dual.multipliers(dual_state, config,
                                batch.load if config.conditioned else None)
        p = env_params.replace(lambda_s=mult.lambda_s, mu=mult.mu)
        obs, env_state, reward, done, info = edge.step_with_noise(env_state, action, p, noise)
        stats = dict(reward=jnp.sum(reward), server_in_use=info["server_in_use"],
                     bandwidth_in_use_hz=info["bandwidth_in_use_hz"],
                     queue_len=info["queue_len"], blocked=info["blocked"],
                     finished=jnp.sum(done.astype(jnp.int32)),
                     correct=jnp.sum(info["user_correct"].astype(jnp.int32)),
                     latency_s=jnp.sum(info["user_latency_s"]),
                     decision=info["decision"], outage=info["outage"],
                     lambda_s=mult.lambda_s, mu=mult.mu)
        return env_state, obs, batch, cs.x, stats

    def _slot(carry: RolloutCarry, env_params):
        key, k_slot = jax.random.split(carry.key)
        keys = jax.random.split(k_slot, carry.obs.shape[0])
        env_state, obs, batch, x, stats = jax.vmap(_one_env, in_axes=(0, 0, 0, None, None))(
            keys, carry.env_state, carry.obs, carry.dual, env_params)
        dual_state = carry.dual
        if learn and config.mode != "differentiable":
            _, dual_state = dual.update(dual_state, batch, config)
        carry = RolloutCarry(env_state=env_state, obs=obs, dual=dual_state, key=key,
                             slots=carry.slots + 1)
        return carry, dict(batch=batch, x=x, **stats)

    def rollout(carry: RolloutCarry, env_params):
        return jax.lax.scan(lambda c, _: _slot(c, env_params), carry, None,
                            length=rollout_len)

    return rollout


def make_train_chunk(config: DualConfig, policy_fn, rollout_len: int, sgd_steps: int = 1):
    """``train_chunk(carry, env_params) -> (carry, metrics)``: one rollout, then learning.

    Online modes learn inside the rollout (one update per slot). The differentiable mode then
    takes ``sgd_steps`` optax steps on the relaxed long-run dual objective of all T·E
    collected slots. ``metrics`` (scalars): ``dual.metrics`` on the collected slots after
    learning, plus ``env/reward_per_slot`` (sum over users, mean over envs and slots),
    ``env/server_in_use``, ``env/bandwidth_in_use_hz``, ``env/queue_len``, ``env/finished``,
    ``env/accuracy`` and ``env/latency_s`` (over users finished in this chunk; NaN if none),
    ``env/blocked``, ``dual/candidates_per_slot``, and ``dual/rollout_*``: the multipliers each
    slot actually ran with and the long-run excess (before repair) they produced, averaged over
    the chunk; ``dual/load_mean`` [K] is the mean load-feature vector of the chunk (not a
    scalar).
    """
    rollout = make_rollout(config, policy_fn, rollout_len)

    def train_chunk(carry: RolloutCarry, env_params):
        carry, out = rollout(carry, env_params)
        batch = out["batch"]
        dual_state = carry.dual
        if config.mode == "differentiable":
            def _sgd(s, _):
                _, s = dual.update(s, batch, config)
                return s, None
            dual_state, _ = jax.lax.scan(_sgd, dual_state, None, length=sgd_steps)
        carry = carry._replace(dual=dual_state)
        m = dual.metrics(dual_state, batch, config)
        used = Multipliers(out["lambda_s"], out["mu"])  # [T, E], what each slot ran with
        e_used = dual.excess_demand(batch, used, utilisation=config.utilisation)
        w_used = dual.slot_weights(batch, config)
        fin = jnp.sum(out["finished"])
        wm = dual._weighted_mean  # noqa: SLF001 (same module family)
        m.update({
            "env/reward_per_slot": jnp.mean(out["reward"]),
            "env/server_in_use": jnp.mean(out["server_in_use"]),
            "env/bandwidth_in_use_hz": jnp.mean(out["bandwidth_in_use_hz"]),
            "env/queue_len": jnp.mean(out["queue_len"]),
            "env/finished": fin.astype(jnp.float32),
            "env/accuracy": jnp.sum(out["correct"]) / fin,
            "env/latency_s": jnp.sum(out["latency_s"]) / fin,
            "env/blocked": jnp.sum(out["blocked"]).astype(jnp.float32),
            "dual/candidates_per_slot": jnp.mean(jnp.sum(batch.valid, -1)),
            "dual/rollout_lambda_s": jnp.mean(used.lambda_s),
            "dual/rollout_mu_per_mhz": jnp.mean(used.mu) * 1e6,
            "dual/rollout_excess_units": wm(e_used[..., 0], w_used),
            "dual/rollout_excess_bw_hz": wm(e_used[..., 1], w_used),
            "dual/rollout_overflow_units": wm(jnp.maximum(e_used[..., 0], 0.0), w_used),
            "dual/load_mean": jnp.mean(batch.load.reshape(-1, batch.load.shape[-1]), axis=0),
        })
        return carry, m

    return train_chunk
