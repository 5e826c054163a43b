"""Multi-seed report of the built-in ReOPD task: teacher, student before/after each method.

    python -m evals.distill_report --out checkpoints/distill_report [--seeds 0,1,2] \
        [--cache checkpoints/task_cache/seed0] [--steps 300] [--onpolicy-steps 100]

Runs, for every seed (student init, batch draws, sampling keys), in this order:

* ``fkl_k0.6``   offline forward KL on exported top-k + tail, κ = 0.6
* ``fkl_k1``     offline forward KL, κ = 1 (uniform turns)
* ``fkl_late``   offline forward KL, late-heavy p ∝ 0.6^(K-1-t)
* ``sft``        cross-entropy on teacher tokens, κ = 0.6
* ``fkl_auto``   offline forward KL, κ = exp(−c̄) re-estimated from the student every
  ``sampler.refresh_every`` updates (beyond the paper; :mod:`prada_jax.distill.ratio`)
* ``fkl_exact``  offline forward KL, turns weighted by the clipped per-prefix likelihood ratio
* ``reopd_k0.6`` / ``reopd_k1``  on-policy ReOPD (student samples, teacher scores, reverse-KL
  policy gradient), warm-started from that seed's ``fkl_*`` student after ``--warm-steps``
  offline updates (a random student's samples carry no signal on this task); ``reopd_auto``
  is on-policy ReOPD with the automatic κ, from the ``warm_k0.6`` start

Every run also logs the pool likelihood-ratio diagnostic (mean per-turn gap c̄, exp(−c̄), and
the regression of log br on the turn index: slope, R²) at its start and end; the report
summarises the end-of-run values per method, and paired differences to ``fkl_k0.6``.

and writes ``report.json`` + ``report.md`` (mean ± 95% Student-t CI over seeds of the task
success rate, the environment calls during training, and the median wall time per update).
All data is synthetic (generated arithmetic problems).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _config(cache: str, seed: int, variant: str, steps: int, n_eval: int, **over):
    from train.configs.distill import get_config
    c = get_config(variant)
    c.data.cache = cache
    c.seed = seed
    c.train.steps = steps
    c.log.ckpt_every = max(steps, 1)
    c.log.progress = False
    c.eval.n_problems = n_eval
    for k, v in over.items():
        node = c
        parts = k.split(".")
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = v
    return c


def run(out: Path, cache: str, seeds, steps: int, warm_steps: int, onpolicy_steps: int,
        n_eval: int, methods) -> dict:
    from prada_jax.distill.loop import train_and_evaluate
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "runs.json"
    runs = json.loads(res_path.read_text()) if res_path.is_file() else {}
    plan = {
        "fkl_k0.6": ("", {}),
        "fkl_k1": ("uniform", {}),
        "fkl_late": ("late", {}),
        "sft": ("sft", {}),
        "fkl_auto": ("auto", {}),
        "fkl_exact": ("exact", {}),
        "warm_k0.6": ("", {}),
        "warm_k1": ("uniform", {}),
        "reopd_k0.6": ("onpolicy", {}),
        "reopd_k1": ("onpolicy,uniform", {}),
        "reopd_auto": ("onpolicy,auto", {}),
    }
    for seed in seeds:
        for name in methods:
            key = f"{name}/seed{seed}"
            if key in runs:
                continue
            variant, over = plan[name]
            n_steps = steps
            if name.startswith("warm"):
                n_steps = warm_steps
            if name.startswith("reopd"):
                n_steps = onpolicy_steps
                tag = {"auto": "k0.6"}.get(name.split("_")[1], name.split("_")[1])
                warm = out / f"warm_{tag}" / f"seed{seed}" / "student_hf"
                if not warm.is_dir():
                    raise FileNotFoundError(f"{warm}: run warm_{tag} first")
                over = dict(over, **{"student.init": str(warm), "optim.warmup_steps": 5,
                                     "optim.lr": 1e-3})
            cfg = _config(cache, seed, variant, n_steps, n_eval, **over)
            r = train_and_evaluate(cfg, out / name / f"seed{seed}")
            runs[key] = r
            res_path.write_text(json.dumps(runs, indent=2))
            print(f"{key}: before {r.get('before', {}).get('success_rate')} after "
                  f"{r['after'].get('success_rate')} env_calls "
                  f"{r['env_calls_during_training']} update_s {r['update_s_median']:.3f}",
                  flush=True)
    return runs


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
                for k in ("mean_gap", "kappa_auto", "slope", "r2")}
        start = [r["ratio"][0] for r in rs if r.get("ratio") and r["ratio"][0]["step"] == 0]
        if start and name.startswith("reopd"):
            table[name]["ratio_start"] = {
                k: mean_ci([e[k] for e in start if e.get(k) is not None]).to_dict()
                for k in ("mean_gap", "kappa_auto", "slope", "r2")}
        if name.endswith("auto"):
            table[name]["kappa_final"] = mean_ci([r["kappa"] for r in rs]).to_dict()
    ref = {r["seed"]: r["after"]["success_rate"] for k, r in runs.items()
           if k.startswith("fkl_k0.6/")}
    for name in names:
        pairs = [(r["after"]["success_rate"], ref[r["seed"]]) for k, r in runs.items()
                 if k.split("/")[0] == name and r["seed"] in ref]
        if name != "fkl_k0.6" and len(pairs) >= 2:
            table[name]["minus_fkl_k0.6"] = mean_ci([a - b for a, b in pairs]).to_dict()
    tpath = Path(cache) / "teacher_eval.json"
    if tpath.is_file():
        t = json.loads(tpath.read_text())
        k = round(t["success_rate"] * t["n"])
        table["teacher"] = {"success_rate": t["success_rate"], "n": t["n"],
                            "wilson95": list(wilson_ci(k, t["n"]))}
    return table


def to_markdown(table: dict) -> str:
    lines = ["| method | task success (mean ± 95% CI over seeds) | minus fkl_k0.6 (paired) | "
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
        d = row.get("minus_fkl_k0.6")
        dd = f"{d['mean']:+.3f} ± {d['ci_half_width']:.3f}" if d else "–"
        lines.append(f"| {name} | {s['mean']:.3f} ± {s['ci_half_width']:.3f} (n={s['n']}) | "
                     f"{dd} | {row['env_calls_during_training']} | {u['mean']:.3f} |")
    diag = [(n, r) for n, r in table.items() if isinstance(r, dict) and "ratio_end" in r]
    if diag:
        lines += ["", "Pool likelihood-ratio diagnostic of each method's final student "
                  "(mean ± 95% CI over seeds; c̄ in nats per agent turn; OLS of log br_t on t):",
                  "", "| method | c̄ | exp(−c̄) | slope | R² |", "|---|---|---|---|---|"]
        for name, r in diag:
            for tag in ("ratio_start", "ratio_end"):
                if tag not in r:
                    continue
                e = r[tag]
                label = name + (" (warm start)" if tag == "ratio_start" else "")
                lines.append(f"| {label} | " + " | ".join(
                    f"{e[k]['mean']:.3f} ± {e[k]['ci_half_width']:.3f}"
                    for k in ("mean_gap", "kappa_auto", "slope", "r2")) + " |")
    return "\n".join(lines) + "\n\nAll numbers: synthetic arithmetic task.\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.distill_report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="checkpoints/distill_report")
    p.add_argument("--cache", default="checkpoints/task_cache/seed0")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=300, help="offline updates per run")
    p.add_argument("--warm-steps", type=int, default=150, help="offline warm start of ReOPD")
    p.add_argument("--onpolicy-steps", type=int, default=100, help="on-policy updates")
    p.add_argument("--n-eval", type=int, default=256, help="task episodes per evaluation")
    p.add_argument("--methods", default="fkl_k0.6,fkl_k1,sft,warm_k0.6,reopd_k0.6")
    p.add_argument("--merge-from", default="",
                   help="comma-separated report folders whose runs.json are merged in first "
                        "(e.g. one folder per seed run in parallel)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge_from:
        merged = {}
        for d in args.merge_from.split(","):
            merged.update(json.loads((Path(d) / "runs.json").read_text()))
        if (out / "runs.json").is_file():
            merged.update(json.loads((out / "runs.json").read_text()))
        (out / "runs.json").write_text(json.dumps(merged, indent=2))
    runs = run(out, args.cache, seeds, args.steps, args.warm_steps, args.onpolicy_steps,
               args.n_eval, methods)
    table = summarize(runs, args.cache)
    (out / "report.json").write_text(json.dumps(table, indent=2))
    md = to_markdown(table)
    (out / "report.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
