"""Multi-seed report of the built-in ReOPD task: teacher, student before/after each method.

    python -m evals.distill_report --out=checkpoints/distill_report [--seeds=0,1,2] \
        [--cache=checkpoints/task_cache/seed0] [--steps=1000] [--warm_steps=300] \
        [--cont_steps=300] [--onpolicy_steps=100] [--n_eval=256] [--methods=a,b,...] \
        [--merge_from=DIR,DIR]

Methods (``PLAN``), run for every seed (student init, batch draws, sampling keys):

* from a random init, ``--steps`` offline updates: ``fkl_k0.6`` (forward KL on exported top-k +
  tail, κ = 0.6), ``fkl_k1`` (κ = 1, uniform turns), ``fkl_late`` (late-heavy
  p ∝ 0.6^(K-1-t)), ``sft`` (cross-entropy on teacher tokens), ``fkl_auto`` / ``fkl_exact``
  (the adaptive weightings below, from scratch);
* warm starts, ``--warm_steps`` offline updates: ``warm_k0.6``, ``warm_k1``;
* continuations of ``warm_k0.6``, ``--cont_steps`` offline updates (lr 1e-3, 5 warm-up):
  ``cont_k0.6``, ``cont_k1``, ``cont_auto`` (κ = exp(−c̄), c̄ the student's mean per-turn gap
  to the teacher on the pool, re-estimated every ``sampler.refresh_every`` updates — beyond the
  paper, :mod:`prada_jax.distill.ratio`), ``cont_exact`` (turns weighted by the clipped
  per-prefix likelihood ratio br_{i,t} instead of κ^t);
* on-policy ReOPD (student samples, teacher scores, reverse-KL policy gradient),
  ``--onpolicy_steps`` updates: ``reopd_k0.6`` and ``reopd_auto`` from ``warm_k0.6``,
  ``reopd_k1`` from ``warm_k1`` (a random student's samples carry no signal on this task).

Every run also logs the pool likelihood-ratio diagnostic (c̄, exp(−c̄), and the OLS of log br_t
on the turn index: slope, R²) at its start and end. ``report.json`` + ``report.md`` hold the
mean ± 95% Student-t CI over seeds of the task success rate, a paired difference to the
method's reference (``fkl_k0.6`` from scratch, ``cont_k0.6`` for continuations, the warm start
for ReOPD), the environment calls during training, the median wall time per update, and the
diagnostic of each method's final student (and of the warm start for ReOPD).
All data is synthetic (generated arithmetic problems).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _config(cache: str, seed: int, variant: str, steps: int, n_eval: int, **over):
    from prada_jax import config_utils as cu
    from train.configs.distill import get_config
    c = get_config(variant)
    c.data.cache = cache
    c.seed = seed
    c.train.steps = steps
    c.log.ckpt_every = max(steps, 1)
    c.log.progress = False
    c.eval.n_problems = n_eval
    for k, v in over.items():
        cu.set_field(c, k, v)
    return c


# name -> (config variant, warm start it continues from or None, budget); budgets: "steps"
# (offline from a random init), "warm" (the warm starts), "cont" (offline continuation of a
# warm start), "onpolicy" (ReOPD updates from a warm start).
PLAN = {
    "fkl_k0.6": ("", None, "steps"),
    "fkl_k1": ("uniform", None, "steps"),
    "fkl_late": ("late", None, "steps"),
    "sft": ("sft", None, "steps"),
    "fkl_auto": ("auto", None, "steps"),
    "fkl_exact": ("exact", None, "steps"),
    "warm_k0.6": ("", None, "warm"),
    "warm_k1": ("uniform", None, "warm"),
    "cont_k0.6": ("", "warm_k0.6", "cont"),
    "cont_k1": ("uniform", "warm_k0.6", "cont"),
    "cont_auto": ("auto", "warm_k0.6", "cont"),
    "cont_exact": ("exact", "warm_k0.6", "cont"),
    "reopd_k0.6": ("onpolicy", "warm_k0.6", "onpolicy"),
    "reopd_k1": ("onpolicy,uniform", "warm_k1", "onpolicy"),
    "reopd_auto": ("onpolicy,auto", "warm_k0.6", "onpolicy"),
}


def run(out: Path, cache: str, seeds, budgets: dict, n_eval: int, methods) -> dict:
    """Runs every (method, seed) not yet in ``<out>/runs.json``; ``budgets`` maps the PLAN
    budget names to optimizer updates."""
    from prada_jax.distill.loop import train_and_evaluate
    unknown = [m for m in methods if m not in PLAN]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {sorted(PLAN)}")
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "runs.json"
    runs = json.loads(res_path.read_text()) if res_path.is_file() else {}
    for seed in seeds:
        for name in methods:
            key = f"{name}/seed{seed}"
            if key in runs:
                continue
            variant, warm_from, budget = PLAN[name]
            over = {}
            if warm_from is not None:
                warm = out / warm_from / f"seed{seed}" / "student_hf"
                if not warm.is_dir():
                    raise FileNotFoundError(f"{warm}: run {warm_from} first")
                over = {"student.init": str(warm), "optim.warmup_steps": 5, "optim.lr": 1e-3}
            cfg = _config(cache, seed, variant, budgets[budget], n_eval, **over)
            r = train_and_evaluate(cfg, out / name / f"seed{seed}")
            r["budget"], r["warm_from"] = budget, warm_from
            runs[key] = r
            res_path.write_text(json.dumps(runs, indent=2))
            print(f"{key}: before {r.get('before', {}).get('success_rate')} after "
                  f"{r['after'].get('success_rate')} env_calls "
                  f"{r['env_calls_during_training']} update_s {r['update_s_median']:.3f}",
                  flush=True)
    return runs


DIAG_KEYS = ("mean_gap", "kappa_auto", "slope", "r2")


def heldout_diagnostics(runs: dict, roots, cache: str) -> int:
    """Adds ``ratio_heldout`` (the prefix-ratio diagnostic of the run's final student on the
    held-out pool ``<cache>/pool_heldout`` with ``<cache>/logits_heldout``) to every run that
    lacks it and whose ``student_hf`` is found under one of ``roots`` as
    ``<root>/<method>/seed<seed>/student_hf``. Returns how many were added (0 without a held-out
    pool)."""
    from flax import nnx

    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill import ratio
    from prada_jax.distill import teacher_table
    from prada_jax.lm.hf import load_hf
    hp, hl = Path(cache) / "pool_heldout", Path(cache) / "logits_heldout"
    if not (hp.is_dir() and hl.is_dir()):
        return 0
    pool = pool_lib.load_pool(hp)
    table = teacher_table.load(hl, pool)
    added = 0
    for key, r in runs.items():
        if "ratio_heldout" in r:
            continue
        name, seed = key.split("/")
        found = [Path(root) / name / seed / "student_hf" for root in roots]
        found = [f for f in found if f.is_dir()]
        if not found:
            continue
        model, _ = load_hf(found[0])
        gd, params = nnx.split(model, nnx.Param)
        d = ratio.diagnose_student(ratio.token_logp_fn(gd), params, pool, table)
        r["ratio_heldout"] = {k: v for k, v in d.summary().items()}
        added += 1
    return added


def reference_of(name: str) -> str | None:
    """The run a method is compared with, paired by seed (None for the references)."""
    if name not in PLAN or name in ("fkl_k0.6", "cont_k0.6") or name.startswith("warm"):
        return None
    variant, warm_from, budget = PLAN[name]
    return {"steps": "fkl_k0.6", "cont": "cont_k0.6", "onpolicy": warm_from}[budget]


def summarize(runs: dict, cache: str) -> dict:
    from evals.stats import mean_ci
    from prada_jax.distill.task.evaluate import wilson_ci
    table = {}
    names = sorted({k.split("/")[0] for k in runs})
    before = [r["before"]["success_rate"] for k, r in runs.items()
              if k.startswith("fkl_k0.6/") and r.get("before")]
    if before:
        table["student_before"] = mean_ci(before).to_dict()
    for name in names:
        rs = [r for k, r in runs.items() if k.split("/")[0] == name]
        table[name] = {
            "success": mean_ci([r["after"]["success_rate"] for r in rs]).to_dict(),
            "env_calls_during_training": int(sum(r["env_calls_during_training"] for r in rs)),
            "update_s_median": mean_ci([r["update_s_median"] for r in rs]).to_dict(),
            "seeds": [r["seed"] for r in rs]}
        end = [r["ratio"][-1] for r in rs if r.get("ratio")]
        if end:
            table[name]["ratio_end"] = {
                k: mean_ci([e[k] for e in end if e.get(k) is not None]).to_dict()
                for k in DIAG_KEYS}
        start = [r["ratio"][0] for r in rs if r.get("ratio") and r["ratio"][0]["step"] == 0]
        if start and name.startswith("reopd"):
            table[name]["ratio_start"] = {
                k: mean_ci([e[k] for e in start if e.get(k) is not None]).to_dict()
                for k in DIAG_KEYS}
        held = [r["ratio_heldout"] for r in rs if r.get("ratio_heldout")]
        if held:
            table[name]["ratio_heldout"] = {
                k: mean_ci([e[k] for e in held if e.get(k) is not None]).to_dict()
                for k in DIAG_KEYS}
        if name.endswith("auto"):
            table[name]["kappa_final"] = mean_ci([r["kappa"] for r in rs]).to_dict()
    for name in names:
        ref_name = reference_of(name)
        if ref_name is None:
            continue
        ref = {r["seed"]: r["after"]["success_rate"] for k, r in runs.items()
               if k.split("/")[0] == ref_name}
        pairs = [(r["after"]["success_rate"], ref[r["seed"]]) for k, r in runs.items()
                 if k.split("/")[0] == name and r["seed"] in ref]
        if len(pairs) >= 2:
            table[name]["paired"] = {"ref": ref_name,
                                     **mean_ci([a - b for a, b in pairs]).to_dict()}
    tpath = Path(cache) / "teacher_eval.json"
    if tpath.is_file():
        t = json.loads(tpath.read_text())
        k = round(t["success_rate"] * t["n"])
        table["teacher"] = {"success_rate": t["success_rate"], "n": t["n"],
                            "wilson95": list(wilson_ci(k, t["n"]))}
    return table


def to_markdown(table: dict) -> str:
    lines = ["| method | task success (mean ± 95% CI over seeds) | paired difference | "
             "env calls in training | median s / update |", "|---|---|---|---|---|"]
    if "teacher" in table:
        t = table["teacher"]
        lines.append(f"| teacher (PyTorch, n={t['n']}) | {t['success_rate']:.3f} "
                     f"(Wilson [{t['wilson95'][0]:.3f}, {t['wilson95'][1]:.3f}]) | – | – | – |")
    if "student_before" in table:
        b = table["student_before"]
        lines.append(f"| student before distillation | {b['mean']:.3f} ± "
                     f"{b['ci_half_width']:.3f} | – | – | – |")
    for name, row in table.items():
        if name in ("teacher", "student_before"):
            continue
        s, u = row["success"], row["update_s_median"]
        d = row.get("paired")
        dd = f"{d['mean']:+.3f} ± {d['ci_half_width']:.3f} vs {d['ref']}" if d else "–"
        lines.append(f"| {name} | {s['mean']:.3f} ± {s['ci_half_width']:.3f} (n={s['n']}) | "
                     f"{dd} | {row['env_calls_during_training']} | {u['mean']:.3f} |")
    for tags, title in ((("ratio_start", "ratio_end"), "the training pool"),
                        (("ratio_heldout",), "the held-out pool (never trained on)")):
        diag = [(n, r) for n, r in table.items()
                if isinstance(r, dict) and any(t in r for t in tags)]
        if not diag:
            continue
        lines += ["", f"Prefix likelihood-ratio diagnostic of each method's final student on "
                  f"{title} (mean ± 95% CI over seeds; c̄ in nats per agent turn; OLS of "
                  f"log br_t on t):",
                  "", "| method | c̄ | exp(−c̄) | slope | R² |", "|---|---|---|---|---|"]
        for name, r in diag:
            for tag in tags:
                if tag not in r:
                    continue
                e = r[tag]
                label = name + (" (warm start)" if tag == "ratio_start" else "")
                lines.append(f"| {label} | " + " | ".join(
                    f"{e[k]['mean']:.3f} ± {e[k]['ci_half_width']:.3f}"
                    for k in DIAG_KEYS) + " |")
    return "\n".join(lines) + "\n\nAll numbers: synthetic arithmetic task.\n"


def read_json_object(path: Path, flag: str) -> dict:
    """A JSON object file; ``BadInput`` naming the flag and file when missing or malformed."""
    from prada_jax.errors import BadInput
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise BadInput(f"{flag}: {path}: cannot read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:
        raise BadInput(f"{flag}: {path}: not valid JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{flag}: {path}: top level must be an object")
    return data
