"""Multi-seed report of the built-in ReOPD task: teacher, student before/after each method, and
the paper's claims with verdicts.

    python -m studies.distill_claims --out=checkpoints/distill_report [--seeds=0-9] \
        [--cache=checkpoints/task_cache/seed0] [--steps=1000] [--warm_steps=300] \
        [--cont_steps=300] [--onpolicy_steps=100] [--batch_size=64] [--n_eval=256] \
        [--eval_points=0] [--margin=0.02] [--methods=a,b,...] [--merge_from=DIR,DIR] \
        [--warm=warm_k0.6|warm_k1]

Every method is ONE training process over all seeds (``config.train.num_seeds`` = number of
seeds, vmapped; seeds must be consecutive, seed_i = first seed + i: student init, batch draws,
sampling keys), in ``<out>/<method>`` with one student per seed in ``seed_<s>/student_hf``.
Methods (``PLAN``):

* from a random init, ``--steps`` offline updates: ``fkl_k0.6`` (forward KL on exported top-k +
  tail, κ = 0.6), ``fkl_k1`` (κ = 1, uniform turns), ``fkl_late`` (late-heavy
  p ∝ 0.6^(K-1-t)), ``sft`` (cross-entropy on teacher tokens, κ = 0.6: the loss alone differs
  from ``fkl_k0.6``), ``sft_k1`` (plain SFT: cross-entropy on every teacher turn equally, κ = 1),
  ``fkl_auto`` / ``fkl_exact`` (the adaptive weightings below, from scratch);
* warm starts, ``--warm_steps`` offline updates: ``warm_k0.6``, ``warm_k1`` (when
  ``--warm_steps`` equals ``--steps`` and ``fkl_k0.6`` / ``fkl_k1`` already ran in ``--out``,
  the warm start is that run, linked, not retrained);
* continuations of the ``--warm`` start (``warm_k0.6`` by default; each seed from its own
  warm student), ``--cont_steps``
  offline updates (lr 1e-3, 5 warm-up): ``cont_k0.6``, ``cont_k1``, ``cont_auto`` (κ = exp(−c̄),
  c̄ the student's mean per-turn gap to the teacher on the pool, re-estimated every
  ``sampler.refresh_every`` updates, held at 0.6 while c̄ > ``sampler.auto_gap_max`` —
  beyond the paper, :mod:`prada_jax.distill.ratio`), ``cont_exact`` (turns weighted by the
  clipped per-prefix likelihood ratio br_{i,t} instead of κ^t); ``cont_k0.6_wall``: κ = 0.6
  for as many updates as fit in the wall time of ``reopd_k0.6``'s updates,
  ``round(onpolicy_steps × u_on / u_off)`` with the measured median seconds per update of
  ``reopd_k0.6`` and ``cont_k0.6`` (run those first);
* on-policy ReOPD (student samples, teacher scores, reverse-KL policy gradient),
  ``--onpolicy_steps`` updates: ``reopd_k0.6`` and ``reopd_auto`` from the ``--warm`` start,
  ``reopd_k1`` from ``warm_k1`` (a random student's samples carry no signal on this task).

Every run also logs the pool likelihood-ratio diagnostic (c̄, exp(−c̄), and the OLS of log br_t
on the turn index: slope, R²) at its start and end. ``report.json`` + ``report.md`` hold:

* **claims** (:data:`CLAIMS`): for each of the paper's claims the paired difference of task
  success per seed (method − reference) with its 95% Student-t CI and a verdict — supported,
  refuted, or unresolved at this power — with the reason (:func:`verdict`; ``--margin`` is the
  smallest difference that matters; methods at the floor/ceiling on every seed are
  unresolved);
* the mean ± 95% CI over seeds of the task success rate, a paired difference to the method's
  reference (``fkl_k0.6`` from scratch, ``cont_k0.6`` for continuations, the warm start for
  ReOPD), the environment calls during training, the median wall time per update, and the
  diagnostic of each method's final student (and of the warm start for ReOPD);
* ``success_vs_updates.png``: task success against updates, mean and 95% CI band over seeds,
  from the before/after evaluations and ``--eval_points`` evaluations inside each run.

All data is synthetic (the built-in tasks generate their problems); the report names the task
from ``<cache>/pool/pool.json``.
"""
from __future__ import annotations

from pathlib import Path

import time

import numpy as np
from flax import nnx

from prada_jax import config_utils as cu
from prada_jax.configs.distill import get_config
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import ratio
from prada_jax.distill import teacher_table
from prada_jax.distill.task.evaluate import wilson_ci
from prada_jax.distill.trainer import train_and_evaluate
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from prada_jax.lm.hf import load_hf
from prada_jax.stats import mean_ci


def _config(cache: str, seed: int, variant: str, steps: int, n_eval: int, **over):
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


# The warm start the continuations and on-policy runs continue from (``--warm``): a
# placeholder in PLAN, resolved by :func:`plan_of`.
WARM = "<warm>"
WARM_STARTS = ("warm_k0.6", "warm_k1")
# a warm start with the same config and budget as a from-scratch method IS that method's run
TWIN = {"warm_k0.6": "fkl_k0.6", "warm_k1": "fkl_k1"}

# name -> (config variant, warm start it continues from or None, budget); budgets: "steps"
# (offline from a random init), "warm" (the warm starts), "cont" (offline continuation of a
# warm start), "onpolicy" (ReOPD updates from a warm start).
PLAN = {
    "fkl_k0.6": ("", None, "steps"),
    "fkl_k1": ("uniform", None, "steps"),
    "fkl_late": ("late", None, "steps"),
    "sft": ("sft", None, "steps"),
    # plain SFT as usually run: cross-entropy on every teacher turn equally (κ = 1)
    "sft_k1": ("sft,uniform", None, "steps"),
    "fkl_auto": ("auto", None, "steps"),
    "fkl_exact": ("exact", None, "steps"),
    "warm_k0.6": ("", None, "warm"),
    "warm_k1": ("uniform", None, "warm"),
    "cont_k0.6": ("", WARM, "cont"),
    "cont_k1": ("uniform", WARM, "cont"),
    "cont_auto": ("auto", WARM, "cont"),
    "cont_exact": ("exact", WARM, "cont"),
    "reopd_k0.6": ("onpolicy", WARM, "onpolicy"),
    "reopd_k1": ("onpolicy,uniform", "warm_k1", "onpolicy"),
    "reopd_auto": ("onpolicy,auto", WARM, "onpolicy"),
    # offline continuation of the warm start for the wall time of reopd_k0.6's updates (claim b)
    "cont_k0.6_wall": ("", WARM, "wall"),
}


def plan_of(name: str, warm: str = "warm_k0.6") -> tuple[str, str | None, str]:
    """PLAN[name] with the continuations' warm start resolved to ``warm`` (one of
    :data:`WARM_STARTS`)."""
    if warm not in WARM_STARTS:
        raise ValueError(f"--warm={warm}: choose from {WARM_STARTS}")
    variant, warm_from, budget = PLAN[name]
    return variant, (warm if warm_from == WARM else warm_from), budget


def adaptive(variant: str) -> bool:
    """Whether a config variant re-weights its sampler from the ratio diagnostic."""
    return bool({"auto", "exact"} & set(variant.split(",")))


def check_seeds(seeds) -> list[int]:
    """The seeds of a report: consecutive integers (one vmapped run per method trains seeds
    ``seeds[0] + i``, :mod:`prada_jax.distill.trainer`); ValueError otherwise."""
    seeds = [int(s) for s in seeds]
    if not seeds or seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise ValueError(f"seeds must be consecutive integers (one vmapped run per method), "
                         f"got {seeds}")
    return seeds


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-11"`` (inclusive range) -> consecutive seeds; ValueError otherwise."""
    text = text.strip()
    if "-" in text[1:] and "," not in text:
        lo, hi = text.split("-", 1) if not text.startswith("-") else (None, None)
        return check_seeds(range(int(lo), int(hi) + 1))
    return check_seeds([int(s) for s in text.split(",") if s.strip()])


def _median_update_s(runs: dict, name: str) -> float | None:
    vals = [r["update_s_median"] for k, r in runs.items()
            if k.split("/")[0] == name and r.get("update_s_median") is not None]
    return float(np.median(vals)) if vals else None


def wall_budget(runs: dict, onpolicy_steps: int) -> tuple[int, dict]:
    """Updates of ``cont_k0.6_wall``: the offline continuation given the wall time of
    ``reopd_k0.6``'s updates, ``round(onpolicy_steps × u_on / u_off)`` with u the measured
    median seconds per (all-seed, vmapped) update of ``reopd_k0.6`` and ``cont_k0.6``."""
    u_on, u_off = _median_update_s(runs, "reopd_k0.6"), _median_update_s(runs, "cont_k0.6")
    if u_on is None or u_off is None:
        raise FileNotFoundError("cont_k0.6_wall needs the update times of reopd_k0.6 and "
                                "cont_k0.6: run them first (--methods order)")
    steps = max(1, int(round(onpolicy_steps * u_on / u_off)))
    return steps, {"u_onpolicy_s": u_on, "u_offline_s": u_off, "onpolicy_steps": onpolicy_steps,
                   "steps": steps}


def _reuse_twin(out: Path, runs: dict, name: str, seeds, budgets: dict) -> bool:
    """A warm start whose from-scratch twin (:data:`TWIN`: same config) ran the same number of
    updates in ``out`` is that run: ``<out>/<warm>`` becomes a relative symlink to the twin's
    folder and the twin's records are copied under the warm start's name (``reused_from``),
    instead of training the same students twice. False when there is nothing to reuse."""
    twin = TWIN.get(name)
    if twin is None or budgets.get("warm") != budgets.get("steps"):
        return False
    recs = [runs.get(f"{twin}/seed{s}") for s in seeds]
    if any(r is None for r in recs) or not (out / twin).is_dir():
        return False
    link = out / name
    if not link.exists():
        link.symlink_to(twin, target_is_directory=True)
    for r in recs:
        runs[f"{name}/seed{r['seed']}"] = {**r, "budget": "warm", "reused_from": twin}
    return True


def run(out: Path, cache: str, seeds, budgets: dict, n_eval: int, methods,
        eval_points: int = 0, batch_size: int = 64, warm: str = "warm_k0.6") -> dict:
    """Runs every method not yet in ``<out>/runs.json`` for all ``seeds`` in ONE process run
    with ``config.train.num_seeds = len(seeds)`` (seed_i = seeds[0] + i, vmapped; workdir
    ``<out>/<method>``); ``budgets`` maps the PLAN budget names to optimizer updates
    (``wall`` is derived, :func:`wall_budget`). ``eval_points`` > 0 adds that many evenly
    spaced task evaluations inside each run (``config.eval.every``) for the success-vs-updates
    curves. ``warm`` is the warm start the continuations and on-policy runs continue from
    (:func:`plan_of`); a warm start equal to a from-scratch run already here is reused
    (:func:`_reuse_twin`); a continuation's "before" is its warm start's final evaluation (the
    same students on the same problems, ``eval.before = False``). Runs with a fixed sampler
    take the ratio diagnostic at their start and end only (``sampler.refresh_every = 0``; it
    changes nothing they train on). Records per seed in ``runs.json`` under
    ``<method>/seed<s>``."""
    unknown = [m for m in methods if m not in PLAN]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {sorted(PLAN)}")
    seeds = check_seeds(seeds)
    n = len(seeds)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "runs.json"
    runs = read_json(res_path) if res_path.is_file() else {}
    for name in methods:
        if all(f"{name}/seed{s}" in runs for s in seeds):
            continue
        variant, warm_from, budget = plan_of(name, warm)
        if budget == "warm" and _reuse_twin(out, runs, name, seeds, budgets):
            write_json(res_path, runs, newline=False)
            print(f"{name}: the same students as {TWIN[name]} (reused, not retrained)",
                  flush=True)
            continue
        over = {"train.num_seeds": n, "train.batch_size": batch_size}
        if not adaptive(variant):
            over["sampler.refresh_every"] = 0
        if warm_from is not None:
            wdir = out / warm_from
            need = ([wdir / f"seed_{s}" / "student_hf" for s in seeds] if n > 1
                    else [wdir / "student_hf"])
            missing = [str(p) for p in need if not p.is_dir()]
            if missing:
                raise FileNotFoundError(f"{missing[0]}: run {warm_from} first")
            over.update({"student.init": str(wdir if n > 1 else need[0]),
                         "optim.warmup_steps": 5, "optim.lr": 1e-3})
            warm_after = {s: runs.get(f"{warm_from}/seed{s}", {}).get("after") for s in seeds}
            if all(warm_after.values()):
                # the warm start's own final evaluation: the same students on the same problems
                over["eval.before"] = False
        extra = {}
        if budget == "wall" and budgets.get("wall"):
            # fixed by the caller (--wall_steps), e.g. from an early estimate of u_on
            steps = int(budgets["wall"])
            extra = {"steps": steps, "onpolicy_steps": budgets["onpolicy"], "fixed": True}
        elif budget == "wall":
            steps, extra = wall_budget(runs, budgets["onpolicy"])
        else:
            steps = budgets[budget]
        if eval_points > 0:
            over["eval.every"] = max(1, -(-steps // (eval_points + 1)))
        cfg = _config(cache, seeds[0], variant, steps, n_eval, **over)
        t0 = time.perf_counter()
        r = train_and_evaluate(cfg, out / name)
        wall = time.perf_counter() - t0
        per = r["per_seed"] if n > 1 else [r]
        for rr in per:
            rr.pop("already_finished", None)
            if warm_from is not None and not rr.get("before") and warm_after.get(rr["seed"]):
                rr["before"] = {**warm_after[rr["seed"]], "from_warm_start": warm_from}
            rr.update(budget=budget, warm_from=warm_from, steps=steps, run_wall_s=wall,
                      num_seeds=n, **({"wall_budget": extra} if extra else {}))
            runs[f"{name}/seed{rr['seed']}"] = rr
        write_json(res_path, runs, newline=False)
        after = [rr["after"].get("success_rate") for rr in per if rr.get("after")]
        print(f"{name}: {n} seeds, {steps} updates, {wall:.0f} s; success after "
              f"{np.mean(after) if after else float('nan'):.3f} (mean); env_calls "
              f"{per[0]['env_calls_during_training']}; update_s {per[0]['update_s_median']}",
              flush=True)
    return runs


DIAG_KEYS = ("mean_gap", "kappa_auto", "slope", "r2")


def heldout_diagnostics(runs: dict, roots, cache: str) -> int:
    """Adds ``ratio_heldout`` (the prefix-ratio diagnostic of the run's final student on the
    held-out pool ``<cache>/pool_heldout`` with ``<cache>/logits_heldout``) to every run that
    lacks it and whose ``student_hf`` is found under one of ``roots`` as
    ``<root>/<method>/seed_<seed>/student_hf`` (a multi-seed run), ``<root>/<method>/seed<seed>/
    student_hf`` (older reports) or ``<root>/<method>/student_hf`` (one seed). Returns how many were added (0 without a held-out
    pool)."""

    hp, hl = Path(cache) / "pool_heldout", Path(cache) / "logits_heldout"
    if not (hp.is_dir() and hl.is_dir()):
        return 0
    pool = pool_lib.load_pool(hp)
    table = teacher_table.load(hl, pool)
    added = 0
    for key, r in runs.items():
        if "ratio_heldout" in r or r.get("reused_from"):
            continue
        name, seed = key.split("/")
        s_ = seed.removeprefix("seed")
        found = [Path(root) / name / p / "student_hf" for root in roots
                 for p in (f"seed_{s_}", seed, "")]
        found = [f for f in found if f.is_dir()]
        if not found:
            continue
        model, _ = load_hf(found[0])
        gd, params = nnx.split(model, nnx.Param)
        d = ratio.diagnose_student(ratio.token_logp_fn(gd), params, pool, table)
        r["ratio_heldout"] = {k: v for k, v in d.summary().items()}
        added += 1
    return added + _copy_twin_heldout(runs)


def _copy_twin_heldout(runs: dict) -> int:
    """A reused warm start (``reused_from``) takes its twin's held-out diagnostic: the same
    students, so it is not computed twice."""
    copied = 0
    for key, r in runs.items():
        twin = runs.get(f"{r.get('reused_from')}/{key.split('/')[1]}", {})
        if "ratio_heldout" not in r and "ratio_heldout" in twin:
            r["ratio_heldout"] = dict(twin["ratio_heldout"])
            copied += 1
    return copied


def reference_of(name: str, runs: dict | None = None) -> str | None:
    """The run a method is compared with, paired by seed (None for the references); an
    on-policy run is compared with the warm start its records name (``warm_from``)."""
    if name not in PLAN or name in ("fkl_k0.6", "cont_k0.6") or name.startswith("warm"):
        return None
    variant, warm_from, budget = PLAN[name]
    if budget == "onpolicy":
        recorded = [r.get("warm_from") for k, r in (runs or {}).items()
                    if k.split("/")[0] == name and r.get("warm_from")]
        warm_from = recorded[0] if recorded else plan_of(name)[1]
    return {"steps": "fkl_k0.6", "cont": "cont_k0.6", "wall": "cont_k0.6",
            "onpolicy": warm_from}[budget]


TASK_LABELS = {"arith_calc_v1": "synthetic arithmetic task",
               "kg_lookup_v1": "synthetic knowledge-graph task (kg_lookup_v1)"}


def task_label(cache: str) -> str:
    """What the report's numbers come from, read from ``<cache>/pool/pool.json``'s ``task``."""
    try:
        name = read_json(Path(cache) / "pool" / "pool.json").get("task", "")
    except (OSError, ValueError, AttributeError):
        name = ""
    return TASK_LABELS.get(name, f"task {name}" if name else "synthetic task")


def summarize(runs: dict, cache: str) -> dict:
    table = {"task": task_label(cache)}
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
        ref_name = reference_of(name, runs)
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
        t = read_json(tpath, expect=None)
        # one decoding rule (arith: greedy) or {"sampled": ..., "greedy": ...} (kg: the pool's
        # sampling temperature and greedy)
        for key, e in ((("teacher", t),) if "success_rate" in t else
                       (("teacher", t.get("sampled")), ("teacher_greedy", t.get("greedy")))):
            if isinstance(e, dict) and "success_rate" in e and "n" in e:
                k = round(e["success_rate"] * e["n"])
                table[key] = {"success_rate": e["success_rate"], "n": e["n"],
                              "wilson95": list(wilson_ci(k, e["n"])),
                              "label": ("greedy" if key == "teacher_greedy" else
                                        f"sampled τ = {t['temperature']:g}"
                                        if "temperature" in t and "sampled" in t else "")}
    return table


def to_markdown(table: dict) -> str:
    lines = ["| method | task success (mean ± 95% CI over seeds) | paired difference | "
             "env calls in training | median s / update |", "|---|---|---|---|---|"]
    for key in ("teacher", "teacher_greedy"):
        if key in table:
            t = table[key]
            how = f", {t['label']}" if t.get("label") else ""
            lines.append(f"| teacher (PyTorch{how}, n={t['n']}) | {t['success_rate']:.3f} "
                         f"(Wilson [{t['wilson95'][0]:.3f}, {t['wilson95'][1]:.3f}]) | – | – | "
                         "– |")
    if "student_before" in table:
        b = table["student_before"]
        lines.append(f"| student before distillation | {b['mean']:.3f} ± "
                     f"{b['ci_half_width']:.3f} | – | – | – |")
    for name, row in table.items():
        if name in ("teacher", "teacher_greedy", "student_before", "task"):
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
    return "\n".join(lines) + f"\n\nAll numbers: {table.get('task', 'synthetic task')}.\n"


# The paper's claims as hypotheses: (id, statement, method, reference, kind). kind "beats":
# method − reference > 0; kind "noninferior": method − reference > −margin.
CLAIMS = (
    ("a1", "κ = 0.6 beats uniform κ = 1 (offline forward KL, from scratch)",
     "fkl_k0.6", "fkl_k1", "beats"),
    ("a2", "κ = 0.6 beats late-heavy p ∝ 0.6^(K−1−t) (offline, from scratch)",
     "fkl_k0.6", "fkl_late", "beats"),
    ("a3", "κ = 0.6 forward KL beats SFT on the teacher tokens (offline, from scratch)",
     "fkl_k0.6", "sft", "beats"),
    ("a4", "κ = 0.6 forward KL beats plain SFT (cross-entropy on every teacher turn equally, "
     "κ = 1; offline, from scratch)", "fkl_k0.6", "sft_k1", "beats"),
    ("a5", "forward KL on the teacher's top-k + tail beats SFT at equal turn weights (both κ = 1, "
     "offline, from scratch)", "fkl_k1", "sft_k1", "beats"),
    ("b1", "on-policy ReOPD beats continuing offline from the same warm start, equal updates",
     "reopd_k0.6", "cont_k0.6", "beats"),
    ("b2", "on-policy ReOPD beats continuing offline from the same warm start, equal wall time",
     "reopd_k0.6", "cont_k0.6_wall", "beats"),
    ("c1", "κ = auto from scratch does not collapse: at least as good as κ = 0.6 (within the "
     "margin)", "fkl_auto", "fkl_k0.6", "noninferior"),
    ("c2", "κ = auto continuing a warm start is at least as good as κ = 0.6 (within the margin)",
     "cont_auto", "cont_k0.6", "noninferior"),
)


def verdict(kind: str, low: float, high: float, margin: float) -> tuple[str, str]:
    """(verdict, reason) of a claim from the 95% CI [low, high] of the paired difference
    (method − reference) of task success; ``margin`` = smallest difference that matters.

    beats: supported if low > 0; refuted if high < margin (any gain is smaller than the
    margin, or the method is worse); else unresolved. noninferior: supported if low > −margin;
    refuted if high < 0 (the method is worse); else unresolved."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return "unresolved at this power", "fewer than 2 paired seeds"
    ci = f"95% CI [{low:+.3f}, {high:+.3f}]"
    if kind == "beats":
        if low > 0:
            return "supported", f"{ci} excludes 0"
        if high < margin:
            return "refuted", (f"{ci} lies below the margin +{margin:g}: no gain of that size"
                               + (" (the method is worse)" if high < 0 else ""))
        return "unresolved at this power", f"{ci} contains 0 and gains above +{margin:g}"
    if low > -margin:
        return "supported", f"{ci} lies above −{margin:g}"
    if high < 0:
        return "refuted", f"{ci} lies below 0: the method is worse"
    return "unresolved at this power", f"{ci} contains both 0 and differences below −{margin:g}"


def claims(runs: dict, margin: float = 0.02) -> list[dict]:
    """Every :data:`CLAIMS` entry whose two methods ran on ≥ 1 common seed: paired difference
    of task success (method − reference, per seed), its mean ± 95% Student-t CI, the
    verdict and the reason."""
    out = []
    for cid, text, name, ref, kind in CLAIMS:
        a = {r["seed"]: r["after"]["success_rate"] for k, r in runs.items()
             if k.split("/")[0] == name and r.get("after")}
        b = {r["seed"]: r["after"]["success_rate"] for k, r in runs.items()
             if k.split("/")[0] == ref and r.get("after")}
        common = sorted(set(a) & set(b))
        if not common:
            continue
        d = mean_ci([a[s] - b[s] for s in common])
        v, why = verdict(kind, d.low, d.high, margin)
        both = [a[s] for s in common] + [b[s] for s in common]
        if max(both) < margin or min(both) > 1.0 - margin:
            # every seed of both methods at the floor (or ceiling): nothing to separate them
            v, why = "unresolved at this power", (
                f"every seed of both methods has success {'<' if max(both) < margin else '>'} "
                f"{margin if max(both) < margin else 1.0 - margin:g} (floor/ceiling): the "
                f"budget cannot separate them")
        rec = {"id": cid, "claim": text, "method": name, "reference": ref, "kind": kind,
               "n": len(common), "diff_mean": d.mean,
               "ci95": [d.low, d.high] if d.n >= 2 else None,
               "method_mean": float(np.mean([a[s] for s in common])),
               "reference_mean": float(np.mean([b[s] for s in common])),
               "verdict": v, "reason": why, "margin": margin}
        wb = [r.get("wall_budget") for k, r in runs.items()
              if k.split("/")[0] == ref and r.get("wall_budget")]
        if wb:
            rec["wall_budget"] = wb[0]
        if name.endswith("auto"):
            held = [any(x.get("kappa_held") for x in r.get("ratio", [])) for k, r in runs.items()
                    if k.split("/")[0] == name]
            rec["kappa_held_seeds"] = int(sum(held))
        out.append(rec)
    return out


def claims_markdown(cl: list[dict]) -> str:
    if not cl:
        return ""
    lines = ["## Claims", "",
             "Paired difference of task success (method − reference, same seed), mean and 95% "
             f"Student-t CI over seeds; margin = {cl[0]['margin']:g} (smallest difference that "
             "matters). beats: supported if the CI excludes 0 on the positive side, refuted if "
             "it lies below +margin; at least as good: supported if it lies above −margin, "
             "refuted if below 0; otherwise unresolved at this power.", "",
             "| claim | method vs reference | n | means | paired difference [95% CI] | verdict "
             "| reason |", "|---|---|---|---|---|---|---|"]
    for c in cl:
        ci = "n/a" if c["ci95"] is None else f"[{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
        extra = ""
        if "wall_budget" in c:
            w = c["wall_budget"]
            if w.get("fixed"):
                extra = (f"; {c['reference']} ran {w['steps']} updates (--wall_steps, fixed by "
                         "the caller; see the note on the wall budget)")
            else:
                extra = (f"; {c['reference']} ran {w['steps']} updates = {w['onpolicy_steps']}"
                         f" × {w['u_onpolicy_s']:.3f} s / {w['u_offline_s']:.3f} s (median s "
                         "per update, on-policy / offline)")
        if "kappa_held_seeds" in c:
            extra += f"; κ held at its configured value in ≥ 1 refresh on {c['kappa_held_seeds']} seeds"
        lines.append(f"| {c['id']}: {c['claim']} | {c['method']} vs {c['reference']} | {c['n']} "
                     f"| {c['method_mean']:.3f} vs {c['reference_mean']:.3f} | "
                     f"{c['diff_mean']:+.3f} {ci} | **{c['verdict']}** | {c['reason']}{extra} |")
    return "\n".join(lines) + "\n"


def success_curves(runs: dict) -> dict:
    """method -> {"x": [updates], "mean", "low", "high"} of task success over seeds at every
    evaluation point: "before" (update 0), ``curve`` points (``--eval_points``) and "after";
    continuations are placed after their warm start's updates."""
    names = sorted({k.split("/")[0] for k in runs})
    out = {}
    for name in names:
        rs = [r for k, r in runs.items() if k.split("/")[0] == name and r.get("after")]
        if not rs:
            continue
        warm_from = rs[0].get("warm_from")
        off = 0
        if warm_from:
            w = [r for k, r in runs.items() if k.split("/")[0] == warm_from]
            off = int(w[0].get("steps", 0)) if w else 0
        pts: dict[int, list] = {}
        for r in rs:
            seq = [(0, (r.get("before") or {}).get("success_rate"))]
            seq += [(c["step"], c["success_rate"]) for c in r.get("curve", [])]
            seq.append((int(r.get("steps", 0)), r["after"]["success_rate"]))
            for x, y in seq:
                if y is not None:
                    pts.setdefault(off + x, []).append(y)
        xs = sorted(pts)
        cis = [mean_ci(pts[x]) for x in xs]
        out[name] = {"x": xs, "mean": [c.mean for c in cis], "low": [c.low for c in cis],
                     "high": [c.high for c in cis], "warm_from": warm_from}
    return out


def plot_success(curves: dict, path: Path, task: str = "synthetic task") -> Path | None:
    """PNG: task success vs updates, mean and 95% CI band over seeds; left panel from
    scratch, right panel warm starts and what continues them."""
    if not curves:
        return None
    import matplotlib  # lazy: matplotlib only when a figure is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: pyplot after use("Agg")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    groups = ([n for n, c in curves.items() if not c["warm_from"] and not n.startswith("warm")],
              [n for n, c in curves.items() if c["warm_from"] or n.startswith("warm")])
    for ax, names, title in zip(axes, groups, ("from a random init", "warm start → continuation")):
        for i, n in enumerate(names):
            c = curves[n]
            x, m = np.asarray(c["x"], float), np.asarray(c["mean"], float)
            lo = np.where(np.isfinite(c["low"]), c["low"], m)
            hi = np.where(np.isfinite(c["high"]), c["high"], m)
            col = plt.cm.tab10(i % 10)
            ax.plot(x, m, marker="o", ms=3, color=col, label=n)
            ax.fill_between(x, lo, hi, color=col, alpha=0.18, linewidth=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("optimizer updates")
        ax.grid(True, alpha=0.3)
        if names:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("task success (mean, 95% CI over seeds)")
    fig.suptitle(f"ReOPD on the {task}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def read_json_object(path: Path, flag: str) -> dict:
    """A JSON object file; ``BadInput`` naming the flag and file when missing or malformed."""
    try:
        return read_json(path)
    except BadInput as e:
        raise BadInput(f"{flag}: {e}") from None
