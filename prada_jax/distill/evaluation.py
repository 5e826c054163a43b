"""What a distillation run measures of its students as it trains (success, ratio diagnostic, gate).

* :func:`evaluate`: one student's task success (the task's evaluator);
* :func:`eval_point`: every seed's success after an update (``eval.every``: the
  ``eval/success_rate`` curve and ``results["curve"]``);
* :func:`refresh_ratio`: the ratio diagnostic of every seed's student (``ratio/*`` curves,
  ``results["ratio"]``), which also hands adaptive schedules ("auto", "exact-ratio") their
  new turn weights;
* :func:`check_gate`: a gate fixed in advance (``config.gate``): task success and the mean
  per-turn gap to the teacher, recorded in ``results["gate"]``.

Each takes the run's :class:`~prada_jax.distill.trainer.Setup`, its
:class:`~prada_jax.distill.host_state.SeedRecords` and
:class:`~prada_jax.distill.host_state.RunFiles`, and the current (seed-stacked when N > 1)
parameters.
"""
from __future__ import annotations

import numpy as np
from flax import nnx

from prada_jax import runloop
from prada_jax.distill import ratio as ratio_lib
from prada_jax.distill.student import as_f32
from prada_jax.errors import NonFiniteTraining
from prada_jax.tree_leaves import first_non_finite


def gate_on(config) -> bool:
    """Whether the run stops at a gate (``config.gate.every`` > 0)."""
    return "gate" in config and int(config.gate.every) > 0


def gate_record(config) -> dict:
    """The gate as fixed before training (thresholds, cadence) with no check yet."""
    g = config.gate
    return {"success_min": float(g.success_min), "gap_max": float(g.gap_max),
            "every": int(g.every), "budget_updates": int(config.train.steps),
            "reached": False, "step": None, "checks": []}


def evaluate(setup, params) -> dict:
    """Task success of one student (``params``: unstacked; the task's evaluator; {} without
    one or with ``eval.n_problems`` = 0)."""
    ev = setup.config.eval
    if ev.n_problems == 0 or setup.task.evaluate is None:
        return {}
    model = nnx.merge(setup.graphdef, params)
    if setup.config.train.compute_dtype == "bfloat16":
        model = as_f32(model, setup.cfg)
    return setup.task.evaluate(model, ev.n_problems, ev.seed, ev.batch_size)


def _success_point(files, i: int, res: dict, got: dict, done: int) -> None:
    """Seed i's ``eval/success_rate`` point at update ``done`` and its ``results["curve"]``
    record."""
    files.writers[i].write_scalars(done, {"eval/success_rate": got["success_rate"]})
    res.setdefault("curve", []).append({"step": done, "success_rate": got["success_rate"]})


def eval_point(setup, rec, files, params, done: int) -> None:
    """Task success of every seed's student after update ``done`` (``eval.every``): curve
    points and ``results["curve"]`` records ``{step, success_rate}`` (the "before" and "after"
    evaluations are not repeated there)."""
    for i, res in enumerate(rec.results):
        got = evaluate(setup, setup.params_of(params, i))
        if got:
            _success_point(files, i, res, got, done)


def refresh_ratio(setup, rec, files, params, step: int, update_weights: bool) -> None:
    """Ratio diagnostic of each seed's current student (``ratio/*`` curves,
    ``results["ratio"]``); for adaptive schedules (when ``update_weights``) hands each seed's
    sampler its new weights. Raises NonFiniteTraining on non-finite parameters."""
    bad = first_non_finite(params)
    if bad is not None:
        raise NonFiniteTraining(f"non-finite student parameters ({bad}) at update {step}; "
                                f"stopping; {runloop.no_checkpoint_note(files.ckpt)}")
    c = setup.config.sampler
    for i, sampler in enumerate(rec.samplers):
        diag = ratio_lib.diagnose_student(setup.logp_fn, setup.params_of(params, i),
                                          setup.pool, setup.table, c.kappa_min)
        scal = diag.scalars()
        rec_i = {"step": step, **{k: (None if isinstance(v, float) and not np.isfinite(v)
                                      else v) for k, v in diag.summary().items()}}
        if update_weights and setup.schedule == "auto":
            # hold the configured κ while the gap is uninformative (from scratch: c̄ ≈ 20 nats)
            held = not diag.mean_gap <= float(c.auto_gap_max)
            sampler.use_kappa(c.kappa if held else diag.kappa_auto)
            rec_i["kappa_held"] = held
            scal["distill/kappa_held"] = float(held)
        elif update_weights and setup.schedule == "exact-ratio":
            low = sampler.use_log_ratio(diag.log_ratio)
            scal["ratio/clipped_low_frac"] = rec_i["clipped_low_frac"] = low
        if setup.schedule == "auto":   # exact-ratio has no single κ to report
            scal["distill/kappa"] = rec_i["kappa_used"] = sampler.kappa
        files.writers[i].write_scalars(step, scal)
        rec.results[i]["ratio"].append(rec_i)


def check_gate(setup, rec, files, params, done: int) -> bool:
    """The gate after update ``done`` (N = 1): task success >= ``gate.success_min`` and the mean
    per-turn gap c̄ to the teacher on the pool <= ``gate.gap_max`` [nats per turn]. Records
    the check in ``results["gate"]["checks"]`` (and the ratio/eval curves); True when reached."""
    g, res = setup.config.gate, rec.results[0]
    if not res["ratio"] or res["ratio"][-1]["step"] != done:
        refresh_ratio(setup, rec, files, params, done, False)
    gap = res["ratio"][-1].get("mean_gap")
    got = evaluate(setup, setup.params_of(params, 0))
    _success_point(files, 0, res, got, done)
    ok = (got["success_rate"] >= float(g.success_min) and gap is not None
          and gap <= float(g.gap_max))
    gate = res.setdefault("gate", gate_record(setup.config))
    gate["checks"].append({"step": done, "success_rate": got["success_rate"], "mean_gap": gap,
                           "reached": bool(ok)})
    if ok:
        gate.update(reached=True, step=done)
    return bool(ok)
