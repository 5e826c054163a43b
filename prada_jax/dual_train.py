"""Stage-2 training library: learns the multipliers λ_s and µ for one scenario over edge-env
rollouts and measures the duality gap of the resulting hard threshold rule.

``train_and_evaluate(config, workdir)`` is what ``python -m train.dual`` calls (``config`` is a
``prada_jax/configs/dual.py`` ConfigDict, validated once by ``validate_config``, whose errors name
the field). Nominations come from the PPO policy of ``config.policy_dir``
(``prada_jax.rl.policy.load_policy``) or, if that is empty, from the privileged trace rule of
``prada_jax.dual_rollout.make_trace_rule_policy`` (tests / smoke runs only). A run directory holds::

    <workdir>/config.json         resolved config (the one in force)
    <workdir>/run.json            provenance: when the run started / resumed, what changed
    <workdir>/checkpoints/<chunk>/ orbax: env states, observations, dual state, PRNG key
                                  (rerunning on the workdir checks the config against the
                                  stored one, then resumes exactly from the newest intact step)
    <workdir>/tb/                 TensorBoard curves (dual/*, env/*, perf/*, eval/gap_*),
                                  x = env slots (slots per env × envs)
    <workdir>/multipliers.json    λ_s (PRM units per server unit), µ (PRM units per Hz), ...;
                                  rewritten at every checkpoint
    <workdir>/gap.json            duality-gap report (end of the run, if eval.gap_slots > 0)

The duality gap (``measure_gap``) is the per-slot value of the hard threshold decision with the
learned multipliers (after its feasibility repair) as a fraction of the exact oracle's
(``prada_jax.sched.oracle``), with λ_s = µ = 0 on the same slots as a reference.
``load_multipliers(workdir) -> Multipliers(lambda_s, mu)`` (µ per Hz) is the export for
evaluation. Measured numbers: docs/dual.md. No flags are defined here: importing this module
from another absl program is safe.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from prada_jax import config_utils
from prada_jax import dual
from prada_jax import dual_rollout
from prada_jax.errors import NonFiniteTraining
from prada_jax.dual import load_multipliers
from prada_jax.errors import BadInput

__all__ = ["GAP_FILE", "OBSERVATIONAL", "NonFiniteError", "validate_config", "load_traces", "build_env_params",
           "build_policy", "train_and_evaluate", "collect_slots", "threshold_decisions",
           "measure_gap", "load_multipliers", "queue_price", "rollout_stats",
           "policy_reward_mode"]

GAP_FILE = "gap.json"

_log = logging.getLogger(__name__)


# A logged value went NaN/inf (exit 3); the last good checkpoint is kept. Kept as a name for
# older callers: the host loop raises ``errors.NonFiniteTraining``.
NonFiniteError = NonFiniteTraining


# ----------------------------------------------------------------------------- config

def validate_config(config) -> dual.DualConfig:
    """Checks every field once; errors name the field. Returns the static DualConfig."""
    cu = config_utils
    cu.check_int(config, "seed", minimum=0)
    cu.check_positive(config, "env.bandwidth_hz", "env.tau_s")
    cu.check_nonnegative(config, "env.arrival_rate_hz", "env.beta")
    cu.check_int(config, "env.num_users", "env.num_servers", minimum=1)
    cu.check_int(config, "env.max_wait_slots", "env.problems", "env.trace_seed", minimum=0)
    cu.check_choice(config, "env.reward_mode", ("coarse", "true"))
    if "scenario" in config.env:  # absent from config.json files written before it
        from envs import scenarios
        cu.check_choice(config, "env.scenario", tuple(scenarios.PRESETS))
        cu.check_int(config, "env.scenario_length", minimum=1)
    if "nominate_by" in config.policy:  # absent from config.json files written before it
        cu.check_choice(config, "policy.nominate_by", dual_rollout.NOMINATE_BY)
    if not config.env.trace_dir:
        cu.check_choice(config, "env.preset", ("gsm8k", "gaokao2023en", "mmlu_stem"))
    elif not Path(config.env.trace_dir).is_dir():
        raise cu.ConfigError(f"config.env.trace_dir {config.env.trace_dir!r} is not a folder")
    cu.check_int(config, "train.num_envs", "train.rollout_len", "train.num_chunks",
                 "train.sgd_steps", minimum=1)
    cu.check_int(config, "log.checkpoint_every", "log.keep_checkpoints", minimum=1)
    cu.check_int(config, "eval.gap_slots", minimum=0)
    cu.check_int(config, "eval.gap_envs", minimum=1)
    if "env_chunks" in config.eval:  # absent from config.json files written before it
        cu.check_int(config, "eval.env_chunks", minimum=0)
    if (config.dual.conditioned
            and int(config.dual.load_features) != dual_rollout.LOAD_FEATURES):
        raise cu.ConfigError(f"config.dual.load_features must be {dual_rollout.LOAD_FEATURES} "
                             f"for the edge env, got {config.dual.load_features}")
    try:
        dcfg = dual.config_from(config.dual)
        if dual.averaging(dcfg):  # online modes update once per slot
            horizon = int(config.train.num_chunks) * int(config.train.rollout_len)
            dcfg = dataclasses.replace(dcfg, average_horizon=horizon)
        return dcfg
    except ValueError as e:
        raise cu.ConfigError(str(e)) from None


def load_traces(config):
    """``(traces, info)``: ``env.trace_dir`` if set, else the synthetic preset (the shared
    loader ``prada_jax.traces.loader.load_config_traces``)."""
    from prada_jax.traces.loader import load_config_traces

    return load_config_traces(config)


def queue_price(config) -> bool:
    """Always True: the threshold rule charges the admission price to queueing too
    (``config.dual.queue_price`` is kept only so older configs load)."""
    del config
    return True


def policy_reward_mode(config) -> str:
    """The reward the screening policy was trained with (``coarse`` or ``true``), which decides
    what the threshold rule adds to its ΔQ (``prada_jax.sched.threshold``).

    Read from ``<policy_dir>/policy_meta.json`` (``reward_mode``). A policy written before the
    field is taken as ``coarse`` (the stage-1 default of prada_jax/configs/ppo.py at the time). The
    privileged trace rule (no ``policy_dir``) carries a bare PRM difference and is treated as
    ``coarse``. An unknown value raises ``errors.BadInput`` naming the file.
    """
    if not config.policy_dir:
        return "coarse"
    from envs.edge import REWARD_MODES
    from prada_jax.rl import policy as policy_files

    meta = policy_files.read_policy_meta(config.policy_dir)
    mode = meta.get("reward_mode", "coarse")
    if mode not in REWARD_MODES:
        raise BadInput(f"{Path(config.policy_dir) / policy_files.POLICY_META_FILE}: reward_mode "
                       f"must be one of {REWARD_MODES}, got {mode!r}")
    return mode


def build_env_params(config, traces):
    """Edge env params of the scenario, running the threshold scheduler with the value
    accounting of the policy's training reward (:func:`policy_reward_mode`)."""
    from envs import registry

    from envs import scenarios

    e = config.env
    scn = scenarios.preset(e.get("scenario", "nominal"),
                           int(e.get("scenario_length", scenarios.DEFAULT_LENGTH)))
    _, params = registry.make(
        "edge", traces=traces, num_users=int(e.num_users), scheduler="threshold",
        num_servers=int(e.num_servers), bandwidth_hz=float(e.bandwidth_hz),
        arrival_rate_hz=float(e.arrival_rate_hz), beta=float(e.beta), tau_s=float(e.tau_s),
        max_wait_slots=int(e.max_wait_slots), reward_mode=e.reward_mode,
        policy_reward_mode=policy_reward_mode(config), scenario=scn)
    return params


def build_policy(config, traces):
    """``(policy_fn, info)``: the PPO policy of ``config.policy_dir`` or the trace rule."""
    if not config.policy_dir:
        thr = float(config.policy.rule_threshold)
        return dual_rollout.make_trace_rule_policy(thr), {
            "kind": "trace_rule", "threshold": thr, "note": "privileged: reads cand_prm",
            "reward_mode": "coarse"}
    from prada_jax.rl import policy as policy_files

    policy, ppo_config = policy_files.load_policy(config.policy_dir)
    policy_files.check_traces_match(policy.meta, traces, where=f"--policy={config.policy_dir}")
    nominate_by = str(config.policy.get("nominate_by", "actor"))
    fn = dual_rollout.make_ppo_policy(policy.apply_fn, policy.params,
                                      greedy=bool(config.policy.greedy),
                                      nominate_by=nominate_by)
    return fn, {"kind": "ppo", "workdir": str(config.policy_dir), "nominate_by": nominate_by,
                "step": int(policy.meta.get("step", -1)), "greedy": bool(config.policy.greedy),
                "reward_mode": policy_reward_mode(config)}


# ----------------------------------------------------------------------------- training

# Jitted functions reused by later calls in the same process with the same static settings
# (tests, resumption, train.main's stages): a new closure would trace and compile again.
_JIT_CACHE: dict = {}


def _policy_key(policy_info: dict):
    """Hashable identity of a policy: the trace rule's threshold, or a PPO run's resolved folder,
    checkpoint step and sampling mode (its parameters are baked into the compiled function, so
    runs of the same checkpoint in one process, e.g. ``evals.stage2``, share it)."""
    if policy_info.get("kind") == "trace_rule":
        return ("trace_rule", float(policy_info["threshold"]))
    if policy_info.get("kind") == "ppo" and int(policy_info.get("step", -1)) >= 0:
        return ("ppo", str(Path(policy_info["workdir"]).resolve()), int(policy_info["step"]),
                bool(policy_info.get("greedy", True)), policy_info.get("nominate_by", "actor"))
    return object()


def _cached(key, build):
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = build()
    return _JIT_CACHE[key]


def _scalars(m) -> dict[str, float]:
    return {k: float(np.asarray(v)) for k, v in jax.device_get(m).items() if np.size(v) == 1}


def _final_multipliers(carry: dual_rollout.RolloutCarry, dcfg: dual.DualConfig, load_mean):
    if dcfg.conditioned:
        m = dual.multipliers(carry.dual, dcfg, jnp.asarray(load_mean, jnp.float32))
    else:
        m = dual.export_multipliers(carry.dual, dcfg)  # averaged iterate (online modes)
    return dual.Multipliers(float(m.lambda_s), float(m.mu))


# Fields that may change when a run is resumed (they only extend or observe it); everything
# else is compared with the stored config.json before anything is written (run_state).
OBSERVATIONAL = ("log.*", "train.num_chunks")


def train_and_evaluate(config, workdir, *, max_chunks: int | None = None) -> dict:
    """Learns the multipliers with the shared host loop (``prada_jax.runloop``); writes
    checkpoints, curves, multipliers.json and gap.json.

    On an existing workdir the stored ``config.json`` is checked first
    (``prada_jax.run_state``; only ``OBSERVATIONAL`` fields may change, recorded in
    ``run.json``), then the newest intact checkpoint is restored.

    Returns a dict with ``chunk``, ``multipliers``, ``dual_state`` (the learner's final
    ``dual.DualState``: a conditioned map is evaluated from it), the last chunk's ``scalars``
    (the stored final ones for a finished run rerun), ``finished``, ``stopped_by``,
    ``start_chunk`` (and ``gap`` if evaluated in this call).

    Raises:
      ConfigError / ConfigMismatch / CheckpointError (``BadInput``): before anything is written.
      errors.NonFiniteTraining: a logged value (or the state at a save) went non-finite; the
        last good checkpoint is kept.
    """
    from prada_jax import run_state, runloop
    from prada_jax.checkpointing import Checkpointer
    from prada_jax.metric_writer import MetricWriter

    dcfg = validate_config(config)
    policy_reward_mode(config)  # an unknown policy reward is refused before anything is written
    if not workdir:
        raise config_utils.ConfigError("--workdir is required")
    check = run_state.check_resume(config, workdir, OBSERVATIONAL)
    traces, trace_info = load_traces(config)
    env_params = build_env_params(config, traces)
    policy_fn, policy_info = build_policy(config, traces)
    workdir = config_utils.prepare_workdir(workdir)
    run_state.commit(config, workdir, check)
    from envs import scenarios as _scenarios
    scenario = {"traces": trace_info, "policy": policy_info,
                "num_users": int(config.env.num_users), "num_servers": int(config.env.num_servers),
                "bandwidth_hz": float(config.env.bandwidth_hz),
                "arrival_rate_hz": float(config.env.arrival_rate_hz),
                "beta": float(config.env.beta), "tau_s": float(config.env.tau_s),
                "scenario": str(config.env.get("scenario", "nominal")),
                "scenario_length": int(config.env.get("scenario_length",
                                                      _scenarios.DEFAULT_LENGTH))}

    chunk_fn = _cached(("chunk", dcfg, int(config.train.rollout_len),
                        int(config.train.sgd_steps), _policy_key(policy_info)),
                       lambda: jax.jit(dual_rollout.make_train_chunk(
                           dcfg, policy_fn, int(config.train.rollout_len),
                           int(config.train.sgd_steps))))
    carry = dual_rollout.init_rollout(jax.random.key(int(config.seed)), env_params, dcfg,
                                      int(config.train.num_envs))
    ckpt = Checkpointer(workdir / "checkpoints", save_every=int(config.log.checkpoint_every),
                        max_to_keep=int(config.log.keep_checkpoints))
    try:
        carry, meta0, start = runloop.restore_or_init(ckpt, carry)
    except BaseException:
        ckpt.close()
        raise
    if start:
        _log.info("resumed %s at chunk %d", workdir, start)
    host = {"load_mean": np.asarray(meta0.get("load_mean", np.zeros(dual_rollout.LOAD_FEATURES)),
                                    np.float32)}
    num_chunks = int(config.train.num_chunks)
    slots_per_chunk = int(config.train.rollout_len) * int(config.train.num_envs)
    info = {"mode": dcfg.mode, "conditioned": dcfg.conditioned,
            "rule": "admission_price", "scenario": scenario,
            "synthetic_traces": bool(trace_info["synthetic"])}

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
        mult = _final_multipliers(carry, dcfg, host["load_mean"])
        dual.save_multipliers(workdir, mult, dict(info, chunk=chunk, env_slots=meta["env_slots"],
                                                  final=chunk == num_chunks))

    with MetricWriter(workdir / "tb") as writer:
        if start == 0:
            writer.write_texts(0, {"config": config_utils.config_to_json(config)})
        try:
            res = runloop.run(
                carry, lambda c, _: chunk_fn(c, env_params), start=start, total=num_chunks,
                max_calls=max_chunks, writers=[writer], ckpt=ckpt, scalars_fn=scalars_fn,
                x_fn=lambda c, chunk: chunk * slots_per_chunk,
                # accuracy / latency are NaN in a chunk where no user finished: not an error
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
                  "dual_state": carry.dual}
        if start == stop and (workdir / dual.MULTIPLIERS_FILE).is_file():
            result["multipliers"] = load_multipliers(workdir)
        else:
            result["multipliers"] = _final_multipliers(carry, dcfg, host["load_mean"])
        if stop == num_chunks and int(config.eval.gap_slots) > 0 and (
                start < stop or not (workdir / GAP_FILE).is_file()):
            gap = measure_gap(config, traces, env_params, policy_fn, result["multipliers"],
                              int(config.eval.gap_slots), int(config.eval.gap_envs),
                              seed=int(config.seed) + 1, policy_key=_policy_key(policy_info),
                              env_chunks=int(config.eval.get("env_chunks", 0)))
            (workdir / GAP_FILE).write_text(json.dumps(dict(gap, scenario=scenario), indent=2))
            writer.write_scalars(stop * slots_per_chunk,
                                 {f"eval/gap_{k}": v for k, v in gap.items()
                                  if isinstance(v, float) and math.isfinite(v)})
            result["gap"] = gap
    return result


# ----------------------------------------------------------------------------- duality gap

def _frozen_rollout(env_params, policy_fn, mult: dual.Multipliers, num_envs: int, seed: int,
                    rollout_len: int, policy_key, queue_price: bool):
    """(jitted rollout without learning, its initial carry) for fixed multipliers: a frozen
    learner holding them exactly (projection mode: params = values)."""
    del queue_price
    dcfg = dual.DualConfig(mode="subgradient", bw_scale_hz=1e6)
    key = ("collect", rollout_len, object() if policy_key is None else policy_key)
    rollout = _cached(key, lambda: jax.jit(dual_rollout.make_rollout(
        dcfg, policy_fn, rollout_len, learn=False)))
    carry = dual_rollout.init_rollout(jax.random.key(seed), env_params, dcfg, num_envs)
    values = jnp.array([mult.lambda_s, mult.mu * 1e6], jnp.float32)
    return rollout, carry._replace(dual=carry.dual._replace(params={"raw": values}))


def collect_slots(env_params, policy_fn, mult: dual.Multipliers, num_slots: int,
                  num_envs: int, seed: int, rollout_len: int = 100, policy_key=None,
                  queue_price: bool = False):
    """Rolls out ``num_envs`` envs with fixed multipliers (hard threshold rule; the
    admission-price form if ``queue_price``) until at least ``num_slots`` slots with ≥ 1 valid
    candidate are collected.

    Returns (SchedInputs [S, U], SlotBatch [S, U]) as NumPy trees (slots with candidates only,
    first ``num_slots`` of them in rollout order).
    """
    rollout, carry = _frozen_rollout(env_params, policy_fn, mult, num_envs, seed, rollout_len,
                                     policy_key, queue_price)
    xs, bs, have = [], [], 0
    for _ in range(10_000):
        carry, out = rollout(carry, env_params)
        x, b = jax.device_get((out["x"], out["batch"]))
        flat = lambda a: np.asarray(a).reshape((-1,) + np.shape(a)[2:])  # noqa: E731
        x, b = jax.tree.map(flat, x), jax.tree.map(flat, b)
        keep = np.asarray(b.valid).any(-1)
        xs.append(jax.tree.map(lambda a: a[keep], x))
        bs.append(jax.tree.map(lambda a: a[keep], b))
        have += int(keep.sum())
        if have >= num_slots:
            break
    cat = lambda *a: np.concatenate(a)[:num_slots]  # noqa: E731
    return jax.tree.map(cat, *xs), jax.tree.map(cat, *bs)


def rollout_stats(env_params, policy_fn, mult: dual.Multipliers, num_chunks: int,
                  num_envs: int, seed: int, rollout_len: int = 100, policy_key=None,
                  queue_price: bool = False) -> dict:
    """Long-run env outcome of the hard threshold rule with fixed multipliers.

    Rolls ``num_envs`` envs from reset for ``num_chunks × rollout_len`` slots (the same slots
    and noise for every ``mult`` given the same seed, until decisions differ) and returns
    means over all env-slots: ``reward_per_slot`` (env reward summed over users, PRM units),
    ``accuracy`` and ``latency_s`` (over users that finished), ``objective`` (accuracy −
    β·latency, β in PRM units per second), ``queue_len``,
    ``server_in_use``, ``finished`` (users finished per env-slot). What the per-slot oracle
    cannot see (it is myopic): the cost of a longer queue in later slots.
    """
    rollout, carry = _frozen_rollout(env_params, policy_fn, mult, num_envs, seed, rollout_len,
                                     policy_key, queue_price)
    sums = {k: 0.0 for k in ("reward", "queue_len", "server_in_use", "finished", "correct",
                             "latency_s")}
    for _ in range(num_chunks):
        carry, out = rollout(carry, env_params)
        out = jax.device_get({k: out[k] for k in sums})
        for k in sums:
            sums[k] += float(np.sum(np.asarray(out[k], np.float64)))
    n = num_chunks * rollout_len * num_envs
    fin = max(sums["finished"], 1.0)
    acc, lat = sums["correct"] / fin, sums["latency_s"] / fin
    return {"reward_per_slot": sums["reward"] / n, "accuracy": acc, "latency_s": lat,
            "objective": acc - float(env_params.beta) * lat, "queue_len": sums["queue_len"] / n,
            "server_in_use": sums["server_in_use"] / n, "finished": sums["finished"] / n,
            "env_slots": n}


def threshold_decisions(x, batch, env_params, mult: dual.Multipliers,
                        queue_price: bool = True) -> np.ndarray:
    """Hard threshold rule (with its feasibility repair) on collected slots: [S, U] int8.
    ``queue_price`` is ignored (kept for older callers)."""
    from envs import edge
    from prada_jax.sched.threshold import threshold_decide

    del queue_price
    sp = edge.sched_params(env_params).replace(lambda_s=jnp.float32(mult.lambda_s),
                                               mu=jnp.float32(mult.mu))
    fn = _cached(("threshold",),
                 lambda: jax.jit(jax.vmap(threshold_decide, in_axes=(0, 0, 0, None))))
    free_units = jnp.asarray(batch.free_units).astype(jnp.int32)
    return np.asarray(fn(x, free_units, jnp.asarray(batch.free_bw), sp))


def measure_gap(config, traces, env_params, policy_fn, mult: dual.Multipliers,
                num_slots: int, num_envs: int, seed: int, policy_key=None,
                env_chunks: int = 5) -> dict:
    """Duality gap of the hard threshold rule with ``mult`` on ≥ num_slots env slots.

    Value of the rule's decision (after its feasibility repair) as a fraction of the exact
    oracle's (``prada_jax.sched.oracle``) per slot; also the same rule with λ_s = µ = 0 on the
    same slots as a reference. Slots are drawn from rollouts running ``mult``. The rule is the
    one the run trained (``config.dual.queue_price``: the admission-price form).
    ``env_chunks`` > 0 adds ``env`` / ``zero_env`` / ``fifo_env``: :func:`rollout_stats` of
    the same rule with ``mult``, with λ_s = µ = 0, and of the same policy with the FIFO-greedy
    scheduler (``env_chunks`` × 100 slots × ``num_envs`` envs each, same seed) — the long-run
    outcome the myopic per-slot oracle does not measure.
    """
    from prada_jax.sched import oracle

    del traces
    qp = queue_price(config)
    x, batch = collect_slots(env_params, policy_fn, mult, num_slots, num_envs, seed,
                             policy_key=policy_key, queue_price=qp)
    out: dict = {"lambda_s": float(mult.lambda_s), "mu": float(mult.mu), "queue_price": qp}
    for name, m in (("learned", mult), ("zero", dual.Multipliers(0.0, 0.0))):
        d = threshold_decisions(x, batch, env_params, m, queue_price=qp)
        rep = oracle.threshold_vs_oracle(batch.w, batch.w_bar, batch.b, batch.valid,
                                         batch.free_units, batch.free_bw, d)
        pre = "" if name == "learned" else "zero_"
        out.update({f"{pre}slots": rep.slots, f"{pre}positive_slots": rep.positive,
                    f"{pre}mean": rep.mean, f"{pre}p5": rep.p5, f"{pre}min": rep.min,
                    f"{pre}pooled": rep.pooled, f"{pre}infeasible": rep.infeasible,
                    f"{pre}milp_slots": rep.milp_slots})
    out["candidates_per_slot"] = float(np.mean(np.sum(batch.valid, -1)))
    if env_chunks > 0:
        from prada_jax.sched.registry import scheduler_index

        fifo = env_params.replace(scheduler=jnp.asarray(scheduler_index("fifo_greedy"),
                                                        jnp.int32))
        for pre, m, p in (("", mult, env_params), ("zero_", dual.Multipliers(0.0, 0.0),
                                                   env_params),
                          ("fifo_", dual.Multipliers(0.0, 0.0), fifo)):
            out[f"{pre}env"] = rollout_stats(p, policy_fn, m, env_chunks, num_envs, seed + 1,
                                             policy_key=policy_key)
    return out
