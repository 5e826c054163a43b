"""The edge env's stage 2 for the dual trainer: its slots as the learner's batches, the
nomination functions its user slots run, and the env a ``prada_jax/configs/dual.py`` config
names.

The dual trainer (``prada_jax.dual.trainer``) and its rollouts (``prada_jax.dual.rollout``,
``prada_jax.dual.gap``) build no env: they take a ``prada_jax.dual.rollout.Stage2Env`` (the
env's pure functions) and its params, as PureJaxRL's ``make_train(config)`` receives
``env, env_params``. :data:`EDGE` is the edge env's (``envs.edge``), with :func:`env_slot`
turning a slot into a ``prada_jax.dual.problem.SlotBatch``. A ``policy_fn(key, obs [U, D],
state, params) -> envs.edge.EdgeAction`` says which drafts are nominated for server
recompute and the gain the threshold rule ranks them by (:func:`make_ppo_policy`: the trained
policy through the one network → nomination helper, ``prada_jax.rl.screen``;
:func:`make_trace_rule_policy`: a privileged rule for tests and smoke runs).

    setup = stage2.build_setup(config)                 # validates, builds env and policy
    trainer.train_and_evaluate(config, workdir, setup)
"""
from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from envs import edge, registry, scenarios
from envs.edge import REWARD_MODES, SERVER_MODELS
from prada_jax import config_utils
from prada_jax.dual import trainer
from prada_jax.dual.problem import SlotBatch, finite_candidates
from prada_jax.dual.rollout import Stage2Env
from prada_jax.errors import BadInput
from prada_jax.rl import policy as rl_policy
from prada_jax.rl.screen import check_nominate_by, screen_and_gain
from prada_jax.sched.base import expired
from prada_jax.sched.threshold import advantages
from prada_jax.traces.loader import load_config_traces

__all__ = ["LOAD_FEATURES", "load_features", "slot_from_sched", "env_slot", "EDGE",
           "make_trace_rule_policy", "make_ppo_policy", "validate_env_config",
           "policy_reward_mode", "build_env_params", "build_policy", "build_setup"]

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
    waited ≥ 1 slot); ``work`` = service slots ``envs.edge.phase_slots`` (``max(1, ceil(delay_s /
    τ))``, capped as the env caps it; 1 where not valid); capacities
    default to ``sp.num_servers`` and ``free_bw_hz`` (pass the env's B). x: SchedInputs [U];
    load: [K].
    """
    w, w_bar, _ = advantages(x, sp)
    w, w_bar, valid = finite_candidates(w, w_bar, x.candidate & ~expired(x, sp))
    tau = jnp.asarray(sp.tau_s, jnp.float32)
    # The env's own count of the slots a job holds (capped, so an infinite delay is finite);
    # 1 for the slots that are not candidates, whose delay may be anything (inf · 0 would
    # make the long-run excess NaN).
    work = jnp.where(valid, edge.phase_slots(x.delay_s.astype(jnp.float32), tau), 1)
    work = work.astype(jnp.float32)
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
    cs = edge.candidate_set(state, action, params, noise)
    load = load_features(cs.x, cs.free_units, state, params)
    cond = edge.slot_conditions(params, state.t)  # the scenario's M_t, B_t this slot
    batch = slot_from_sched(cs.x, cs.free_units, cs.free_bw_hz, edge.sched_params(params), load,
                            capacity_units=cond["num_servers"], capacity_bw=cond["bandwidth_hz"])
    return cs, batch


#: The edge env as the stage-2 rollouts run it.
EDGE = Stage2Env(reset=edge.reset, draw_noise=edge.draw_noise,
                 step_with_noise=edge.step_with_noise, slot=env_slot,
                 sched_params=edge.sched_params, load_features=LOAD_FEATURES)


# ----------------------------------------------------------------------------- nominations

def make_trace_rule_policy(threshold: float = 0.0):
    """A simple nomination rule for runs without a trained PPO policy (tests, smoke runs).

    It is *privileged*: it reads the trace's PRM scores of both candidates (which the real
    edge cannot see). ``gain = cand_prm[node, 1] − cand_prm[node, 0]`` (PRM units, no latency
    cost; the scheduler treats it as a ``coarse`` ΔQ) is carried to the server and the step is
    nominated iff ``gain > threshold``.
    """
    def policy_fn(key, obs, state, params):
        del key, obs
        cp = params.traces.cand_prm[state.node]
        gain = (cp[:, 1] - cp[:, 0]).astype(jnp.float32)
        return edge.EdgeAction(screen=(gain > threshold).astype(jnp.int32), gain=gain)

    return policy_fn


def make_ppo_policy(apply_fn, net_params, greedy: bool = True, nominate_by: str = "actor"):
    """The trained screening policy ``apply_fn(params, obs) -> (logits [U,2], q [U,2])``,
    nominating by its actor (argmax if ``greedy``, else a sample) or by its critic (ΔQ > 0),
    as ``prada_jax.rl.screen.screen_and_gain``; the nomination carries the critic's ΔQ. An
    unknown ``nominate_by`` raises ``BadInput`` naming ``config.policy.nominate_by``."""
    check_nominate_by(nominate_by)

    def policy_fn(key, obs, state, params):
        del state, params
        screen, gain = screen_and_gain(apply_fn, net_params, obs, key, greedy, nominate_by)
        return edge.EdgeAction(screen=screen, gain=gain)

    return policy_fn


# ----------------------------------------------------------------------------- from a config

def validate_env_config(config) -> None:
    """Checks the fields that need the edge env to check (``env.scenario``,
    ``env.server_model``, ``dual.load_features`` when conditioned); raises ``ConfigError``
    naming the field. The trainer checks the rest (``prada_jax.dual.trainer.validate_config``).
    """
    cu = config_utils
    cu.check_choice(config, "env.scenario", tuple(scenarios.PRESETS))
    cu.check_choice(config, "env.server_model", SERVER_MODELS)
    if config.dual.conditioned and int(config.dual.load_features) != LOAD_FEATURES:
        raise cu.ConfigError(f"config.dual.load_features must be {LOAD_FEATURES} "
                             f"for the edge env, got {config.dual.load_features}")


def policy_reward_mode(config, meta: dict | None = None) -> str:
    """The reward the screening policy was trained with (``coarse`` or ``true``), which decides
    what the threshold rule adds to its ΔQ (``prada_jax.sched.threshold``).

    Read from ``<policy_dir>/policy_meta.json`` (``reward_mode``), or from ``meta`` (that file's
    contents, already read) when given. A policy written before the
    field is taken as ``coarse`` (the stage-1 default of prada_jax/configs/ppo.py at the time). The
    privileged trace rule (no ``policy_dir``) carries a bare PRM difference and is treated as
    ``coarse``. An unknown value raises ``errors.BadInput`` naming the file.
    """
    if not config.policy_dir:
        return "coarse"
    if meta is None:
        meta = rl_policy.read_policy_meta(config.policy_dir)
    mode = meta.get("reward_mode", "coarse")
    if mode not in REWARD_MODES:
        raise BadInput(f"{Path(config.policy_dir) / rl_policy.POLICY_META_FILE}: reward_mode "
                       f"must be one of {REWARD_MODES}, got {mode!r}")
    return mode


def build_env_params(config, traces, reward_mode: str | None = None):
    """Edge env params of the scenario, running the threshold scheduler with the value
    accounting of the policy's training reward ``reward_mode`` (default: read by
    :func:`policy_reward_mode`)."""
    if reward_mode is None:
        reward_mode = policy_reward_mode(config)
    e = config.env
    scn = scenarios.preset(e.scenario, int(e.scenario_length))
    _, params = registry.make(
        "edge", traces=traces, num_users=int(e.num_users), scheduler="threshold",
        num_servers=int(e.num_servers), bandwidth_hz=float(e.bandwidth_hz),
        arrival_rate_hz=float(e.arrival_rate_hz), beta=float(e.beta), tau_s=float(e.tau_s),
        max_wait_slots=int(e.max_wait_slots), reward_mode=e.reward_mode,
        policy_reward_mode=reward_mode, scenario=scn,
        hardware=str(e.hardware), server_model=str(e.server_model),
        **scenarios.latency_overrides({"server_speed": e.server_speed}))
    return params


def build_policy(config, traces):
    """``(policy_fn, info)``: the PPO policy of ``config.policy_dir`` or the trace rule;
    ``info["reward_mode"]`` is the policy's training reward (:func:`policy_reward_mode` of the
    ``policy_meta.json`` that loading the policy read)."""
    if not config.policy_dir:
        thr = float(config.policy.rule_threshold)
        return make_trace_rule_policy(thr), {
            "kind": "trace_rule", "threshold": thr, "note": "privileged: reads cand_prm",
            "reward_mode": "coarse"}
    policy, _ = rl_policy.load_policy(config.policy_dir)
    rl_policy.check_traces_match(policy.meta, traces, where=f"--policy={config.policy_dir}")
    nominate_by = str(config.policy.nominate_by)
    fn = make_ppo_policy(policy.apply_fn, policy.params, greedy=bool(config.policy.greedy),
                         nominate_by=nominate_by)
    return fn, {"kind": "ppo", "workdir": str(config.policy_dir), "nominate_by": nominate_by,
                "step": int(policy.meta.get("step", -1)), "greedy": bool(config.policy.greedy),
                "reward_mode": policy_reward_mode(config, policy.meta)}


def build_setup(config) -> trainer.Setup:
    """Validates the config once and builds the traces, the policy and the edge env's params,
    then the trainer's ``Setup`` for them (``prada_jax.dual.trainer.build_setup``; the policy
    run's ``policy_meta.json`` is read once); writes nothing."""
    trainer.validate_config(config)
    validate_env_config(config)
    traces, trace_info = load_config_traces(config)
    policy_fn, policy_info = build_policy(config, traces)
    env_params = build_env_params(config, traces, policy_info["reward_mode"])
    return trainer.build_setup(config, (EDGE, env_params), policy=(policy_fn, policy_info),
                               traces=traces, trace_info=trace_info)
