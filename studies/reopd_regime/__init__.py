"""ReOPD in a regime where distillation learns (issue 44), SYNTHETIC: the teacher trained on
error-and-recovery episodes, the cold start at SFT's plateau, the lr pilot of the methods the
gate needs, the pre-registered gate, and the declared GPU cost model's sweep. The registration
is ``studies/reopd_regime/README.md``; the command is ``python -m studies.reopd_regime``.

Everything here is wiring: the trainer runs each method (``prada_jax.distill.trainer``, loss arm
``loss.rkl_estimator``), the task and the teacher data are ``prada_jax.distill.task.kg_short``,
the statistics ``prada_jax.stats``, the cost model ``prada_jax.distill.gpucost``, the
resume machinery the kg study's (``studies.reopd_kg.resume``). The decision rules and the cost
model's pricing are pure functions in ``studies.reopd_regime.rules`` (re-exported here).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax import config_utils as cu
from prada_jax import latency
from prada_jax.configs.distill import get_config
from prada_jax.distill import gpucost, losses
from prada_jax.distill import opd as opd_lib
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import task_registry as tasks_lib
from prada_jax.distill import results as results_lib
from prada_jax.distill import stepping, trainer
from prada_jax.distill.learner import student_logits_fn
from prada_jax.distill.scoring import load_teacher
from prada_jax.distill.task import kg, kg_short
from prada_jax.distill.task.export_local import export_logits
from prada_jax.distill.task.kg_teacher import train_teacher
from prada_jax.distill.task_registry import hf_teacher_scorer
from prada_jax.distill.trainer import train_and_evaluate
from prada_jax.lm.hf import load_hf
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from studies import _shared
from studies.reopd_kg import reliability as rel
from studies.reopd_kg import resume
from studies.reopd_regime import curves, report
from studies.reopd_regime.rules import (  # the rules, re-exported
    COST_HW, COST_TOOL_S, LRS, NO_REGIME, choose_lr, cost_sweep, extend_grid, gate,
    outcome_matrix, plateau, record_counts, snap13)
from studies.reopd_regime import verdicts as V

PARTS = ("cost", "teacher", "cold", "depth", "pilot", "gate", "reopd_pilot", "secondary",
         "compare")
TEACHER_MIN = 0.85      # T's greedy success on its held-out problems >= this
VARIANT = {"opd": "opd", "reopd": "onpolicy", "sft": "sft,uniform"}


@dataclasses.dataclass
class Sizes:
    """Every size of the study (``FULL`` = the registered one; ``QUICK`` for the test)."""

    inject_rate: float = 0.5                 # teacher data: share of episodes with an error
    teacher: dict = dataclasses.field(default_factory=lambda: dict(
        hidden=128, layers=3, heads=4, kv_heads=2, intermediate=256, batch=64, lr=3e-3,
        warmup=100))
    teacher_steps: tuple = (700, 1400, 2100)  # T retrained with these until greedy >= 0.85
    n_train: int = 20000                     # teacher training episodes (problems 1)
    n_pool: int = 4096                       # pool trajectories (problems 2), τ = 1
    teacher_eval_n: int = 256                # T's held-out problems (3)
    top_k: int = len(kg.VOCAB)               # exported logits: the whole vocabulary
    cold_lr: float = 3e-3
    cold_warmup: int = 30
    sft_batch: int = 64                      # cold start pairs per update
    cold_every: int = 100                    # cold start: check every this many updates ...
    cold_n: int = 128                        # ... on this many problems (3003)
    cold_min: int = 400                      # ... plateau at the earliest here
    cold_budget: int = 3000                  # ... or stop here
    plateau_tol: float = 0.01
    plateau_window: int = 3
    updates: int = 400                       # N: updates of every compared method
    episodes: int = 8                        # E: OPD episodes per update
    warmup: int = 5
    lrs: tuple = LRS                         # pilot grid, per mode
    max_extend: int = 2                      # grid extensions per side
    estimator: str = "exact"                 # the registered loss arm of OPD / ReOPD
    pilot_seeds: tuple = (100, 101, 102)
    pilot_eval_seed: int = 2                 # lr choice: make_problems(2003, pilot_n)
    pilot_n: int = 256
    gate_eval_seed: int = 6                  # gate: make_problems(6003, gate_n)
    gate_n: int = 256
    probe_eval_seed: int = 9                 # curves: make_problems(9003, probe_n)
    probe_n: int = 256
    curve_every: int = 25
    n_boot: int = 2000
    ckpt_every: int = 25
    teacher_min: float = TEACHER_MIN         # T's greedy success needed (QUICK: 0)
    student: dict = dataclasses.field(default_factory=dict)


FULL = Sizes()
QUICK = Sizes(teacher=dict(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, batch=8,
                           lr=3e-3, warmup=1),
              teacher_steps=(2,), n_train=32, n_pool=16, teacher_eval_n=4, cold_every=1,
              cold_n=4, cold_min=1, cold_budget=2, sft_batch=8, updates=2, episodes=2,
              warmup=0, lrs=(1e-3,), max_extend=0, pilot_seeds=(100,), pilot_n=4, gate_n=4,
              probe_n=4, curve_every=1, n_boot=200, ckpt_every=1_000_000, teacher_min=0.0,
              student=dict(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32))

# the comparison's sizes (README, "Setup fixed in advance"); outside Sizes so that the study's
# config fingerprint, pinned when the cold start ran, stays the same
COMPARE = dict(seeds=tuple(range(8)), verdict_sets=(11, 12, 13, 14), n_verdict=512,
               kappas=(0.6, 0.8, 1.0))
QUICK_COMPARE = dict(seeds=(0, 1), verdict_sets=(11, 12), n_verdict=4, kappas=(0.6, 0.8, 1.0))

# ---------------------------------------------------------------------------- the study
class Study(_shared.Log):
    def __init__(self, cache: Path, out: Path, sizes: Sizes, cmp: dict | None = None):
        super().__init__()
        self.cache, self.out, self.s = Path(cache), Path(out), sizes
        self.cmp = dict(cmp or COMPARE)
        self._score = None
        self.fp: dict = {}

    # ------------------------------------------------------------------ teacher (item 2)
    def teacher(self) -> dict:
        """T on solved + error-and-recovery episodes, retrained with more steps until greedy
        success >= :data:`TEACHER_MIN` (or the last step count), its τ = 1 pool and its logits
        at top_k = the vocabulary. Each finished stage is reused."""
        import torch  # lazy: torch is the [torch] extra (the teacher's framework)
        torch.set_num_threads(1)   # as the kg teacher's command: 2 threads on a shared 2-core
        #                            machine spin against other processes (20x slower here)
        s, root = self.s, self.cache
        root.mkdir(parents=True, exist_ok=True)
        evp = root / "teacher_eval.json"
        ev = json.loads(evp.read_text()) if evp.exists() else {"attempts": []}
        data = kg_short.training_episodes(1, s.n_train, s.inject_rate)
        problems = kg_short.make_problems(3, s.teacher_eval_n)
        tdir = root / "teacher"
        if not ev.get("accepted"):
            for steps in s.teacher_steps:
                if any(a["steps"] == steps for a in ev["attempts"]):
                    continue
                t0 = time.perf_counter()
                d = root / f"teacher_{steps}"
                if not (d / "model.safetensors").is_file():
                    train_teacher(d, seed=0, steps=steps, n_train=s.n_train,
                                  episodes=data[:2], tokenizer=kg_short.build_tokenizer(),
                                  **s.teacher)
                model = load_teacher(d)
                greedy = kg.summarize(kg_short.run_teacher(model, problems, 0.0))
                sampled = kg.summarize(kg_short.run_teacher(model, problems, 1.0, seed=0))
                ev["attempts"].append({"steps": steps, "greedy": greedy, "sampled": sampled,
                                       "train_s": time.perf_counter() - t0})
                self.say(f"teacher {steps} steps: greedy {greedy['success_rate']:.3f}, "
                         f"τ=1 {sampled['success_rate']:.3f} (SYNTHETIC)")
                write_json(evp, ev, indent=1, newline=False)
                if greedy["success_rate"] >= s.teacher_min:
                    break
            best = ev["attempts"][-1]
            ev.update(accepted=best["greedy"]["success_rate"] >= s.teacher_min,
                      steps=best["steps"], inject=data[2], synthetic=True,
                      problems={"train": 1, "eval": 3, "pool": 2})
            if not tdir.exists():
                os.replace(root / f"teacher_{best['steps']}", tdir)
            write_json(evp, ev, indent=1, newline=False)
        if not ev["accepted"]:
            self.say(f"teacher: greedy {ev['attempts'][-1]['greedy']['success_rate']:.3f} < "
                     f"{s.teacher_min} after {ev['steps']} steps: no teacher")
            return {**ev, "outcome": "no teacher"}
        pdir = root / "pool"
        if not (pdir / pool_lib.META_FILE).is_file():
            kg_short.record_pool(load_teacher(tdir), kg_short.make_problems(2, s.n_pool),
                                 pdir, root / "pool.jsonl", temperature=1.0, seed=0)
        pool = pool_lib.load_pool(pdir)
        export_logits(tdir, pdir, root / "logits", s.top_k)
        ev["pool"] = {"trajectories": int(pool.num_trajectories),
                      "success": float(np.mean(pool.success)),
                      "turns_mean": float(pool.turns_per_trajectory().mean())}
        self.say(f"teacher: accepted ({ev['steps']} steps); pool {ev['pool']}")
        return ev

    # ------------------------------------------------------------------ helpers
    @property
    def score_fn(self):
        if self._score is None:
            self._score = hf_teacher_scorer(self.cache / "teacher", self.s.top_k)
        return self._score

    def outcomes(self, hf_dir: Path, sets: dict, temperature: float = 0.0) -> dict:
        """0/1 success per problem of each named set ``{name: (eval_seed, n)}``: greedy, or
        one sample per problem at ``temperature`` (key 7 per set: the same draws for every
        student)."""
        model, _ = load_hf(hf_dir, dtype=jnp.float32, param_dtype=jnp.float32)
        out = {}
        for name, (es, n) in sets.items():
            fn = kg.flax_generate_fn(model, batch=64, temperature=temperature,
                                     key=jax.random.key(7) if temperature > 0 else None)
            res = kg_short.run_episodes(kg_short.make_problems(es * 1000 + 3, n), fn)
            out[name] = "".join("1" if r.success else "0" for r in res)
        return out

    def config(self, mode: str, steps: int, seed: int, **fields):
        c = get_config(VARIANT[mode])
        c.data.cache = str(self.cache)
        c.seed = int(seed)
        c.train.steps = int(steps)
        c.eval.before = False
        c.log.progress = False
        c.log.every = 1
        c.log.ckpt_every = self.s.ckpt_every
        c.sampler.refresh_every = 0
        c.loss.top_k = self.s.top_k
        for k, v in self.s.student.items():
            cu.set_field(c, f"student.{k}", v)
        for k, v in fields.items():
            cu.set_field(c, k, v)
        return c

    def train(self, name: str, config, max_steps: int | None = None) -> dict:
        return train_and_evaluate(config, self.out / name, teacher_score_fn=self.score_fn,
                                  max_steps=max_steps)

    # ------------------------------------------------------------------ cold start (item 3)
    def cold(self) -> dict:
        """SFT on T's pool in chunks of ``cold_every`` updates (one resumable trainer run over
        ``cold_budget``), a greedy check after each, stopped at :func:`plateau`; the student at
        that point saved; its outcomes and T's on the gate and pilot sets."""
        s = self.s
        path = self.out / "cold.json"
        if path.exists():
            got = json.loads(path.read_text())
            if got.get("fingerprint") == self.fp.get("cache_sha"):
                self.say("cold start: finished earlier; reused")
                return got
        c = self.config("sft", s.cold_budget, 0, **{
            "train.batch_size": s.sft_batch, "optim.lr": s.cold_lr,
            "optim.warmup_steps": s.cold_warmup, "eval.every": s.cold_every,
            "eval.seed": 3, "eval.n_problems": s.cold_n, "log.ckpt_every": s.cold_every})
        wd = self.out / "cold_run"
        t0 = time.perf_counter()
        stop = None
        while stop is None:
            res = self.train("cold_run", c, max_steps=s.cold_every)
            cur = [(int(st), float(v)) for st, v in
                   curves.read(wd / "tb").get("eval/success_rate", [])]
            done = res.get("opt_step", s.cold_budget) if res.get("finished") is False \
                else s.cold_budget
            stop = plateau(cur, s.plateau_tol, s.plateau_window, s.cold_min)
            if stop is None and done >= s.cold_budget:
                stop = s.cold_budget
            self.say(f"cold start: {done} updates, curve {cur[-3:]}")
            if res.get("finished") is not False:
                stop = stop or s.cold_budget
                break
        hf = wd / "student_hf"
        if not (hf / "model.safetensors").is_file():   # stopped at the plateau: save it now
            run = stepping.open_run(trainer.build_setup(c, teacher_score_fn=self.score_fn), wd,
                                    restore=True)
            try:
                results_lib.finish(run.setup, run.rec, run.files, run.state, run.host)
            finally:
                trainer.close_files(run.files)
        sets = {"gate": (s.gate_eval_seed, s.gate_n), "pilot": (s.pilot_eval_seed, s.pilot_n)}
        out = {"student": str(hf), "stopped_at": int(stop),
               "rule": {"every": s.cold_every, "tol": s.plateau_tol,
                        "window": s.plateau_window, "min": s.cold_min,
                        "budget": s.cold_budget},
               "curve": curves.read(wd / "tb"), "outcomes": self.outcomes(hf, sets),
               "teacher_outcomes": self.outcomes(self.cache / "teacher", sets),
               "wall_s": time.perf_counter() - t0, "synthetic": True,
               "fingerprint": self.fp.get("cache_sha")}
        out["cold_sha"] = resume.sha256_file(hf / "model.safetensors")
        rate = lambda o: float(np.mean([int(ch) for ch in o]))   # noqa: E731
        out["success"] = {k: rate(v) for k, v in out["outcomes"].items()}
        out["teacher_success"] = {k: rate(v) for k, v in out["teacher_outcomes"].items()}
        write_json(path, out, indent=1, newline=False)
        self.say(f"cold start: plateau at {stop} updates; gate-set success "
                 f"{out['success']['gate']:.3f}, teacher {out['teacher_success']['gate']:.3f}")
        return out

    # ------------------------------------------------------------------ depth (items 2, 3)
    def depth(self, students: dict) -> dict:
        """Per student ``{name: hf_dir}``: its own episodes at τ = 1 on the probe set, scored by
        T at top_k = the vocabulary; per agent turn t, T's log-prob of the student's action
        (summed over its tokens; the reliability reading of item 2) and the exact reverse KL
        KL(π_S || π_T) summed over the action's tokens (the per-turn gap of item 3), each with
        cluster-bootstrap CIs over episodes and a line through the per-turn means
        (``studies.reopd_kg.reliability.depth_curve``)."""
        s = self.s
        task = tasks_lib.get(kg_short.TASK_NAME)
        problems = kg_short.make_problems(s.probe_eval_seed * 1000 + 3, s.probe_n)
        P, A = 96, 12
        out = {"problems": {"eval_seed": s.probe_eval_seed, "n": s.probe_n},
               "temperature": 1.0, "students": {}}
        for name, d in students.items():
            model, _ = load_hf(Path(d), dtype=jnp.float32, param_dtype=jnp.float32)
            graphdef, params = nnx.split(model, nnx.Param)
            logits_fn = student_logits_fn(graphdef)
            cl, tt, lp, kl = [], [], [], []
            succ = 0
            for j in range(0, len(problems), 64):
                probs = problems[j:j + 64]
                gen = opd_lib.student_generate_fn(
                    graphdef, params, jax.random.key(1000 + j), batch=len(probs),
                    context_len=P, max_new_tokens=A, temperature=1.0, top_p=1.0,
                    stop_ids=task.stop_ids, pad_id=task.pad_id)
                batch, _, eps = opd_lib.opd_round(task, probs, gen, self.score_fn,
                                                  rows=len(probs) * task.max_turns,
                                                  context_len=P, action_len=A)
                succ += sum(e.success for e in eps)
                ids = np.concatenate([batch["prompt"], batch["action"]], 1)
                msk = np.concatenate([batch["prompt_mask"], batch["action_valid"]], 1)
                z = logits_fn(params, jnp.asarray(ids), jnp.asarray(msk))[:, P - 1:P + A - 1]
                _, per = losses.reverse_kl_exact(z, batch["topk_ids"], batch["topk_logp"],
                                                 batch["tail_mass"], batch["action_mask"])
                m = np.asarray(batch["action_mask"], np.float64)
                real = m.sum(1) > 0
                ks = [len(task.to_tokens(e.messages)[1]) for e in eps]
                ep = np.full(len(m), -1)
                ep[:sum(ks)] = j + np.repeat(np.arange(len(eps)), ks)
                cl += ep[real].tolist()
                tt += np.asarray(batch["turn"])[real].tolist()
                lp += (np.asarray(batch["teacher_logp"]) * m).sum(1)[real].tolist()
                kl += np.asarray(per, np.float64).sum(1)[real].tolist()
            out["students"][name] = {
                "success_tau1": succ / len(problems),
                "teacher_logp": rel.depth_curve(cl, tt, lp, n_boot=s.n_boot, seed=1),
                "exact_kl": rel.depth_curve(cl, tt, kl, n_boot=s.n_boot, seed=2)}
            f = out["students"][name]["exact_kl"]["fit"]
            self.say(f"depth {name}: τ=1 success {succ / len(problems):.3f}; exact KL per turn "
                     f"slope {f['slope'] if f else None} nats/turn (SYNTHETIC)")
        return out

    # ------------------------------------------------------------------ one run per seed
    def unit(self, mode: str, lr: float, seed: int, cold: dict, B: int | None, *,
             part: str = "pilot", name: str | None = None, kappa: float | None = None,
             estimator: str | None = None, updates: int | None = None,
             sets: dict | None = None, sampled: bool = False) -> dict:
        """One (part, method, lr, seed) run from the cold start, as a record in
        ``<out>/runs/<part>/<name>_seed<seed>.json`` (reused when it exists with the same
        fingerprint; a killed trainer resumes from its last checkpoint). Defaults: the pilot
        (name ``<mode>_lr<lr>``, the registered arm, ``updates`` updates, greedy outcomes on
        the pilot and gate sets); ``sampled``: τ = 1 outcomes beside (``tau1:<set>``)."""
        s = self.s
        name = name or f"{mode}_lr{lr:g}"
        estimator = estimator or s.estimator
        path = resume.record_path(self.out, part, name, seed)
        fp = {**self.fp, "cold_sha": cold["cold_sha"]}
        rec = resume.load_record(path, fp)
        if rec is not None:
            return rec
        f = {"student.init": cold["student"], "optim.lr": lr, "optim.warmup_steps": s.warmup,
             "eval.every": s.curve_every, "eval.seed": s.probe_eval_seed,
             "eval.n_problems": s.probe_n}
        if mode == "opd":
            f.update({"opd.episodes": s.episodes, "opd.tool_latency_s": 0.0,
                      "loss.rkl_estimator": estimator})
        elif mode == "reopd":
            f.update({"train.batch_size": int(B), "loss.rkl_estimator": estimator,
                      "sampler.kappa": float(kappa if kappa is not None else 0.6)})
        else:
            f["train.batch_size"] = int(B)
        c = self.config(mode, updates or s.updates, seed, **f)
        wd = self.out / part / name / f"seed_{seed}"
        started, load0, t0 = resume._utc(), os.getloadavg()[0], time.perf_counter()
        res = self.train(str(wd.relative_to(self.out)), c)
        if res.get("finished") is False:
            raise RuntimeError(f"{wd}: stopped before the end ({res.get('stopped_by')})")
        secs = time.perf_counter() - t0
        cost = res["cost"]
        sets = sets or {"pilot": (s.pilot_eval_seed, s.pilot_n),
                        "gate": (s.gate_eval_seed, s.gate_n)}
        t1 = time.perf_counter()
        rec = {"synthetic": True, "part": part, "mode": mode, "seed": int(seed), "lr": lr,
               "estimator": estimator if mode != "sft" else None,
               "B": None if mode == "opd" else int(B), "updates": int(cost["updates"]),
               "totals": cost["totals"],
               "per_update_counts": [{k: u[k] for k in ("supervised_turns", "student_tokens",
                                                        "teacher_tokens_forwarded",
                                                        "tool_calls", "tool_rounds",
                                                        "episodes")}
                                     for u in cost["per_update"]],
               "tool_calls": int(res.get("env_calls_during_training", 0)),
               "probe_success_end": (res.get("after") or {}).get("success_rate"),
               "curves": curves.read(wd / "tb"),
               "outcomes": self.outcomes(wd / "student_hf", sets),
               "fingerprint": {k: fp[k] for k in ("cache_sha", "config_sha", "cold_sha")},
               "workdir": str(wd.relative_to(self.out)), "train_s": secs,
               "started_utc": started, "trainer_reused": bool(res.get("already_finished"))}
        if mode == "reopd":
            rec["kappa"] = float(kappa if kappa is not None else 0.6)
        if sampled:
            got = self.outcomes(wd / "student_hf", sets, temperature=1.0)
            rec["outcomes"].update({f"tau1:{k}": v for k, v in got.items()})
        rec["success"] = {k: float(np.mean([int(ch) for ch in v]))
                          for k, v in rec["outcomes"].items()}
        rec.update(eval_s=time.perf_counter() - t1, finished_utc=resume._utc(),
                   load_avg_1min=[load0, os.getloadavg()[0]], adopted_from=None)
        resume.save_record(path, rec)
        first = next(iter(rec["success"]))
        self.say(f"{part}/{name} seed {seed}: {first} {rec['success'][first]:.3f} "
                 f"({secs:.0f} s train) -> {path}")
        return rec

    def grid(self, mode: str, cold: dict, B: int | None) -> dict:
        """A mode's lr grid on every pilot seed, extended at an edge (:func:`extend_grid`);
        the chosen lr (:func:`choose_lr`) once every run exists."""
        s = self.s
        grid, recs = list(s.lrs), {}
        while True:
            for lr in grid:
                if lr not in recs:
                    recs[lr] = [self.unit(mode, lr, sd, cold, B) for sd in s.pilot_seeds]
            means = {lr: float(np.mean([r["success"]["pilot"] for r in rs]))
                     for lr, rs in recs.items()}
            new = extend_grid(tuple(grid), means, s.max_extend)
            if new is None or new in recs:
                break
            grid.append(new)
        lr = choose_lr(means)
        return {"grid": sorted(grid), "means": {f"{k:g}": v for k, v in means.items()},
                "lr": lr, "records": [r for k in sorted(recs) for r in recs[k]]}

    def pilot(self, cold: dict) -> dict:
        """The grids the gate needs: OPD first (B from its chosen-lr runs), then SFT
        continuation at B pairs per update."""
        opd = self.grid("opd", cold, None)
        chosen = [r for r in opd["records"] if r["lr"] == opd["lr"]]
        B = max(1, round(sum(r["totals"]["supervised_turns"] for r in chosen)
                         / sum(r["updates"] for r in chosen)))
        sft = self.grid("sft", cold, B)
        out = {"B": B}
        for k, g in (("opd", opd), ("sft", sft)):
            out[k] = {"grid": g["grid"], "means": g["means"], "lr": g["lr"],
                      "runs": [r["workdir"] for r in g["records"]]}
        self.say(f"pilot: OPD lr {opd['lr']:g}, SFT lr {sft['lr']:g}, B {B}")
        return out

    def gate(self, cold: dict, pil: dict) -> dict:
        """The registered gate from the chosen-lr pilot records, on the gate set."""
        s = self.s
        fp = {**self.fp, "cold_sha": cold["cold_sha"]}
        recs = {m: [resume.load_record(resume.record_path(self.out, "pilot",
                                                          f"{m}_lr{pil[m]['lr']:g}", sd), fp)
                    for sd in s.pilot_seeds] for m in ("opd", "sft")}
        for m, rs in recs.items():
            if any(r is None for r in rs):
                raise BadInput(f"--parts: gate needs every {m} pilot record at lr "
                               f"{pil[m]['lr']:g} (run --parts=pilot)")
        g = gate(outcome_matrix(recs["opd"], "gate"), outcome_matrix(recs["sft"], "gate"),
                 np.array([int(ch) for ch in cold["outcomes"]["gate"]]),
                 np.array([int(ch) for ch in cold["teacher_outcomes"]["gate"]]), s.n_boot)
        g["lr"] = {m: pil[m]["lr"] for m in ("opd", "sft")}
        g["seeds"] = list(s.pilot_seeds)
        g["problems"] = {"eval_seed": s.gate_eval_seed, "n": s.gate_n}
        g["estimator"] = s.estimator
        g["opd_cost_per_update"] = {
            hw: gpucost.price(record_counts(sum((r["per_update_counts"] for r in recs["opd"]),
                                                []), "opd", kg.MAX_ACTION_TOKENS),
                              gpucost.profile(hw), latency.qwen25_1p5b(), latency.qwen25_7b(),
                              COST_TOOL_S) for hw in gpucost.GPU_PROFILES}
        self.say(f"gate: {g['outcome']} (OPD {g['opd_gain']['mean']:+.3f} "
                 f"[{g['opd_gain']['ci_low']:+.3f}, {g['opd_gain']['ci_high']:+.3f}], SFT "
                 f"{g['sft_gain']['mean']:+.3f}, headroom {g['headroom']:.3f}) SYNTHETIC")
        return g


    # ------------------------------------------------------------------ after the gate
    def reopd_pilot(self, cold: dict, pil: dict, g: dict) -> dict:
        """ReOPD κ 0.6's lr grid (exact arm) on the pilot seeds, at B pairs per update; only
        once the gate passed."""
        _passed(g)
        r = self.grid("reopd", cold, pil["B"])
        self.say(f"ReOPD pilot: lr {r['lr']:g}")
        return {"grid": r["grid"], "means": r["means"], "lr": r["lr"],
                "runs": [x["workdir"] for x in r["records"]]}

    def secondary(self, cold: dict, pil: dict, rp: dict, g: dict) -> dict:
        """The secondary arm (single-sample estimator with the per-token mean baseline) of OPD
        and ReOPD κ 0.6 on the pilot seeds at the primary arm's lrs: reported, never a
        verdict."""
        _passed(g)
        out = {}
        for mode, lr in (("opd", pil["opd"]["lr"]), ("reopd", rp["lr"])):
            recs = [self.unit(mode, lr, sd, cold, pil["B"], part="secondary",
                              name=f"{mode}_pg_baseline", estimator="pg_baseline", kappa=0.6)
                    for sd in self.s.pilot_seeds]
            out[mode] = {"lr": lr, "estimator": "pg_baseline",
                         "success": {k: float(np.mean([r["success"][k] for r in recs]))
                                     for k in recs[0]["success"]}}
        return out

    def methods(self, n_cost: int) -> list:
        """(name, mode, κ, updates) of the compared methods."""
        out = [("opd", "opd", None, self.s.updates)]
        out += [(f"reopd_k{k:g}", "reopd", k, self.s.updates) for k in self.cmp["kappas"]]
        out += [("sft_cont", "sft", None, self.s.updates), ("opd_cost", "opd", None, n_cost)]
        return out

    def n_cost(self, pil: dict, rp: dict, cold: dict) -> dict:
        """N_c: OPD's updates of the same modelled cost as ReOPD κ 0.6's N (claim (b)), from
        the chosen-lr pilot records' counts (H100, Qwen2.5-1.5B / 7B, 0.5 s per tool round),
        rounded to a multiple of 25 (at least 25)."""
        fp = {**self.fp, "cold_sha": cold["cold_sha"]}
        cost = {}
        for mode, lr in (("opd", pil["opd"]["lr"]), ("reopd", rp["lr"])):
            recs = [resume.load_record(resume.record_path(self.out, "pilot", f"{mode}_lr{lr:g}",
                                                          sd), fp) for sd in self.s.pilot_seeds]
            per = sum((r["per_update_counts"] for r in recs), [])
            cost[mode] = gpucost.price(record_counts(per, mode, kg.MAX_ACTION_TOKENS),
                                       gpucost.profile(COST_HW), latency.qwen25_1p5b(),
                                       latency.qwen25_7b(), COST_TOOL_S)["total_s"]
        n = self.s.updates * cost["reopd"] / cost["opd"]
        return {"cost_per_update_s": cost, "hardware": COST_HW, "tool_s": COST_TOOL_S,
                "n_cost": int(max(self.s.curve_every, round(n / self.s.curve_every)
                                  * self.s.curve_every))}

    def compare(self, cold: dict, pil: dict, rp: dict, g: dict) -> dict:
        """Every method on every verdict seed from the cold start; per-seed per-problem greedy
        and τ = 1 outcomes on the verdict sets; the registered claims
        (:func:`studies.reopd_regime.verdicts.verdicts`)."""
        _passed(g)
        s, cmp = self.s, self.cmp
        nc = self.n_cost(pil, rp, cold)
        sets = {f"v{es}": (es, cmp["n_verdict"]) for es in cmp["verdict_sets"]}
        lr = {"opd": pil["opd"]["lr"], "reopd": rp["lr"], "sft": pil["sft"]["lr"]}
        recs: dict = {}
        for sd in cmp["seeds"]:
            for name, mode, kappa, upd in self.methods(nc["n_cost"]):
                recs.setdefault(name, []).append(self.unit(
                    mode, lr[mode], sd, cold, pil["B"], part="compare", name=name,
                    kappa=kappa, updates=upd, sets=sets, sampled=True))
        cold_out = self.outcomes(Path(cold["student"]), sets)
        cold_probe = self.outcomes(Path(cold["student"]),
                                   {"probe": (s.probe_eval_seed, s.probe_n)})["probe"]
        keys = list(sets)

        def mat(rs, prefix=""):
            return np.array([[int(ch) for k in keys for ch in r["outcomes"][prefix + k]]
                             for r in rs], np.float64)
        X = {k: mat(v) for k, v in recs.items()}
        cold_row = np.array([int(ch) for k in keys for ch in cold_out[k]], np.float64)
        steps = [0] + [p[0] for p in recs["opd"][0]["curves"]["eval/success_rate"]]
        cp = float(np.mean([int(ch) for ch in cold_probe]))

        def curve(rs):
            return np.array([[cp] + [p[1] for p in r["curves"]["eval/success_rate"]]
                             for r in rs])
        cu_ = {"steps": steps, "opd": curve(recs["opd"]), V.R: curve(recs[V.R]), "cold": cp,
               "cost": {"opd": nc["cost_per_update_s"]["opd"],
                        V.R: nc["cost_per_update_s"]["reopd"]}}
        calls = {k: sum(r["tool_calls"] for r in v) for k, v in recs.items()}
        ver = V.verdicts(X, cold_row, [cmp["n_verdict"]] * len(keys), calls, s.n_boot, cu_)
        tau1 = {k: float(mat(v, "tau1:").mean()) for k, v in recs.items()}
        self.say(f"compare: {{k: v['verdict'] for k, v in ver.items() if 'verdict' in v}}")
        return {"n_cost": nc, "lr": lr, "B": pil["B"], "verdicts": ver,
                "success": {k: float(x.mean()) for k, x in X.items()},
                "success_tau1": tau1, "cold_success": float(cold_row.mean()),
                "cold_probe": cp, "seeds": list(cmp["seeds"]),
                "verdict_sets": list(cmp["verdict_sets"]), "n_verdict": cmp["n_verdict"]}


def _passed(g: dict) -> None:
    if not g.get("passed"):
        raise BadInput(f"--parts: the gate did not pass ({g.get('outcome')}); the study gives "
                       "no verdicts and runs nothing after it")


# ---------------------------------------------------------------------------- run
def run(cache: Path, out: Path, sizes: Sizes, parts: tuple, cmp: dict | None = None) -> dict:
    """Runs ``parts`` in order, merging each into ``<out>/study.json`` and ``report.md``
    (``cmp``: the comparison's sizes, default :data:`COMPARE`)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "study.json"
    res = json.loads(path.read_text()) if path.exists() else {
        "synthetic": True, "task": kg_short.TASK_NAME, "cache": str(cache),
        "sizes": dataclasses.asdict(sizes), "log": []}
    st = Study(cache, out, sizes, cmp)
    need = _shared.need

    def one(part: str) -> dict:
        if part == "cost":
            return cost_sweep()
        if part == "teacher":
            return st.teacher()
        fp = resume.study_fingerprint(cache, sizes)
        resume.check_study(out, fp)
        resume.write_study(out, fp)
        st.fp = fp
        res["fingerprint"] = {k: fp[k] for k in ("cache_sha", "config_sha")}
        if part == "cold":
            return st.cold()
        cold = need(res, "cold")
        if part == "depth":
            return st.depth({"cold": cold["student"]})
        if part == "pilot":
            return st.pilot(cold)
        pil = need(res, "pilot")
        if part == "gate":
            return st.gate(cold, pil)
        if part == "reopd_pilot":
            return st.reopd_pilot(cold, pil, need(res, "gate"))
        rp, g = need(res, "reopd_pilot"), need(res, "gate")
        return (st.secondary if part == "secondary" else st.compare)(cold, pil, rp, g)
    return _shared.run_parts(res, parts, one, st, path, out / "report.md", report.markdown)
