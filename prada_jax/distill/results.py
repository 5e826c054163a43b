"""The end of a distillation run: final evaluation, students as Hugging Face folders, results.json.

One seed (N = 1): ``<workdir>/student_hf`` and ``results.json`` = that seed's results dict.
N > 1 seeds: ``<workdir>/seed_<s>/student_hf`` per seed, and ``results.json`` holds
``per_seed`` (each entry the dict a separate run with that seed writes) with the mean ± 95%
Student-t CI over seeds of the task success before and after (:func:`seeds_summary`).
"""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from prada_jax import parallel, stats
from prada_jax.distill import opd as opd_lib
from prada_jax.distill.evaluation import evaluate, gate_on, gate_record
from prada_jax.distill.student import save_student
from prada_jax.jsonio import write_json


def seeds_summary(setup, per: list[dict], env_calls: int) -> dict:
    """``results.json`` of a multi-seed run from the seeds' results dicts ``per``:
    ``per_seed`` and mean ± 95% CI over seeds of the task success before/after."""
    config = setup.config
    out = {"num_seeds": len(setup.seeds), "seeds": list(setup.seeds), "mode": config.mode,
           "loss": config.loss.kind, "schedule": setup.schedule, "synthetic": True,
           "env_calls_during_training": int(env_calls),
           "update_s_median": per[0]["update_s_median"], "cost": per[0]["cost"]}
    for tag in ("before", "after"):
        vals = [r[tag]["success_rate"] for r in per if r.get(tag)]
        if vals:
            # mean ± 95% Student-t CI over seeds, None where undefined
            out[f"success_{tag}"] = stats.mean_ci([float(v) for v in vals]).to_json_dict()
    out["per_seed"] = per
    return out


def student_dir(setup, workdir: Path, i: int) -> Path:
    """Where seed index i's student is saved: ``student_hf`` (N = 1) or
    ``seed_<s>/student_hf``."""
    if not setup.stacked:
        return workdir / "student_hf"
    return workdir / f"seed_{setup.seeds[i]}" / "student_hf"


def updates_done(setup, state) -> int:
    """Optimiser updates ``state`` has taken (its micro-step counter over
    ``optim.grad_accum``; N > 1: the seeds' counters are equal)."""
    step = np.asarray(jax.device_get(state.step)).reshape(-1)
    return int(step[0]) // int(setup.config.optim.grad_accum)


def finish(setup, rec, files, state, host) -> dict:
    """Final evaluation of every seed's student in ``state``, the students as Hugging Face
    folders and ``results.json`` (process 0); returns the results dict."""
    update_s = float(np.median(host.update_times)) if host.update_times else None
    for i, results in enumerate(rec.results):
        results["env_calls_during_training"] = int(host.env_calls)
        results["update_s_median"] = update_s
        results["cost"] = opd_lib.cost_summary(list(host.costs))
        if gate_on(setup.config):
            results.setdefault("gate", gate_record(setup.config))
        results["turn_histogram"] = host.turn_hist[i].tolist()
        if setup.schedule == "auto":
            results["kappa"] = rec.samplers[i].kappa   # the last estimate in force
        results["after"] = evaluate(setup, setup.params_of(state.params, i))
        # the final evaluation is labelled with the update of the model it evaluated (a run
        # finished early, e.g. at a plateau or a gate, is not at ``train.steps``)
        end = updates_done(setup, state)
        results["after_step"] = end
        if results["after"]:
            files.writers[i].write_scalars(
                end, {"eval/success_rate": results["after"]["success_rate"]})
    for w in files.writers:
        w.flush()
    results = (seeds_summary(setup, rec.results, host.env_calls) if setup.stacked
               else rec.results[0])
    if parallel.is_process_zero():
        for i in range(len(setup.seeds)):
            save_student(setup.graphdef, setup.params_of(state.params, i), setup.cfg,
                         student_dir(setup, files.workdir, i), setup.task)
        write_json(files.workdir / "results.json", results, indent=2, newline=False)
    return results
