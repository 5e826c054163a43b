"""ReOPD against the online OPD it replaces, from gated cold-start students: the whole
pre-registered study of studies/reopd_vs_opd/README.md in one command (issue 24), SYNTHETIC.

    python -m studies.reopd_vs_opd --cache=DIR --out=DIR [--updates=N] [--episodes=E]
    python -m studies.reopd_vs_opd --quick --out=DIR      # tiny end-to-end run (a test)

The pre-registered addendum of the same report is its own command,
``python -m studies.reopd_vs_opd.addendum`` (it imports this module, not the reverse).

``--cache`` is a task cache (``pool/``, ``logits/``, ``teacher/``; e.g. ``python -m
prada_jax.distill.task.teacher --cache=C`` then ``C/seed0``); ``--quick`` builds a tiny
synthetic one (random teacher) under ``--out`` instead. Stages, each a
``train.distill`` run in ``<out>/<name>`` (a rerun reuses every finished run, so a killed
study resumes where it stopped):

1. cold starts: SFT (``:sft,uniform``) from a random init until the far gate, then continued
   until the near gate (``config.gate``; "gate not reached" is reported, the student used as
   trained); each evaluated on the verdict problems, with the teacher on the same problems;
2. pilot (pilot seeds, pilot problems, far cold start): lr × warm-up for OPD and for ReOPD κ =
   0.6; each mode keeps its best;
3. per cold start, the verdict seeds as one vmapped run per method: ``opd`` (tool latency
   ``--latency_s``), then with B = OPD's mean supervised turns per update: ``reopd_k0.6``,
   ``reopd_k0.8``, ``reopd_k1``, ``reopd_exact``, ``sft_cont``; ``reopd_k0.6_wall`` (N_w =
   round(N × t_OPD / t_ReOPD) updates); ``opd_lat0`` (timing only, latency 0);
4. the teacher re-recording the pool's episodes with the tool at ``--latency_s`` (the prefix
   pool's collection cost C).

Writes ``<out>/study.json`` (settings, cold starts, pilot, per-seed success and gap of every
method, costs, verdicts of rules (a)-(e)) and ``<out>/report.md`` (the tables). Bad input
(a missing cache, a negative latency, zero updates, overlapping pilot and verdict seeds): one
line, exit 2, nothing written.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from absl import flags

from prada_jax import config_utils as cu
from prada_jax.configs.distill import get_config
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import task_registry as tasks_lib
from prada_jax.distill.scoring import load_teacher
from prada_jax.distill.task import common
from prada_jax.distill.task.teacher import tiny_cache
from prada_jax.distill.trainer import train_and_evaluate
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from prada_jax.lm.hf import load_hf
from prada_jax.stats import noninferior, paired_diff_ci, superior
from studies import _shared
from studies.reopd_vs_opd import report

MARGIN = 0.02          # non-inferiority margin of rules (a) and (d) [task success]
SPEED_MIN = 4.0        # rule (b): OPD / ReOPD rollout seconds per supervised turn
SPEED_MIN_POOL = 2.0   # rule (b), including the pool's collection
REOPD_KAPPAS = (0.6, 0.8, 1.0)


@dataclasses.dataclass
class Sizes:
    """Every size of the study (``FULL`` = the pre-registered one; ``QUICK`` for tests)."""

    seeds: tuple = tuple(range(10))          # verdict seeds (one vmapped run per method)
    pilot_seeds: tuple = (100, 101, 102)
    updates: int = 20                        # N: updates of every method (equal turns)
    episodes: int = 8                        # E: OPD episodes per update per seed
    latency_s: float = 0.01                  # simulated tool latency of `opd` [s per turn round]
    n_eval: int = 256                        # verdict / pilot / gate problems per evaluation
    eval_seed: int = 1                       # verdict problems
    pilot_eval_seed: int = 2                 # pilot problems
    pilot_n_eval: int = 128                  # pilot problems per evaluation
    gate_eval_seed: int = 3                  # gate problems
    gates: tuple = (("far", 0.35, 1.5), ("near", 0.70, 0.5))   # (name, success_min, gap_max)
    gate_every: int = 25
    gate_budget: int = 600                   # SFT updates per gate
    sft_batch: int = 64
    lrs: tuple = (1e-4, 3e-4, 1e-3)          # pilot grid
    warmups: tuple = (5,)                    # (0, 5) pre-registered; cut before the study
    exact_refresh: int = 10                  # reopd_exact: updates between ratio refreshes
    timing_updates: int = 10                 # opd_lat0: updates (timing only)
    student: dict = dataclasses.field(default_factory=dict)   # config.student overrides


FULL = Sizes()
QUICK = Sizes(seeds=(0, 1), pilot_seeds=(100, 101), updates=3, episodes=2, latency_s=0.001,
              n_eval=4, pilot_n_eval=4, gates=(("far", 0.0, 1e9), ("near", 1.0, 0.0)), gate_every=1,
              gate_budget=2, sft_batch=8, lrs=(1e-3,), warmups=(0,), exact_refresh=1,
              timing_updates=2,
              student=dict(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32))


def _config(cache: Path, variant: str, sizes: Sizes, steps: int, seeds, eval_seed: int,
            **fields):
    """A ``train.distill`` config of the study (no progress bar, one checkpoint at the end,
    ratio diagnostics at the start and the end only)."""
    c = get_config(variant)
    c.data.cache = str(cache)
    c.seed = int(seeds[0])
    c.train.num_seeds = len(seeds)
    c.train.steps = int(steps)
    c.eval.n_problems = sizes.n_eval
    c.eval.seed = int(eval_seed)
    c.eval.before = False
    c.log.progress = False
    c.log.every = max(1, int(steps))
    c.log.ckpt_every = 1_000_000
    c.sampler.refresh_every = 0
    for k, v in sizes.student.items():
        cu.set_field(c, f"student.{k}", v)
    for k, v in fields.items():
        cu.set_field(c, k, v)
    return c


def _per_seed(res: dict) -> list[dict]:
    return res["per_seed"] if "per_seed" in res else [res]


def _summary(res: dict) -> dict:
    """One run's numbers: per-seed success and final gap c̄, cost totals and times."""
    per = _per_seed(res)
    cost = per[0]["cost"]
    timed = [u for u in cost["per_update"] if u.get("timed")]
    tot = lambda u: u["rollout_s"] + u["scoring_s"] + u["update_s"]   # noqa: E731
    return {"seeds": [int(r["seed"]) for r in per],
            "success": [float(r["after"]["success_rate"]) for r in per],
            "gap_end": [(r["ratio"][-1].get("mean_gap") if r.get("ratio") else None)
                        for r in per],
            "updates": int(cost["updates"]), "totals": cost["totals"],
            "tool_calls": int(res.get("env_calls_during_training",
                                      per[0].get("env_calls_during_training", 0))),
            "timed_updates": len(timed),
            "rollout_s_timed": float(sum(u["rollout_s"] for u in timed)),
            "turns_timed": int(sum(u["supervised_turns"] for u in timed)),
            "rollout_s_per_turn": cost["rollout_s_per_turn"],
            "update_total_s_median": (float(_median([tot(u) for u in timed]))
                                      if timed else None)}


def _turns_per_update(sm: dict) -> int:
    """B: an OPD run's mean supervised turns per update per seed (rounded, >= 1)."""
    return max(1, round(sm["totals"]["supervised_turns"] / (sm["updates"] * len(sm["seeds"]))))


def _median(xs):
    return float(np.median(xs))


class Study(_shared.Log):
    """Runs the stages in ``out`` (each run reused when finished)."""

    def __init__(self, cache: Path, out: Path, sizes: Sizes):
        super().__init__()
        self.cache, self.out, self.s = Path(cache), Path(out), sizes
        self.pool = pool_lib.load_pool(self.cache / "pool")
        self.task = tasks_lib.for_pool(self.pool.meta)
        self.score_fn = self.task.teacher_scorer(self.cache / "teacher", 8)

    def train(self, name: str, config) -> dict:
        t0 = time.perf_counter()
        res = train_and_evaluate(config, self.out / name, teacher_score_fn=self.score_fn)
        self.say(f"{name}: {'reused' if res.get('already_finished') else 'trained'} "
                 f"({time.perf_counter() - t0:.0f} s)")
        return res

    def evaluate_dir(self, hf_dir: Path, eval_seed: int) -> dict:
        """Task success of a saved HF model (student or teacher) on ``n_eval`` problems."""
        model, _ = load_hf(hf_dir, dtype=jnp.float32, param_dtype=jnp.float32)
        return self.task.evaluate(model, self.s.n_eval, eval_seed, 64)

    # ------------------------------------------------------------------ stage 1: cold starts
    def cold_starts(self) -> list[dict]:
        s, out, init = self.s, [], ""
        for name, smin, gmax in s.gates:
            c = _config(self.cache, "sft,uniform", s, s.gate_budget, (0,), s.gate_eval_seed,
                        **{"student.init": init, "train.batch_size": s.sft_batch,
                           "gate.every": s.gate_every, "gate.success_min": smin,
                           "gate.gap_max": gmax})
            res = self.train(f"cold_{name}", c)
            gate = res.get("gate", {})
            hf = self.out / f"cold_{name}" / "student_hf"
            ev = self.evaluate_dir(hf, s.eval_seed)
            last = gate["checks"][-1] if gate.get("checks") else {}
            out.append({"name": name, "success_min": smin, "gap_max": gmax,
                        "budget_updates": s.gate_budget, "reached": bool(gate.get("reached")),
                        "step": gate.get("step"), "gate_success": last.get("success_rate"),
                        "gap": last.get("mean_gap"), "success_verdict_problems":
                        ev["success_rate"], "ci95": ev.get("ci95"), "student": str(hf)})
            self.say(f"cold start {name}: gate {'reached at update ' + str(gate.get('step')) if gate.get('reached') else 'NOT reached'}"
                     f"; success {ev['success_rate']:.3f}, gap {last.get('mean_gap')}")
            init = str(hf)
        return out

    # ------------------------------------------------------------------ stage 2: lr pilot
    def pilot(self, init: str) -> dict:
        s, rows, choice, B = self.s, [], {}, None
        for mode, variant in (("opd", "opd"), ("reopd", "onpolicy")):
            best = None
            for lr in s.lrs:
                for wu in s.warmups:
                    name = f"pilot_{mode}_lr{lr:g}_wu{wu}"
                    c = _config(self.cache, variant, s, s.updates, s.pilot_seeds,
                                s.pilot_eval_seed, **self._mode_fields(mode, init, B),
                                **{"optim.lr": lr, "optim.warmup_steps": wu,
                                   "eval.n_problems": s.pilot_n_eval})
                    sm = _summary(self.train(name, c))
                    if mode == "opd" and B is None:   # ReOPD pilot: OPD's turns per update
                        B = _turns_per_update(sm)
                    mean = sum(sm["success"]) / len(sm["success"])
                    rows.append({"mode": mode, "lr": lr, "warmup": wu, "success": sm["success"],
                                 "mean": mean})
                    if best is None or mean > best[0] + 1e-12:
                        best = (mean, lr, wu)
            choice[mode] = {"lr": best[1], "warmup": best[2], "pilot_mean": best[0]}
        choice["reopd"]["B"] = B
        self.say(f"pilot choice: {choice}")
        return {"rows": rows, "choice": choice}

    def _mode_fields(self, mode: str, init: str, batch: int | None = None) -> dict:
        f = {"student.init": init}
        if mode == "opd":
            f.update({"opd.episodes": self.s.episodes, "opd.tool_latency_s": self.s.latency_s})
        else:
            f["train.batch_size"] = int(batch)
        return f

    # ------------------------------------------------------------------ stage 3: the study
    def study(self, cold: dict, choice: dict, methods: tuple | None = None,
              tag: str | None = None) -> dict:
        """One cold start's runs (every method of the study, or only ``methods`` plus ``opd``,
        which sets B) under ``<out>/<tag>`` (default: the cold start's name)."""
        s, init = self.s, cold["student"]
        tag = tag or cold["name"]
        want = lambda m: methods is None or m in methods   # noqa: E731
        lr = lambda m: {"optim.lr": choice[m]["lr"],   # noqa: E731
                        "optim.warmup_steps": choice[m]["warmup"]}
        runs = {}
        # order: the runs the verdicts rest on first, the equal-wall-time run (the longest)
        # last, so a study stopped for time loses the least
        c = _config(self.cache, "opd", s, s.updates, s.seeds, s.eval_seed,
                    **self._mode_fields("opd", init), **lr("opd"))
        runs["opd"] = _summary(self.train(f"{tag}/opd", c))
        B = _turns_per_update(runs["opd"])
        if want("opd_lat0"):
            c = _config(self.cache, "opd", s, min(s.updates, s.timing_updates), s.seeds,
                        s.eval_seed, **{**self._mode_fields("opd", init), **lr("opd"),
                                        "opd.tool_latency_s": 0.0, "eval.n_problems": 0})
            runs["opd_lat0"] = _summary_timing(self.train(f"{tag}/opd_lat0", c))
        # the study: κ = 0.6, κ = 1, SFT; a subset (the addendum): κ = 0.6, SFT, κ = 1
        order = (("reopd_k0.6", "reopd_k1", "sft_cont") if methods is None
                 else ("reopd_k0.6", "sft_cont", "reopd_k1"))
        for m in filter(want, order):
            if m == "sft_cont":
                c = _config(self.cache, "sft,uniform", s, s.updates, s.seeds, s.eval_seed,
                            **{"student.init": init, "train.batch_size": B}, **lr("reopd"))
            else:
                c = _config(self.cache, "onpolicy", s, s.updates, s.seeds, s.eval_seed,
                            **self._mode_fields("reopd", init, B), **lr("reopd"),
                            **{"sampler.kappa": 0.6 if m == "reopd_k0.6" else 1.0})
            runs[m] = _summary(self.train(f"{tag}/{m}", c))
        if methods is not None:
            return {"cold": cold["name"], "B": B, "N": s.updates, "runs": runs}
        for kappa in [k for k in REOPD_KAPPAS if k not in (0.6, 1.0)]:
            c = _config(self.cache, "onpolicy", s, s.updates, s.seeds, s.eval_seed,
                        **self._mode_fields("reopd", init, B), **lr("reopd"),
                        **{"sampler.kappa": kappa})
            runs[f"reopd_k{kappa:g}"] = _summary(self.train(f"{tag}/reopd_k{kappa:g}", c))
        c = _config(self.cache, "onpolicy,exact", s, s.updates, s.seeds, s.eval_seed,
                    **self._mode_fields("reopd", init, B), **lr("reopd"),
                    **{"sampler.refresh_every": s.exact_refresh})
        runs["reopd_exact"] = _summary(self.train(f"{tag}/reopd_exact", c))
        t_opd = runs["opd"]["update_total_s_median"]
        t_re = runs["reopd_k0.6"]["update_total_s_median"]
        n_wall = max(1, round(s.updates * t_opd / t_re)) if t_opd and t_re else s.updates
        c = _config(self.cache, "onpolicy", s, n_wall, s.seeds, s.eval_seed,
                    **self._mode_fields("reopd", init, B), **lr("reopd"),
                    **{"sampler.kappa": 0.6})
        runs["reopd_k0.6_wall"] = _summary(self.train(f"{tag}/reopd_k0.6_wall", c))
        return {"cold": tag, "B": B, "N": s.updates, "N_wall": n_wall,
                "t_opd_update_s": t_opd, "t_reopd_update_s": t_re, "runs": runs}

    # ------------------------------------------------------------------ stage 4: collection
    def collection(self) -> dict:
        """Wall time of the teacher recording the pool's problems with the tool at
        ``latency_s`` per turn round with a call (greedy, batches of 256, as the cache command
        records it; before session 14 the simulator slept per call)."""
        import torch  # lazy: torch is the [torch] extra (the teacher's framework)
        model = load_teacher(self.cache / "teacher")
        fn = common.torch_generate_fn(model, pad_id=self.task.pad_id,
                                      stop_ids=self.task.stop_ids, max_new_tokens=12)
        problems = self.task.pool_problems(self.pool)
        calls0 = self.task.tool_calls()
        t0 = time.perf_counter()
        with torch.no_grad():
            for i in range(0, len(problems), 256):
                self.task.run_episodes(problems[i:i + 256], fn, self.task.max_turns,
                                       tool_delay_s=self.s.latency_s)
        secs = time.perf_counter() - t0
        res = {"episodes": len(problems), "tool_calls": self.task.tool_calls() - calls0,
               "latency_s": self.s.latency_s, "seconds": secs}
        self.say(f"pool collection: {res}")
        return res


def _summary_timing(res: dict) -> dict:
    sm = _summary(res) if all(r.get("after") for r in _per_seed(res)) else None
    if sm is None:
        per = _per_seed(res)
        r = dict(res, per_seed=[dict(p, after={"success_rate": float("nan")}) for p in per])
        sm = _summary(r)
        sm["success"] = []
    return sm


# ---------------------------------------------------------------------------- verdicts
def paired(runs: dict, a: str, b: str) -> dict:
    """Paired difference of task success ``a − b`` over the common seeds (Student-t CI,
    ``prada_jax.stats.paired_diff_ci``); the rules read it with ``prada_jax.stats``'
    :func:`noninferior` and :func:`superior`."""
    sa = dict(zip(runs[a]["seeds"], runs[a]["success"]))
    sb = dict(zip(runs[b]["seeds"], runs[b]["success"]))
    common = sorted(set(sa) & set(sb))
    return {"a": a, "b": b, "n": len(common),
            "mean_a": sum(sa[k] for k in common) / max(len(common), 1),
            "mean_b": sum(sb[k] for k in common) / max(len(common), 1),
            **paired_diff_ci([sa[k] for k in common], [sb[k] for k in common]).to_json_dict()}


def speed(st: dict, coll: dict, n_seeds: int) -> dict:
    """Rule (b): rollout seconds per supervised turn of OPD (latency ``latency_s`` and 0) over
    ReOPD κ = 0.6, and over ReOPD with the pool's collection C charged once to the run (and,
    without a verdict, to every seed)."""
    r, o, o0 = (st["runs"][k] for k in ("reopd_k0.6", "opd", "opd_lat0"))
    re_pt = r["rollout_s_per_turn"]
    out = {"reopd_rollout_s_per_turn": re_pt, "opd_rollout_s_per_turn": o["rollout_s_per_turn"],
           "opd_lat0_rollout_s_per_turn": o0["rollout_s_per_turn"]}
    ok = bool(re_pt) and o["rollout_s_per_turn"] is not None
    out["ratio_latency"] = o["rollout_s_per_turn"] / re_pt if ok else None
    out["ratio_lat0"] = (o0["rollout_s_per_turn"] / re_pt
                         if re_pt and o0["rollout_s_per_turn"] is not None else None)
    # ReOPD's turns over all its updates (timed or not) carry the collection cost
    turns_all = r["totals"]["supervised_turns"]
    per_turn_pool = (r["rollout_s_timed"] / max(r["turns_timed"], 1)
                     + coll["seconds"] / max(turns_all, 1))
    per_turn_pool_each = (r["rollout_s_timed"] / max(r["turns_timed"], 1)
                          + coll["seconds"] * n_seeds / max(turns_all, 1))
    out["ratio_with_pool"] = (o["rollout_s_per_turn"] / per_turn_pool) if ok else None
    out["ratio_with_pool_per_seed"] = (o["rollout_s_per_turn"] / per_turn_pool_each
                                       if ok else None)
    v1 = (out["ratio_latency"] is not None and out["ratio_latency"] >= SPEED_MIN
          and out["ratio_lat0"] is not None and out["ratio_lat0"] >= SPEED_MIN)
    out["verdict_rollout"] = "pass" if v1 else "fail"
    out["verdict_with_pool"] = ("pass" if out["ratio_with_pool"] is not None
                                and out["ratio_with_pool"] > SPEED_MIN_POOL else "fail")
    return out


def verdicts(st: dict, coll: dict, n_seeds: int) -> dict:
    runs = st["runs"]
    a_turns = paired(runs, "reopd_k0.6", "opd")
    a_wall = paired(runs, "reopd_k0.6_wall", "opd")
    c = paired(runs, "reopd_k0.6", "sft_cont")
    d = paired(runs, "reopd_k0.6", "reopd_k1")
    reopd_calls = {k: runs[k]["tool_calls"] for k in runs if k.startswith("reopd")}
    e_ok = all(v == 0 for v in reopd_calls.values()) and runs["opd"]["tool_calls"] > 0
    return {
        "a_equal_turns": {**a_turns, "verdict": noninferior(a_turns, MARGIN)},
        "a_equal_wall": {**a_wall, "verdict": noninferior(a_wall, MARGIN)},
        "b_speed": speed(st, coll, n_seeds),
        "c_vs_sft": {**c, "verdict": superior(c)},
        "d_kappa": {**d, "verdict": noninferior(d, MARGIN)},
        "e_tool_calls": {"reopd": reopd_calls, "opd": runs["opd"]["tool_calls"],
                         "verdict": "pass" if e_ok else "fail"},
        "extra": {k: paired(runs, k, "reopd_k0.6") for k in ("reopd_k0.8", "reopd_exact")},
    }


def run(cache: Path, out: Path, sizes: Sizes, only: tuple = ()) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    study = Study(cache, out, sizes)
    teacher = study.evaluate_dir(Path(cache) / "teacher", sizes.eval_seed)
    study.say(f"teacher success on the verdict problems: {teacher['success_rate']:.3f}")
    colds = study.cold_starts()
    pil = study.pilot(colds[0]["student"])
    coll = study.collection()
    studies = []
    res = {"study": "reopd_vs_opd", "synthetic": True, "task": study.task.name,
           "cache": str(cache),
           "sizes": dataclasses.asdict(sizes), "teacher": teacher, "cold_starts": colds,
           "pilot": pil, "collection": coll, "studies": studies, "log": study.log}
    stem = "study" if not only else "study_" + "_".join(only)
    for cold in colds:   # study.json / report.md rewritten after each cold start's study
        if only and cold["name"] not in only:
            continue
        st = study.study(cold, pil["choice"])
        st["verdicts"] = verdicts(st, coll, len(sizes.seeds))
        studies.append(st)
        study.say(f"{cold['name']}: " + ", ".join(
            f"{k} {v['verdict'] if 'verdict' in v else v.get('verdict_rollout')}"
            for k, v in st["verdicts"].items() if k != "extra"))
        res["wall_s"] = time.perf_counter() - t0
        write_json(out / f"{stem}.json", res, indent=1, newline=False)   # atomic: rewritten per cold start
        (out / f"{stem.replace('study', 'report')}.md").write_text(report.markdown(res))
    return res


def _define(fv) -> None:
    flags.DEFINE_string("cache", "", "task cache with pool/, logits/, teacher/ (not with "
                        "--quick)", flag_values=fv)
    flags.DEFINE_string("out", "", "study folder (runs, study.json, report.md)", flag_values=fv)
    flags.DEFINE_boolean("quick", False, "tiny sizes on a tiny synthetic cache built under "
                         "--out (an end-to-end test)", flag_values=fv)
    flags.DEFINE_integer("updates", FULL.updates, "N: updates of every method", flag_values=fv)
    flags.DEFINE_integer("episodes", FULL.episodes, "E: OPD episodes per update per seed",
                         flag_values=fv)
    flags.DEFINE_float("latency_s", FULL.latency_s, "simulated tool latency of OPD [s/call]",
                       flag_values=fv)
    flags.DEFINE_string("seeds", "0-9", "verdict seeds 'a-b' (consecutive)", flag_values=fv)
    flags.DEFINE_list("cold", [], "study only these cold starts (e.g. near; outputs "
                      "study_<names>.json, report_<names>.md); empty = all", flag_values=fv)
    flags.DEFINE_string("pilot_seeds", "100-102", "pilot seeds 'a-b' (consecutive, disjoint "
                        "from --seeds)", flag_values=fv)


def study_kind(data) -> str | None:
    """Which study wrote a ``study.json``: its ``study`` field; files written before the field
    existed by their keys (``cold_starts``: this study; the kg task, a fingerprint or one of
    the kg study's parts: ``studies.reopd_kg``); None if neither."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("study"), str):
        return data["study"]
    if "cold_starts" in data or "studies" in data:
        return "reopd_vs_opd"
    if data.get("task") == "kg_lookup_v1" or "fingerprint" in data or \
            {"paths", "cold", "compare", "reliability", "clock"} & set(data):
        return "reopd_kg"
    return None


def check_study_folder(out: Path, kind: str) -> dict:
    """Refuses, before anything is written, an ``--out`` that this study (``kind``:
    ``reopd_vs_opd`` or ``reopd_kg``) must not write into: an existing file, a folder whose
    ``study.json`` is malformed or was written by another study, or (for any study but the kg
    one) a folder holding the kg study's ``fingerprint.json``. The two ReOPD studies wrote
    into each other's folders (replacing ``study.json`` and ``report.md``). Returns the stored
    ``study.json`` ({} when there is none). Raises ``BadInput`` naming ``--out`` and the file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out={out}: exists and is not a folder")
    data: dict = {}
    path = out / "study.json"
    if path.exists():
        try:
            data = read_json(path)
        except BadInput as e:
            raise BadInput(f"--out={out}: {e}; move it away or use another --out") from None
        got = study_kind(data)
        if got != kind:
            raise BadInput(f"--out={out}: {path} holds "
                           f"{f'a {got} study' if got else 'no study this command knows'}, "
                           f"not a {kind} one; use another --out")
    if kind != "reopd_kg" and (out / "fingerprint.json").exists():
        raise BadInput(f"--out={out}: holds a reopd_kg study ({out / 'fingerprint.json'}); use "
                       "another --out")
    return data


def main(argv=None) -> int:
    """``argv``: absl flags; None = the command line. Bad input raises ``BadInput``."""
    a = _shared.parse(_define, argv, "studies.reopd_vs_opd", __doc__)
    _shared.at_least_one(a, "updates")
    if a.episodes < 1:
        raise BadInput(f"--episodes: must be >= 1 (OPD episode budget), got {a.episodes}")
    if not (math.isfinite(a.latency_s) and a.latency_s >= 0):
        raise BadInput(f"--latency_s: must be a finite number of seconds >= 0, got "
                       f"{a.latency_s}")
    seeds = _shared.seed_range(a.seeds, "seeds")
    pseeds = _shared.seed_range(a.pilot_seeds, "pilot_seeds")
    if set(seeds) & set(pseeds):
        raise BadInput("--pilot_seeds: must be disjoint from --seeds")
    only = tuple(a.cold)
    names = [g[0] for g in FULL.gates]
    bad = [c for c in only if c not in names]
    if bad:
        raise BadInput(f"--cold: unknown cold start {bad[0]!r}; choose from {names}")
    out = Path(a.out)
    check_study_folder(out, "reopd_vs_opd")
    if a.quick:
        if a.cache:
            raise BadInput("--cache: not with --quick (it builds its own tiny cache)")
        sizes = QUICK
        cache = out / "cache"
        if not (cache / "pool").is_dir():
            out.mkdir(parents=True, exist_ok=True)
            tiny_cache(cache, 12)
    else:
        cache = Path(a.cache)
        _shared.check_cache(cache, hint="prada_jax.distill.task.teacher")
        sizes = dataclasses.replace(FULL, updates=a.updates, episodes=a.episodes,
                                    latency_s=a.latency_s, seeds=seeds, pilot_seeds=pseeds)
    res = run(cache, out, sizes, only)
    stem = "study" if not only else "study_" + "_".join(only)
    print((out / f"{stem.replace('study', 'report')}.md").read_text())
    print(f"study wall time {res.get('wall_s', 0):.0f} s; {out / (stem + '.json')}")
    return 0

