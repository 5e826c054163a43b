"""Learns the stage-2 multipliers λ_s and µ for one scenario on the host: ``train_and_evaluate``.

``train_and_evaluate(config, workdir, setup)`` is what ``python -m train.dual`` and
``train.main`` call (``config``: a ``prada_jax/configs/dual.py`` ConfigDict, validated once by
:func:`validate_config`, whose errors name the field). The trainer builds no env:
:func:`build_setup` receives the env (a ``prada_jax.dual.rollout.Stage2Env`` and its params)
and the nomination function from its caller, as PureJaxRL's ``make_train(config)`` receives
``env, env_params``, and derives the learner settings without writing anything. The env and
nominations a config names (the PPO policy of ``config.policy_dir`` or, if that is empty, the
privileged trace rule; tests / smoke runs only) are built by ``envs.stage2.build_setup``.
A run directory holds::

    <workdir>/config.json         resolved config (the one in force)
    <workdir>/run.json            provenance: when the run started / resumed, what changed
    <workdir>/checkpoints/<chunk>/ orbax: env states, observations, learner state, PRNG key
                                  (rerunning on the workdir checks the config against the
                                  stored one, then resumes exactly from the newest intact step)
    <workdir>/tb/                 TensorBoard curves (dual/*, env/*, perf/*, eval/gap_*),
                                  x = env slots (slots per env × envs)
    <workdir>/multipliers.json    λ_s (PRM units per server unit), µ (PRM units per Hz), ...;
                                  rewritten at every checkpoint (``prada_jax.dual.files``)
    <workdir>/gap.json            duality-gap report (``prada_jax.dual.gap``; end of the run,
                                  if eval.gap_slots > 0)

Measured numbers: docs/dual.md.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from prada_jax import config_utils, latency, run_state, runloop
from prada_jax.checkpointing import Checkpointer
from prada_jax.metric_writer import MetricWriter
from prada_jax.rl.screen import NOMINATE_BY
from prada_jax.dual import files, gap, learner
from prada_jax.dual.learner import DualConfig
from prada_jax.dual.measure import DEFAULT_TIMEOUT_SLOTS, censored_means
from prada_jax.dual.problem import Multipliers, excess_demand, weighted_mean
from prada_jax.dual.rollout import RolloutCarry, Stage2Env, cached, init_rollout, make_rollout
from prada_jax.traces import splits

_log = logging.getLogger(__name__)

# Fields that may change when a run is resumed (they only extend or observe it); everything
# else is compared with the stored config.json before anything is written (run_state).
OBSERVATIONAL = ("log.*", "train.num_chunks")


# ----------------------------------------------------------------------------- config

def validate_config(config) -> DualConfig:
    """Checks every field the trainer uses once; errors name the field. Returns the static
    DualConfig. The fields only the env can check (``env.scenario``, ``env.server_model``,
    ``dual.load_features`` against the env's features) are the env builder's
    (``envs.stage2.validate_env_config``)."""
    cu = config_utils
    cu.check_int(config, "seed", minimum=0)
    cu.check_positive(config, "env.bandwidth_hz", "env.tau_s")
    cu.check_nonnegative(config, "env.arrival_rate_hz", "env.beta")
    cu.check_int(config, "env.num_users", "env.num_servers", minimum=1)
    cu.check_int(config, "env.max_wait_slots", "env.problems", "env.trace_seed", minimum=0)
    cu.check_choice(config, "env.reward_mode", ("coarse", "true"))
    # (a stored config.json lacking a field added since holds its old value:
    # config_utils.ADDED_FIELDS, applied by read_config_json)
    splits.check_split_name(config.env.split, "config.env.split")
    if int(config.seed) + 1 >= splits.SEED_RANGE:
        raise cu.ConfigError(f"config.seed={config.seed}: must be < "
                             f"{splits.SEED_RANGE - 1} (the learner's seeds stay in the "
                             "seed range of config.env.split)")
    cu.check_int(config, "env.scenario_length", minimum=1)
    cu.check_positive(config, "env.server_speed")
    latency.check_pair(str(config.env.hardware), "config.env.hardware")
    cu.check_choice(config, "policy.nominate_by", NOMINATE_BY)
    if not config.env.trace_dir:
        cu.check_choice(config, "env.preset", ("gsm8k", "gaokao2023en", "mmlu_stem"))
    elif not Path(config.env.trace_dir).is_dir():
        raise cu.ConfigError(f"config.env.trace_dir {config.env.trace_dir!r} is not a folder")
    cu.check_int(config, "train.num_envs", "train.rollout_len", "train.num_chunks",
                 "train.sgd_steps", minimum=1)
    cu.check_int(config, "log.checkpoint_every", "log.keep_checkpoints", minimum=1)
    cu.check_int(config, "eval.gap_slots", minimum=0)
    cu.check_int(config, "eval.gap_envs", minimum=1)
    cu.check_int(config, "eval.env_chunks", minimum=0)
    try:
        dcfg = learner.config_from(config.dual)
    except ValueError as e:
        raise cu.ConfigError(str(e)) from None
    if learner.averaging(dcfg):  # online modes update once per slot
        horizon = int(config.train.num_chunks) * int(config.train.rollout_len)
        dcfg = dataclasses.replace(dcfg, average_horizon=horizon)
    return dcfg


def learner_seed(config) -> int:
    """The ``jax.random.key`` seed of the learner's rollouts: ``config.seed`` inside the seed
    range of the split it learns on (``prada_jax.traces.splits``): validation (the default: the
    multipliers are a choice) ``VALIDATION_SEED_BASE + seed``, test ``TEST_SEED_BASE + seed``,
    train / every problem ``seed``. The duality-gap measurement uses the next seed."""
    split = config.env.split or splits.ALL
    base = {"validation": splits.VALIDATION_SEED_BASE, "test": splits.TEST_SEED_BASE}
    return base.get(split, 0) + int(config.seed)


def policy_key(policy_info: dict):
    """Hashable identity of a policy: the trace rule's threshold, or a PPO run's resolved folder,
    checkpoint step and sampling mode (its parameters are baked into the compiled function, so
    runs of the same checkpoint in one process, e.g. ``studies.stage2_verdict``, share it)."""
    if policy_info.get("kind") == "trace_rule":
        return ("trace_rule", float(policy_info["threshold"]))
    if policy_info.get("kind") == "ppo" and int(policy_info.get("step", -1)) >= 0:
        return ("ppo", str(Path(policy_info["workdir"]).resolve()), int(policy_info["step"]),
                bool(policy_info.get("greedy", True)), policy_info.get("nominate_by", "actor"))
    return object()


# ----------------------------------------------------------------------------- setup

class Setup(NamedTuple):
    """Everything derived from a config (no state, nothing written)."""

    dcfg: DualConfig
    env: Stage2Env
    traces: Any
    trace_info: dict
    env_params: Any
    policy_fn: Callable
    policy_info: dict
    scenario: dict
    num_envs: int
    rollout_len: int
    num_chunks: int
    sgd_steps: int

    @property
    def slots_per_chunk(self) -> int:
        """Env slots one chunk simulates (slots per env × envs): the x axis of the curves."""
        return self.rollout_len * self.num_envs

    @property
    def policy_key(self):
        return policy_key(self.policy_info)

    def init_carry(self, seed: int) -> RolloutCarry:
        """Fresh envs and learner state for ``seed``."""
        return init_rollout(self.env, jax.random.key(seed), self.env_params, self.num_envs,
                            lambda k: learner.init(self.dcfg, k))


def build_setup(config, env_and_params: tuple, *, policy: tuple, traces: Any = None,
                trace_info: dict | None = None) -> Setup:
    """Validates the config once and builds the learner settings for the env; writes nothing.

    Args:
      env_and_params: ``(env, env_params)``: a :class:`prada_jax.dual.rollout.Stage2Env` and
        its params, running the threshold scheduler. The env a config names is built by
        ``envs.stage2.build_setup``.
      policy: ``(policy_fn, policy_info)``: the nomination function the rollouts run in every
        user slot and its record (``kind``, ``reward_mode``, ...; :func:`policy_key`).
      traces, trace_info: the env's trace set and its record (``synthetic``, ``split``, ...).
    """
    dcfg = validate_config(config)
    env, env_params = env_and_params
    policy_fn, policy_info = policy
    if trace_info is None:   # a caller's env: its data are unknown, never reported as real
        trace_info = {"source": "given", "synthetic": True}
    e = config.env
    scenario = {"traces": trace_info, "policy": policy_info,
                "num_users": int(e.num_users), "num_servers": int(e.num_servers),
                "bandwidth_hz": float(e.bandwidth_hz),
                "arrival_rate_hz": float(e.arrival_rate_hz),
                "beta": float(e.beta), "tau_s": float(e.tau_s),
                "scenario": str(e.scenario), "scenario_length": int(e.scenario_length)}
    hw = str(e.hardware)
    if hw != latency.PAPER:   # absent = paper (multipliers learned before pairs existed)
        scenario["hardware"] = hw
    t = config.train
    return Setup(dcfg=dcfg, env=env, traces=traces, trace_info=trace_info, env_params=env_params,
                 policy_fn=policy_fn, policy_info=policy_info, scenario=scenario,
                 num_envs=int(t.num_envs), rollout_len=int(t.rollout_len),
                 num_chunks=int(t.num_chunks), sgd_steps=int(t.sgd_steps))


# ----------------------------------------------------------------------------- one chunk

def learner_mult_fn(config: DualConfig):
    """``mult_fn`` of a rollout priced by the learner: its current multipliers (per env and
    slot from the slot's load features when conditioned)."""
    def mult_fn(state, batch):
        return learner.multipliers(state, config, batch.load if config.conditioned else None)
    return mult_fn


def make_train_chunk(config: DualConfig, env: Stage2Env, policy_fn, rollout_len: int,
                     sgd_steps: int = 1):
    """``train_chunk(carry, env_params) -> (carry, metrics)``: one rollout, then learning.

    Online modes learn inside the rollout (one update per slot). The differentiable mode then
    takes ``sgd_steps`` optax steps on the relaxed long-run dual objective of all T·E
    collected slots. ``metrics`` (scalars): ``learner.metrics`` on the collected slots after
    learning, plus ``env/reward_per_slot`` (sum over users, mean over envs and slots),
    ``env/server_in_use``, ``env/bandwidth_in_use_hz``, ``env/queue_len``, and per arrival,
    by the rule of ``evals`` (``prada_jax.dual.measure``; the envs start empty):
    ``env/accuracy`` and ``env/latency_s`` over the users resolved in this chunk — finished
    within the timeout D (``measure.DEFAULT_TIMEOUT_SLOTS``), unfinished D slots after
    arriving, or blocked — the last two at accuracy 0 and latency D·τ (NaN if none resolved);
    ``env/finished`` (within D), ``env/timed_out``, ``env/blocked``, ``env/arrivals`` (counts
    in the chunk), ``dual/candidates_per_slot``, and ``dual/rollout_*``: the multipliers each
    slot actually ran with and the long-run occupancy excess (before repair,
    ``problem.excess_demand``: busy unit-slots asked − ρ·M) they produced, averaged over the
    chunk; ``dual/load_mean`` [K] is the mean load-feature vector of the chunk (not a
    scalar).
    """
    online = config.mode != "differentiable"
    learn_fn = (lambda s, b: learner.update(s, b, config)[1]) if online else None
    rollout = make_rollout(env, policy_fn, rollout_len, learner_mult_fn(config), learn_fn)

    def train_chunk(carry: RolloutCarry, env_params):
        carry, out = rollout(carry, env_params)
        batch = out["batch"]
        state = carry.prices
        if not online:
            def _sgd(s, _):
                return learner.update(s, batch, config)[1], None
            state, _ = jax.lax.scan(_sgd, state, None, length=sgd_steps)
        carry = carry._replace(prices=state)
        m = learner.metrics(state, batch, config)
        used = Multipliers(out["lambda_s"], out["mu"])  # [T, E], what each slot ran with
        e_used = excess_demand(batch, used, utilisation=config.utilisation)
        w_used = learner.slot_weights(batch, config)
        blocked, timed_out, ok = (jnp.sum(out[k]) for k in ("blocked", "timed_out", "ok"))
        acc, lat = censored_means(ok + timed_out + blocked, ok, jnp.sum(out["ok_correct"]),
                                  jnp.sum(out["ok_latency_s"]),
                                  DEFAULT_TIMEOUT_SLOTS * env_params.tau_s)
        m.update({
            "env/reward_per_slot": jnp.mean(out["reward"]),
            "env/server_in_use": jnp.mean(out["server_in_use"]),
            "env/bandwidth_in_use_hz": jnp.mean(out["bandwidth_in_use_hz"]),
            "env/queue_len": jnp.mean(out["queue_len"]),
            "env/finished": ok.astype(jnp.float32),
            "env/accuracy": acc,
            "env/latency_s": lat,
            "env/timed_out": timed_out.astype(jnp.float32),
            "env/blocked": blocked.astype(jnp.float32),
            "env/arrivals": jnp.sum(out["arrivals"]).astype(jnp.float32),
            "dual/candidates_per_slot": jnp.mean(jnp.sum(batch.valid, -1)),
            "dual/rollout_lambda_s": jnp.mean(used.lambda_s),
            "dual/rollout_mu_per_mhz": jnp.mean(used.mu) * 1e6,
            "dual/rollout_excess_units": weighted_mean(e_used[..., 0], w_used),
            "dual/rollout_excess_bw_hz": weighted_mean(e_used[..., 1], w_used),
            "dual/rollout_overflow_units": weighted_mean(jnp.maximum(e_used[..., 0], 0.0),
                                                         w_used),
            "dual/load_mean": jnp.mean(batch.load.reshape(-1, batch.load.shape[-1]), axis=0),
        })
        return carry, m

    return train_chunk


def _scalars(m) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in jax.device_get(m).items() if np.size(v) == 1}


def final_multipliers(state, dcfg: DualConfig, load_mean) -> Multipliers:
    """The constant pair a run exports, as plain floats: a conditioned map at ``load_mean``
    [K], else ``learner.export_multipliers`` (the averaged iterate in the online modes)."""
    if dcfg.conditioned:
        m = learner.multipliers(state, dcfg, jnp.asarray(load_mean, jnp.float32))
    else:
        m = learner.export_multipliers(state, dcfg)
    return Multipliers(float(m.lambda_s), float(m.mu))


# ----------------------------------------------------------------------------- host loop

def train_and_evaluate(config, workdir, setup: Setup | None = None, *,
                       max_chunks: int | None = None) -> dict:
    """Learns the multipliers with the shared host loop (``prada_jax.runloop``); writes
    checkpoints, curves, multipliers.json and gap.json.

    On an existing workdir the stored ``config.json`` is checked first
    (``prada_jax.run_state``; only ``OBSERVATIONAL`` fields may change, recorded in
    ``run.json``), then the newest intact checkpoint is restored. ``setup``:
    :func:`build_setup`'s result for ``config`` and its env (for the env a config names,
    ``envs.stage2.build_setup``; a launcher builds it once to report bad input before
    anything is written).

    Returns a dict with ``chunk``, ``multipliers``, ``dual_state`` (the learner's final state:
    a conditioned map is evaluated from it), the last chunk's ``scalars`` (the stored final
    ones for a finished run rerun), ``finished``, ``stopped_by``, ``start_chunk`` (and ``gap``
    if evaluated in this call).

    Raises:
      ConfigError / ConfigMismatch / CheckpointError (``BadInput``): before anything is written.
      errors.NonFiniteTraining: a logged value (or the state at a save) went non-finite; the
        last good checkpoint is kept.
    """
    if setup is None:
        raise TypeError("train_and_evaluate needs the setup: the trainer builds no env "
                        "(envs.stage2.build_setup builds a config's)")
    if not workdir:
        raise config_utils.ConfigError("--workdir is required")
    check = run_state.check_resume(config, workdir, OBSERVATIONAL)
    dcfg = setup.dcfg
    workdir = config_utils.prepare_workdir(workdir)

    chunk_fn = cached(("chunk", dcfg, setup.env, setup.rollout_len, setup.sgd_steps,
                       setup.policy_key),
                      lambda: jax.jit(make_train_chunk(dcfg, setup.env, setup.policy_fn,
                                                       setup.rollout_len, setup.sgd_steps)))
    carry = setup.init_carry(learner_seed(config))
    ckpt = Checkpointer(workdir / "checkpoints", save_every=int(config.log.checkpoint_every),
                        max_to_keep=int(config.log.keep_checkpoints))
    try:
        carry, meta0, start = runloop.restore_or_init(ckpt, carry)
    except BaseException:
        ckpt.close()
        raise
    # Only now that the checkpoint restored (a template mismatch or an unusable checkpoint
    # raises above) is config.json rewritten and the provenance entry appended.
    run_state.commit(config, workdir, check)
    if start:
        _log.info("resumed %s at chunk %d", workdir, start)
    host = {"load_mean": np.asarray(meta0.get("load_mean",
                                              np.zeros(setup.env.load_features)), np.float32)}
    num_chunks, slots_per_chunk = setup.num_chunks, setup.slots_per_chunk
    info = {"mode": dcfg.mode, "conditioned": dcfg.conditioned,
            "rule": "admission_price", "scenario": setup.scenario,
            "synthetic_traces": bool(setup.trace_info["synthetic"])}

    def scalars_fn(m, chunk, wall_s):
        scalars = _scalars(m)
        host["load_mean"] = np.asarray(m["dual/load_mean"])
        if wall_s is not None:   # the first chunk of a process compiles: no rate point
            scalars["perf/chunks_per_s"] = 1.0 / max(wall_s, 1e-9)
        return scalars

    def meta_fn(carry, chunk, sc):
        return {"chunk": chunk, "env_slots": chunk * slots_per_chunk,
                "load_mean": [float(v) for v in np.ravel(host["load_mean"])],
                "scalars": sc[0] if sc else {}}

    def after_save(carry, chunk, meta):
        mult = final_multipliers(carry.prices, dcfg, host["load_mean"])
        files.save_multipliers(workdir, mult, dict(info, chunk=chunk, env_slots=meta["env_slots"],
                                                   final=chunk == num_chunks))

    with MetricWriter(workdir / "tb") as writer:
        if start == 0:
            writer.write_texts(0, {"config": config_utils.config_to_json(config)})
        try:
            res = runloop.run(
                carry, lambda c, _: chunk_fn(c, setup.env_params), start=start,
                total=num_chunks, max_calls=max_chunks, writers=[writer], ckpt=ckpt,
                scalars_fn=scalars_fn, x_fn=lambda c, chunk: chunk * slots_per_chunk,
                # accuracy / latency are NaN in a chunk where no user resolved: not an error
                # (such points are just not written)
                check=lambda tag: tag not in ("env/accuracy", "env/latency_s"),
                meta_fn=meta_fn, after_save=after_save, progress=bool(config.log.progress),
                desc="dual", unit="chunk", step_name="chunks",
                postfix_fn=lambda sc: {"lam": f"{sc[0]['dual/lambda_s']:.4f}",
                                       "mu_mhz": f"{sc[0]['dual/mu_per_mhz']:.4f}"})
        finally:
            ckpt.close()
        carry, stop = res.state, res.step
        result = {"chunk": stop, "scalars": res.scalars[0] if res.scalars
                  else dict(meta0.get("scalars") or {}), "finished": res.finished,
                  "stopped_by": res.stopped_by, "start_chunk": start,
                  "dual_state": carry.prices,
                  "split": setup.trace_info.get("split", "all"),
                  "seed_range_start": learner_seed(config)}
        if start == stop and (workdir / files.MULTIPLIERS_FILE).is_file():
            result["multipliers"] = files.load_multipliers(workdir)
        else:
            result["multipliers"] = final_multipliers(carry.prices, dcfg, host["load_mean"])
        if stop == num_chunks and int(config.eval.gap_slots) > 0 and (
                start < stop or not (workdir / files.GAP_FILE).is_file()):
            report = gap.measure_gap(setup.env, setup.env_params, setup.policy_fn,
                                     result["multipliers"],
                                     int(config.eval.gap_slots), int(config.eval.gap_envs),
                                     seed=learner_seed(config) + 1, policy_key=setup.policy_key,
                                     env_chunks=int(config.eval.env_chunks))
            files.save_gap(workdir / files.GAP_FILE, dict(report, scenario=setup.scenario))
            writer.write_scalars(stop * slots_per_chunk,
                                 {f"eval/gap_{k}": v for k, v in report.items()
                                  if isinstance(v, float) and math.isfinite(v)})
            result["gap"] = report
    return result


def summary_lines(result: dict) -> list[str]:
    """The closing lines of a run (``train_and_evaluate``'s result): its status and
    multipliers, then, if the gap was measured in this call, its mean and 5th percentile."""
    m = result["multipliers"]
    head = runloop.status_head(result.get("stopped_by"), bool(result.get("finished")),
                               result.get("start_chunk") == result["chunk"])
    lines = [f"{head}: chunk {result['chunk']}, lambda_s {m.lambda_s:.5f} PRM units/server "
             f"unit, mu {m.mu * 1e6:.5f} PRM units/MHz"
             + (f" (learned on the {result['split']} split)" if "split" in result else "")]
    if "gap" in result and result.get("stopped_by") not in ("SIGINT", "SIGTERM"):
        g = result["gap"]
        lines.append(f"duality gap (threshold/oracle value, {g['positive_slots']} slots): mean "
                     f"{g['mean']:.4f}, p5 {g['p5']:.4f}; with lambda=mu=0: mean "
                     f"{g['zero_mean']:.4f}, p5 {g['zero_p5']:.4f}")
    return lines
