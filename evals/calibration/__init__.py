"""PRM calibration per benchmark and the miscalibration stress test (docs/design.md §2, §8).

``python -m evals.calibration --traces=gsm8k,gaokao2023en,mmlu_stem --out=DIR`` writes, per
trace set, the AUC of the PRM step gain ``PRM(x_{k+1}) − PRM(x_k)`` against final correctness
(``evals.calibration_metrics``), the AUC of the PRM score, the expected calibration error and a
reliability diagram (``reliability.png``), plus ``calibration.json`` and TensorBoard.

``--prm_miscalibration=m`` (m ≠ 0) adds the stress test: a synthetic preset is regenerated
with the same seed and ``prm_miscalibration=m`` (identical trees, features, tokens and
correctness — only the PRM read changes: ``sigmoid((1 + m)·logit(v) + noise)``), a screening
policy is trained by PPO on each PRM (``--ppo_config``), and both are evaluated on the same
calibrated env of the same problems (correctness never depends on the PRM). Reported: each policy's
PRADA (λ_s = µ = 0) accuracy as a share of All-LLM's ("retention"), per seed, and the paired
drop in retention with a 95% CI. A calibrated policy from ``--policy`` is reused if given.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import ml_collections
import numpy as np

from evals import calibration_metrics as cm
from evals import plots, report
from prada_jax import stats
from prada_jax.jsonio import write_json
from prada_jax.metric_writer import MetricWriter
from prada_jax.traces import format as tf
from prada_jax.traces import synthetic


def calibration_for(traces_specs: Sequence[str], problems: int | None, trace_seed: int,
                    follow: int = 0, n_bins: int = 10) -> dict[str, dict]:
    """Calibration report per trace set (folder or preset). Keys: benchmark (or folder)."""
    from evals import suite  # lazy: pulls in orbax, which defines absl flags

    out = {}
    for spec in traces_specs:
        t = suite.load_traces(spec, problems, trace_seed)
        rep = cm.calibration_report(t.traces, follow=follow, n_bins=n_bins)
        rep["traces"] = t.info
        key = t.info["benchmark"]
        if key in out:
            key = f"{key}:{spec}"
        out[key] = rep
    return out


def calibration_text(reports: dict) -> str:
    rows = []
    for name, r in reports.items():
        syn = " (synthetic)" if r["traces"].get("synthetic") else ""
        rows.append(f"{name}{syn}: AUC(step gain) {r['auc_step_gain']:.3f} "
                    f"[SLM drafts {r['auc_step_gain_slm']:.3f}, LLM steps "
                    f"{r['auc_step_gain_llm']:.3f}], AUC(PRM score) {r['auc_prm_score']:.3f}, "
                    f"ECE {r['ece']:.3f}, {r['n_steps']} candidate steps, "
                    f"{100 * r['positive_rate']:.1f}% end correct (continued by the "
                    f"{r['follow'].upper()})")
    return "\n".join(rows)


def write_calibration(reports: dict, out_dir: Path, tag: str = "calibration") -> dict:
    """calibration.json, reliability.png and TensorBoard under ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    diagrams = {name: dict(r["reliability"], ece=r["ece"], auc=r["auc_prm_score"])
                for name, r in reports.items()}
    fig = plots.plot_reliability(diagrams, out_dir / f"{tag}_reliability.png",
                                 title="PRM reliability (candidate steps; label: final answer "
                                       "correct when continued by the SLM)")
    write_json(out_dir / f"{tag}.json", reports)
    text = calibration_text(reports)
    with MetricWriter(out_dir / "tb") as w:
        for name, r in reports.items():
            slug = report.tag_name(name)
            w.write_scalars(0, {f"{tag}/{slug}/auc_step_gain": r["auc_step_gain"],
                                f"{tag}/{slug}/auc_prm_score": r["auc_prm_score"],
                                f"{tag}/{slug}/ece": r["ece"]})
        w.write_texts(0, {f"{tag}/summary": text})
        w.write_images(0, {f"{tag}/reliability": plots.png_to_rgb(fig)})
    return {"figure": fig, "json": out_dir / f"{tag}.json", "text": text}


# ----------------------------------------------------------------------------- stress test

def _train_policy(ppo_config, trace_dir: Path, workdir: Path):
    """Trains (or resumes / reuses) a PPO screening policy on the traces in ``trace_dir``."""
    from envs import stage1  # lazy: pulls in orbax, which defines absl flags
    from prada_jax.rl import trainer  # lazy: imports orbax too (as above)

    cfg = ml_collections.ConfigDict(ppo_config.to_dict())
    cfg.env.trace_dir = str(trace_dir)
    trainer.train_and_evaluate(cfg, workdir, stage1.build_setup(cfg))
    return workdir


def retention_drop(per_seed_cal: dict, per_seed_mis: dict, row: str = "PRADA (λ=µ=0)",
                   reference: str = "All-LLM") -> dict:
    """Per-seed retention (row accuracy / reference accuracy) of both policies and the paired
    drop ``retention_cal − retention_mis`` with 95% CIs (same seeds, same env)."""
    def ret(ps):
        return np.asarray(ps[row]["accuracy"]) / np.asarray(ps[reference]["accuracy"])

    r_cal, r_mis = ret(per_seed_cal), ret(per_seed_mis)
    return {"row": row, "reference": reference,
            "retention_calibrated": stats.mean_ci(r_cal),
            "retention_miscalibrated": stats.mean_ci(r_mis),
            "drop": stats.mean_ci(r_cal - r_mis),
            "per_seed": {"calibrated": r_cal.tolist(), "miscalibrated": r_mis.tolist()}}


def stress_test(preset: str, miscalibration: float, ppo_config, workdir: Path, *,
                problems: int | None, trace_seed: int, seeds: int, slots: int,
                warmup_slots: int, policy_dir: str | None = None, env_overrides=None,
                progress=None) -> dict:
    """Trains on a calibrated and a miscalibrated PRM and compares PRADA's retention.

    Args:
      preset: synthetic preset (the stress test needs the generator).
      miscalibration: ``m`` of ``prada_jax.traces.synthetic.generate``.
      ppo_config: a ``prada_jax/configs/ppo.py`` ConfigDict (its trace fields are replaced).
      workdir: where traces, the two PPO runs and the evaluations go.
      policy_dir: an existing policy trained on the calibrated preset (skips that training).
    """
    from evals import suite  # lazy: pulls in orbax, which defines absl flags

    if preset not in synthetic.PRESETS:
        raise suite.EvalError(f"--prm_miscalibration needs a synthetic preset, got {preset!r}")
    if not (miscalibration > -1.0) or miscalibration == 0.0:
        raise suite.EvalError(f"--prm_miscalibration must be > -1 and != 0, got {miscalibration}")
    say = progress or (lambda m: None)
    workdir = Path(workdir)
    dirs = {}
    for tag, m in (("calibrated", 0.0), ("miscalibrated", miscalibration)):
        d = workdir / f"traces_{tag}"
        try:
            tf.load(d)
        except tf.TraceFormatError:
            tr, meta = synthetic.generate(preset, seed=trace_seed, problems=problems,
                                          prm_miscalibration=m)
            tf.save(tr, d, meta)
        dirs[tag] = d
    policies = {}
    for tag in ("calibrated", "miscalibrated"):
        if tag == "calibrated" and policy_dir:
            policies[tag] = suite.load_policy(policy_dir)
            continue
        say(f"stress test: training PPO on the {tag} PRM")
        run = _train_policy(ppo_config, dirs[tag], workdir / f"ppo_{tag}")
        policies[tag] = suite.load_policy(str(run))
    test = suite.load_traces(preset, problems, trace_seed + suite.HELD_OUT_SEED_OFFSET)
    per_seed = {}
    for tag, pol in policies.items():
        suite.check_policy_traces(pol, test)
        env_kw = suite.env_kwargs_from(pol.config, dict(env_overrides or {}))
        say(f"stress test: evaluating the {tag}-PRM policy")
        per_seed[tag], _ = suite.evaluate_rows(test, env_kw, policy=pol, multipliers=None,
                                               seeds=seeds, slots=slots,
                                               warmup_slots=warmup_slots, random_row=False)
    result = retention_drop(per_seed["calibrated"], per_seed["miscalibrated"])
    result.update(preset=preset, miscalibration=miscalibration,
                  eval_traces=test.info, synthetic=True)
    write_json(workdir / "stress_test.json",
                      {**result, "per_seed_metrics": {
                          t: {r: {m: np.asarray(v).tolist() for m, v in row.items()}
                              for r, row in ps.items()} for t, ps in per_seed.items()}})
    return result


def stress_text(r: dict) -> str:
    return (f"stress test [synthetic {r['preset']}, PRM miscalibration m={r['miscalibration']:g}]: "
            f"{r['row']} accuracy retention vs {r['reference']}: calibrated PRM "
            f"{r['retention_calibrated'].fmt(1, 100)} %, miscalibrated PRM "
            f"{r['retention_miscalibrated'].fmt(1, 100)} %, drop "
            f"{r['drop'].fmt(1, 100)} points (paired over {r['drop'].n} seeds, 95% CI)")
