"""The cost model's tool phase checked once against real per-round sleeps (issue 44, item 7).

``prada_jax.distill.gpucost`` prices the tool phase of an OPD update as ``tool_rounds ×
tool_latency_s``: a round in which several episodes call the tool waits once (the calls of a
round run concurrently). The trainer can sleep for real (``opd.tool_latency_s``), so this check
runs the same OPD updates (same cold start, seed and problems, hence the same episodes and tool
rounds) at latency 0 and at latency L and compares, update by update,

    Δrollout_s(u) = rollout_s(u; L) − rollout_s(u; 0)   against   model_s(u) = L · tool_rounds(u)

[seconds per update]. Their ratio is 1 when the sleeps and the model agree; it would be
``tool_calls / tool_rounds`` (≈ 6 here) if every call slept on its own. The rollout's own CPU
time is in both terms of the difference, so on a noisy shared machine L must be large against
its spread (≈ 0.1 s a rollout here).

    python -m studies.reopd_regime.sleepcheck --out=checkpoints/reopd_regime_sleep \\
        [--latency=0.25] [--updates=12] [--seed=100]

Needs the study's cache and cold start (``python -m studies.reopd_regime`` parts teacher and
cold, in ``--study_out``). Writes ``<out>/sleep_check.json``. SYNTHETIC task.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from studies import reopd_regime as rr


def _define(fv) -> None:
    from absl import flags  # lazy: flags are defined only when the command runs

    flags.DEFINE_string("out", "", "folder for the two runs and sleep_check.json", flag_values=fv)
    flags.DEFINE_string("study_out", "checkpoints/reopd_regime",
                        "the regime study's folder (its cold.json names the cold start, its "
                        "cache/ holds T)", flag_values=fv)
    flags.DEFINE_float("latency", 0.25, "simulated tool latency L of the slept run [s per tool "
                       "call]", flag_values=fv)
    flags.DEFINE_integer("updates", 12, "OPD updates per run", flag_values=fv)
    flags.DEFINE_integer("seed", 100, "trainer seed (the same for both runs)", flag_values=fv)
    flags.DEFINE_float("lr", 3e-3, "OPD learning rate (the study's chosen lr)", flag_values=fv)


def compare(base: list[dict], slept: list[dict], latency_s: float, skip: int = 1) -> dict:
    """Per-update comparison of two OPD runs' cost records (``results.json`` →
    ``cost.per_update``): the same episodes are required (equal tool rounds and calls). The
    first ``skip`` updates are left out of the totals: the first run of the process compiles
    the generation functions inside its first rollout (≈ 10 s here), the second reuses them."""
    rows = []
    for u, (a, b) in enumerate(zip(base, slept)):
        if (a["tool_rounds"], a["tool_calls"]) != (b["tool_rounds"], b["tool_calls"]):
            raise ValueError(f"update {u}: the runs played different episodes "
                             f"({a['tool_rounds']}/{a['tool_calls']} vs "
                             f"{b['tool_rounds']}/{b['tool_calls']} rounds/calls)")
        rows.append({"update": u, "tool_rounds": int(a["tool_rounds"]),
                     "tool_calls": int(a["tool_calls"]),
                     "rollout_s_base": float(a["rollout_s"]),
                     "rollout_s_slept": float(b["rollout_s"]),
                     "delta_s": float(b["rollout_s"] - a["rollout_s"]),
                     "model_s": latency_s * int(a["tool_rounds"]),
                     "per_call_s": latency_s * int(a["tool_calls"])})
    used = rows[skip:]
    delta = np.array([r["delta_s"] for r in used])
    model = np.array([r["model_s"] for r in used])
    per_call = np.array([r["per_call_s"] for r in used])
    ratio = delta / np.where(model > 0, model, np.nan)
    return {"latency_s": latency_s, "updates": len(used), "skipped_updates": skip, "rows": rows,
            "delta_s_total": float(delta.sum()), "model_s_total": float(model.sum()),
            "per_call_s_total": float(per_call.sum()),
            "ratio_total": float(delta.sum() / model.sum()) if model.sum() > 0 else math.nan,
            "ratio_median": float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else math.nan,
            "unit": "seconds per update (rollout phase)", "synthetic": True}


def _run(study: "rr.Study", cold: str, latency: float, updates: int, seed: int, lr: float,
         name: str) -> list[dict]:
    s = study.s
    c = study.config("opd", updates, seed, **{
        "student.init": cold, "optim.lr": lr, "optim.warmup_steps": s.warmup,
        "eval.every": 0, "opd.episodes": s.episodes, "opd.tool_latency_s": float(latency),
        "loss.rkl_estimator": s.estimator, "log.ckpt_every": updates,
        "eval.n_problems": 16})
    res = study.train(name, c)
    return res["cost"]["per_update"]


def _cold_student(cold_path: Path) -> str:
    """The cold start's folder named by the study's ``cold.json`` (``{"student": FOLDER,
    ...}``); ``BadInput`` naming ``--study_out`` and the file if it is missing, not a JSON
    object, has no ``student`` string, or names a folder that does not exist."""
    if not cold_path.is_file():
        raise BadInput(f"--study_out: {cold_path} not found (run the study's cold part first)")
    try:
        cold = read_json(cold_path)
    except BadInput as e:
        raise BadInput(f"--study_out: {e}") from None
    student = cold.get("student")
    if not isinstance(student, str) or not student:
        raise BadInput(f"--study_out: {cold_path}: no 'student' folder (a string) in it")
    if not Path(student).is_dir():
        raise BadInput(f"--study_out: {cold_path}: the cold start {student} is not a folder")
    return student


def main(argv=None) -> int:
    """Runs the check; bad flags, an ``--out`` that cannot be a folder or a missing or
    malformed cold start (``cold.json``): one stderr line, exit 2, before anything runs."""
    cli.hub_offline()
    a = cli.parse_local(_define, argv, "studies.reopd_regime.sleepcheck", __doc__)
    if not a.out:
        raise BadInput("--out: required")
    out = config_utils.check_output_dir(a.out, "--out")
    if not (math.isfinite(a.latency) and a.latency > 0):
        raise BadInput(f"--latency: must be a finite number > 0, got {a.latency}")
    if not (math.isfinite(a.lr) and a.lr > 0):
        raise BadInput(f"--lr: must be a finite number > 0, got {a.lr}")
    if a.updates < 1:
        raise BadInput(f"--updates: must be >= 1, got {a.updates}")
    cold = _cold_student(Path(a.study_out) / "cold.json")
    study = rr.Study(Path(a.study_out) / "cache", out, rr.FULL)
    base = _run(study, cold, 0.0, a.updates, a.seed, a.lr, "latency_0")
    slept = _run(study, cold, a.latency, a.updates, a.seed, a.lr, f"latency_{a.latency:g}")
    res = compare(base, slept, a.latency)
    write_json(out / "sleep_check.json", res, indent=1, newline=False)
    print(f"L = {a.latency} s, {res['updates']} updates (SYNTHETIC): measured extra rollout "
          f"time {res['delta_s_total']:.2f} s; model L·tool_rounds {res['model_s_total']:.2f} s "
          f"(ratio {res['ratio_total']:.3f}, per-update median {res['ratio_median']:.3f}); "
          f"one sleep per call would be {res['per_call_s_total']:.2f} s")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
