"""ReOPD where its mechanism can appear (issue 35), SYNTHETIC: the pre-registered OPD / ReOPD /
SFT comparison on the long-horizon knowledge-graph task, the teacher's reliability by depth and
the fair clock. The registration is studies/reopd_kg/README.md; the command is
``python -m studies.reopd_kg`` (its docstring lists the parts).

Everything here is wiring: the trainer runs each method (``prada_jax.distill.trainer``), the
measurements are this study's (``studies.reopd_kg.reliability``,
``studies.reopd_kg.fairclock``) or library functions (``prada_jax.distill.task.kg.path_stats``);
the registered rules ``studies.reopd_kg.verdicts`` (statistics: ``prada_jax.stats``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax.configs.distill import get_config
from prada_jax.distill import opd as opd_lib
from prada_jax.distill import task_registry as tasks_lib
from prada_jax.distill import stepping, trainer
from prada_jax.distill.batches import opd_rows
from prada_jax.distill.learner import onpolicy_round
from prada_jax.distill.sampler import TurnSampler
from prada_jax.distill.task import kg
from prada_jax.distill.task.kg_teacher.__main__ import main as build_kg_cache
from prada_jax.lm.hf import load_hf
from prada_jax.run_state import read_run_meta
from studies import _shared
from studies import reopd_vs_opd as base
from studies.reopd_kg import fairclock, report, resume
from studies.reopd_kg import reliability as rel
from studies.reopd_kg.verdicts import success_matrix, verdicts

HEADROOM_MIN = 0.10     # cold-start gate: teacher − cold start on the verdict problems >=
NEAR_UNIQUE_SHARE = 0.9  # item 4: pool share equal to the reference at or above this = near unique
CLOCK_LR, CLOCK_B = 3e-4, 64   # the clock without the pilot: issue 24's lr, the kg study's pairs
PARTS = ("paths", "cold", "pilot", "compare", "reliability", "clock")
MODES = ("opd", "reopd", "sft")


@dataclasses.dataclass
class Sizes:
    """Every size of the study (``FULL`` = the registered one; ``QUICK`` for the test)."""

    seeds: tuple = tuple(range(20))          # verdict seeds, paired across methods
    pilot_seeds: tuple = (100, 101, 102)     # lr pilot seeds (disjoint from the verdict seeds)
    updates: int = 100                       # N: updates of every method (equal turns)
    episodes: int = 8                        # E: OPD episodes per update per seed
    kappas: tuple = (0.6, 1.0)               # ReOPD κ values (the first is the verdict's)
    n_eval: int = 256                        # problems per verdict set
    eval_sets: tuple = (1, 5)                # verdict sets A, B: make_problems(s * 1000 + 3)
    pilot_eval_seed: int = 2                 # pilot problems
    pilot_n_eval: int = 128
    gate_eval_seed: int = 3                  # cold-start gate problems
    gate_n_eval: int = 128
    cold_success_min: float = 0.30           # cold start: SFT until success >= this ...
    cold_every: int = 50                     # ... checked every this many updates ...
    cold_budget: int = 600                   # ... or this many updates
    sft_batch: int = 64                      # cold start pairs per update
    lrs: tuple = (1e-4, 3e-4, 1e-3)          # pilot grid, per mode
    warmup: int = 5                          # warm-up updates of every compared method
    n_boot: int = 2000                       # two-way bootstrap replicates
    rel_teacher: int = 1024                  # reliability: teacher pool trajectories
    rel_pairs: int = 1024                    # reliability: ReOPD rows (uniform over turns)
    rel_episodes: int = 256                  # reliability: student episodes per student
    timing_seeds: int = 4                    # clock: students stepped together
    timing_rounds: int = 12                  # clock: interleaved rounds (the first compiles)
    latencies_ms: tuple = (0.0, 1.0, 10.0, 100.0)   # clock: tool latency per turn round
    ckpt_every: int = 25                     # pilot / compare runs: checkpoint cadence [updates]
    registered_seeds: int = 20               # verdicts only once this many seeds have run
    student: dict = dataclasses.field(default_factory=dict)


FULL = Sizes()
QUICK = Sizes(seeds=(0, 1), pilot_seeds=(100,), updates=2, episodes=2, n_eval=4,
              pilot_n_eval=4, gate_n_eval=4, cold_success_min=0.0, cold_every=1, cold_budget=2,
              sft_batch=8, lrs=(1e-3,), warmup=0, n_boot=200, rel_teacher=8, rel_pairs=8,
              rel_episodes=4, timing_seeds=2, timing_rounds=3, ckpt_every=1_000_000,
              registered_seeds=2,
              student=dict(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=32))


def tiny_cache(root: Path) -> Path:
    """A tiny kg cache (random-ish teacher, 16-trajectory pools) for ``--quick``."""
    build_kg_cache([f"--cache={root}", "--seed=0", "--steps=3", "--hidden=16", "--layers=1", "--heads=2",
           "--kv_heads=1", "--intermediate=32", "--n_train=64", "--n_pool=16", "--n_eval=4",
           "--top_k=4", "--warmup=1"])
    return Path(root) / "seed0"


def cold_sha(cold: dict) -> str:
    """sha256 of the cold-start student's weights (every pilot and compare run's init)."""
    return resume.sha256_file(Path(cold["student"]) / "model.safetensors")


def turns_per_update(recs: list[dict]) -> int:
    """B: OPD's mean supervised turns per update per seed over one-seed run records."""
    turns = sum(r["totals"]["supervised_turns"] for r in recs)
    return max(1, round(turns / sum(r["updates"] for r in recs)))


class Study:
    def __init__(self, cache: Path, out: Path, sizes: Sizes, fp: dict | None = None):
        self.b = base.Study(cache, out, base.Sizes(student=sizes.student, n_eval=sizes.n_eval))
        self.cache, self.out, self.s = Path(cache), Path(out), sizes
        self.fp = fp or {}
        self.task, self.pool = self.b.task, self.b.pool

    say = property(lambda self: self.b.say)

    # ------------------------------------------------------------------ helpers
    def problems(self, eval_seed: int, n: int) -> list:
        return kg.make_problems(eval_seed * 1000 + 3, n)

    def outcomes(self, hf_dir: Path) -> dict:
        """Greedy 0/1 success per problem of each verdict set, as '0'/'1' strings."""
        model, _ = load_hf(hf_dir, dtype=jnp.float32, param_dtype=jnp.float32)
        out = {}
        for es in self.s.eval_sets:
            res = kg.run_episodes(self.problems(es, self.s.n_eval),
                                  kg.flax_generate_fn(model, batch=64), kg.MAX_TURNS)
            out[str(es)] = "".join("1" if r.success else "0" for r in res)
        return out

    def config(self, variant: str, steps: int, seeds, eval_seed: int, **fields):
        return base._config(self.cache, variant, dataclasses.replace(
            base.FULL, n_eval=self.s.n_eval, student=self.s.student), steps, seeds, eval_seed,
            **fields)

    def mode_fields(self, mode: str, init: str, B: int | None, kappa: float = 0.6) -> dict:
        f = {"student.init": init}
        if mode == "opd":
            f.update({"opd.episodes": self.s.episodes, "opd.tool_latency_s": 0.0})
        elif mode == "reopd":
            f.update({"train.batch_size": int(B), "sampler.kappa": kappa})
        else:
            f["train.batch_size"] = int(B)
        return f

    VARIANT = {"opd": "kg,opd", "reopd": "kg,onpolicy", "sft": "kg,sft,uniform"}

    # ------------------------------------------------------------------ parts
    def paths(self) -> dict:
        """Item 4: how unique the pool's solution paths are, and the regime it puts SFT in."""
        st = kg.path_stats(self.pool, tasks_lib.get(kg.TASK_NAME).pool_problems(self.pool))
        near = (st["share_equal_reference"] >= NEAR_UNIQUE_SHARE
                or st["valid_paths_per_problem_mean"] < 2)
        st["near_unique"] = bool(near)
        st["regime"] = ("near-unique path: SFT's target is (nearly) exact" if near else
                        "several valid paths per problem and a sampled teacher pool: SFT "
                        "imitates a distribution")
        self.say(f"paths: {st}")
        return st

    def cold(self) -> dict:
        s = self.s
        c = self.config("kg,sft,uniform", s.cold_budget, (0,), s.gate_eval_seed,
                        **{"train.batch_size": s.sft_batch, "gate.every": s.cold_every,
                           "gate.success_min": s.cold_success_min, "gate.gap_max": 1e9,
                           "eval.n_problems": s.gate_n_eval})
        res = self.b.train("cold", c)
        hf = self.out / "cold" / "student_hf"
        gate = res.get("gate", {})
        cold = self.outcomes(hf)
        teacher = self.outcomes(self.cache / "teacher")
        rate = lambda o: float(np.mean([int(ch) for v in o.values() for ch in v]))   # noqa: E731
        out = {"student": str(hf), "reached": bool(gate.get("reached")),
               "step": gate.get("step"), "outcomes": cold, "teacher_outcomes": teacher,
               "success": rate(cold), "teacher_success": rate(teacher)}
        out["headroom"] = out["teacher_success"] - out["success"]
        out["headroom_ok"] = out["headroom"] >= HEADROOM_MIN
        self.say(f"cold start: success {out['success']:.3f}, teacher {out['teacher_success']:.3f}"
                 f", headroom {out['headroom']:.3f} ({'ok' if out['headroom_ok'] else 'BELOW'}"
                 f" {HEADROOM_MIN})")
        return out

    # ------------------------------------------------------------------ one run per seed
    def unit(self, part: str, name: str, mode: str, seed: int, lr: float, B, cold: dict,
             kappa: float = 0.6, eval_seed: int = 1, n_eval_trainer: int = 0,
             outcomes: bool = False) -> dict:
        """One (part, method, lr or κ, seed) training run from the cold start, as a record
        in ``<out>/runs/<part>/<name>_seed<seed>.json``: reused when it exists (same
        fingerprint), else trained in ``<out>/<part>/<name>/seed_<seed>`` (a finished trainer
        folder is reused; a killed one resumes from its last checkpoint) and written as soon
        as it finishes. ``outcomes``: greedy 0/1 per problem of both verdict sets."""
        path = resume.record_path(self.out, part, name, seed)
        fp = {**self.fp, "cold_sha": cold_sha(cold)}
        rec = resume.load_record(path, fp)
        if rec is not None:
            self.say(f"{part}/{name} seed {seed}: finished earlier ({path}); skipped")
            return rec
        c = self.unit_config(mode, seed, lr, B, cold, kappa, eval_seed, n_eval_trainer)
        wd = self.out / part / name / f"seed_{seed}"
        started, load0 = resume._utc(), os.getloadavg()[0]
        t0 = time.perf_counter()
        res = self.b.train(f"{part}/{name}/seed_{seed}", c)
        if res.get("finished") is False:
            raise RuntimeError(f"{wd}: stopped before the end ({res.get('stopped_by')})")
        secs = time.perf_counter() - t0
        per = base._per_seed(res)[0]
        sm = {"updates": int(per["cost"]["updates"]), "totals": per["cost"]["totals"],
              "tool_calls": int(res.get("env_calls_during_training",
                                        per.get("env_calls_during_training", 0))),
              "gap_end": per["ratio"][-1].get("mean_gap") if per.get("ratio") else None}
        adopted = [e.get("from") for e in read_run_meta(wd).get("provenance", [])
                   if e.get("event") == "adopted"]
        rec = {"synthetic": True, "part": part, "name": name, "mode": mode, "seed": int(seed),
               "lr": lr, "kappa": kappa if mode == "reopd" else None,
               "B": None if mode == "opd" else int(B), "updates": sm["updates"],
               "totals": sm["totals"], "tool_calls": sm["tool_calls"],
               "gap_end": sm["gap_end"], "workdir": str(wd.relative_to(self.out)),
               "fingerprint": {k: fp[k] for k in ("cache_sha", "config_sha", "cold_sha")},
               "trainer_reused": bool(res.get("already_finished")), "train_s": secs,
               "adopted_from": adopted[-1] if adopted else None,
               "started_utc": started}
        if n_eval_trainer:
            rec["success"] = float(per["after"]["success_rate"])
            rec["eval_problems"] = {"seed": eval_seed, "n": n_eval_trainer}
        t1 = time.perf_counter()
        if outcomes:
            rec["outcomes"] = self.outcomes(wd / "student_hf")
            rec["success"] = float(np.mean([int(ch) for v in rec["outcomes"].values()
                                            for ch in v]))
        rec.update(eval_s=time.perf_counter() - t1, finished_utc=resume._utc(),
                   load_avg_1min=[load0, os.getloadavg()[0]])
        resume.save_record(path, rec)
        self.say(f"{part}/{name} seed {seed}: success {rec.get('success', float('nan')):.3f} "
                 f"({secs:.0f} s train, {rec['eval_s']:.0f} s eval) -> {path}")
        return rec

    def unit_config(self, mode: str, seed: int, lr: float, B, cold: dict, kappa: float = 0.6,
                    eval_seed: int = 1, n_eval_trainer: int = 0):
        """The trainer config of one (method, lr, seed) run from the cold start."""
        s = self.s
        return self.config(self.VARIANT[mode], s.updates, (seed,), eval_seed,
                           **self.mode_fields(mode, cold["student"], B, kappa),
                           **{"optim.lr": lr, "optim.warmup_steps": s.warmup,
                              "eval.n_problems": n_eval_trainer, "log.ckpt_every": s.ckpt_every})

    def pilot(self, cold: dict) -> dict:
        """Per mode the lr grid on every pilot seed, one run each. B = OPD's mean supervised
        turns per update per seed over its first lr's pilot runs (all pilot seeds); each mode
        keeps the lr with the best mean success over the pilot seeds (ties: the smaller lr),
        chosen only once every pilot run exists."""
        s, rows, choice, B = self.s, [], {}, None
        for mode in MODES:
            best = None
            for lr in s.lrs:
                name = f"{mode}_lr{lr:g}"
                recs = [self.unit("pilot", name, mode, sd, lr, B, cold,
                                  eval_seed=s.pilot_eval_seed, n_eval_trainer=s.pilot_n_eval)
                        for sd in s.pilot_seeds]
                if mode == "opd" and B is None:
                    B = turns_per_update(recs)
                mean = float(np.mean([r["success"] for r in recs]))
                rows.append({"mode": mode, "lr": lr, "seeds": [r["seed"] for r in recs],
                             "success": [r["success"] for r in recs], "mean": mean})
                if best is None or mean > best[0] + 1e-12:
                    best = (mean, lr)
            choice[mode] = {"lr": best[1], "warmup": s.warmup, "pilot_mean": best[0]}
        self.say(f"pilot: B {B}, choice {choice}")
        return {"rows": rows, "choice": choice, "B": B}

    def methods(self) -> list[tuple[str, str, float]]:
        """(name, mode, κ) of the compared methods, the verdict's ReOPD first after OPD."""
        out = [("opd", "opd", 0.0)]
        out += [(f"reopd_k{k:g}", "reopd", k) for k in self.s.kappas]
        return out + [("sft_cont", "sft", 0.0)]

    def compare(self, cold: dict, pil: dict) -> dict:
        """Seeds in order, every method per seed (one run each, from the cold start, at the
        pilot's lr and B); the verdicts from all of ``seeds``' runs."""
        s, runs = self.s, {}
        for sd in s.seeds:
            for name, mode, kappa in self.methods():
                rec = self.unit("compare", name, mode, sd, pil["choice"][mode]["lr"],
                                pil["B"], cold, kappa=kappa or 0.6,
                                eval_seed=s.eval_sets[0], outcomes=True)
                r = runs.setdefault(name, {"mode": mode, "kappa": kappa or None,
                                           "lr": rec["lr"], "outcomes": {}, "totals": {},
                                           "tool_calls": 0, "gap_end": [], "train_s": [],
                                           "eval_s": []})
                r["outcomes"][str(sd)] = rec["outcomes"]
                for k, v in rec["totals"].items():
                    r["totals"][k] = r["totals"].get(k, 0) + v
                r["tool_calls"] += rec["tool_calls"]
                r["gap_end"].append(rec["gap_end"])
                r["train_s"].append(rec["train_s"])
                r["eval_s"].append(rec["eval_s"])
        for name, r in runs.items():
            self.say(f"{name}: success {success_matrix(r, s.eval_sets).mean():.3f} over "
                     f"{len(r['outcomes'])} seeds")
        return {"N": s.updates, "B": pil["B"], "runs": runs,
                "verdicts": verdicts(runs, cold, s)}

    def reliability(self, cold: dict, extra: dict | None = None) -> dict:
        """Item 2: the teacher's log-prob per depth on its own rows, ReOPD rows (teacher
        prefix, cold student's action) and each student's own episodes (OPD rows)."""
        s, score = self.s, self.b.score_fn
        dflt = get_config("kg")
        A, P = int(dflt.onpolicy.max_new_tokens), int(dflt.opd.context_len)
        out = {"sources": {}}
        out["sources"]["teacher"] = rel.teacher_rows(self.pool, score, s.rel_teacher)
        students = {"cold": cold["student"], **(extra or {})}
        problems = self.task.pool_problems(self.pool)
        for name, d in students.items():
            model, _ = load_hf(Path(d), dtype=jnp.float32, param_dtype=jnp.float32)
            graphdef, params = nnx.split(model, nnx.Param)
            if name == "cold":   # ReOPD rows: teacher prefix (uniform over turns), student action
                smp = TurnSampler(self.pool, kappa=1.0)
                rng = np.random.default_rng(0)
                rows = {"cluster": [], "t": [], "logp_turn": [], "tokens": []}
                for j in range(0, s.rel_pairs, 256):
                    pairs = smp.draw(rng, min(256, s.rel_pairs - j))
                    tb = smp.batch(pairs)
                    prompts = [self._prefix(smp, int(k)) for k in pairs]
                    batch, _, _ = onpolicy_round(
                        graphdef, params, jax.random.key(j), tb, score, max_new_tokens=A,
                        temperature=1.0, top_p=1.0, stop_ids=self.task.stop_ids,
                        pad_id=self.task.pad_id, prompt_tokens=prompts)
                    rel.add_batch(rows, batch, smp.pair_traj[pairs])
                out["sources"]["reopd"] = rows
            rows = {"cluster": [], "t": [], "logp_turn": [], "tokens": []}
            for j in range(0, s.rel_episodes, 64):
                probs = problems[j:min(j + 64, s.rel_episodes)]
                gen = opd_lib.student_generate_fn(
                    graphdef, params, jax.random.key(1000 + j), batch=len(probs),
                    context_len=P, max_new_tokens=A, temperature=1.0, top_p=1.0,
                    stop_ids=self.task.stop_ids, pad_id=self.task.pad_id)
                R = len(probs) * self.task.max_turns
                batch, _, eps = opd_lib.opd_round(self.task, probs, gen, score, rows=R,
                                                  context_len=P, action_len=A)
                ks = [len(self.task.to_tokens(e.messages)[1]) for e in eps]
                cl = np.full(R, -1)
                cl[:sum(ks)] = j + np.repeat(np.arange(len(eps)), ks)
                rel.add_batch(rows, batch, cl)
            out["sources"][f"opd_{name}"] = rows
        out["curves"] = {k: rel.curves(v, n_boot=s.n_boot, seed=1)
                         for k, v in out["sources"].items()}
        for k, c in out["curves"].items():
            f = c["per_turn"]["fit"]
            self.say(f"reliability {k}: " + ("no fit (fewer than 2 depths)" if f is None else
                     f"slope {f['slope']:.3f} nats/turn, κ {f['kappa']:.3f}, r2 {f['r2']}"))
        return out

    def _prefix(self, smp, k: int) -> list[int]:
        s = int(self.pool.turn_starts[k])
        a = max(int(self.pool.traj_offsets[smp.pair_traj[k]]), s - smp.P)
        return np.asarray(self.pool.tokens[a:s]).tolist()

    def clock(self, cold: dict, pil: dict | None) -> dict:
        """Item 3: OPD (no sleep) and ReOPD κ = first of ``kappas`` built in one process and
        stepped update by update in turn; the fair clock from their cost records. Without the
        pilot's results: lr :data:`CLOCK_LR` for both and B = :data:`CLOCK_B` pairs."""
        s = self.s
        pil = pil or {"B": CLOCK_B, "choice": {m: {"lr": CLOCK_LR, "warmup": s.warmup}
                                               for m in MODES}, "default": True}
        seeds = tuple(range(s.timing_seeds))
        cfgs = {}
        for name, mode, kappa in self.methods()[:2]:
            ch = pil["choice"][mode]
            cfgs[name] = self.config(self.VARIANT[mode], s.timing_rounds, seeds, s.eval_sets[0],
                                     **self.mode_fields(mode, cold["student"], pil["B"], kappa),
                                     **{"optim.lr": ch["lr"], "optim.warmup_steps": ch["warmup"],
                                        "eval.n_problems": 0})
        root = self.out / "clock"
        if root.exists():   # one process's rounds: never resumed
            shutil.rmtree(root)
        built = {k: stepping.open_run(trainer.build_setup(c, teacher_score_fn=self.b.score_fn),
                                      root / k)
                 for k, c in cfgs.items()}
        events, t0 = [], time.perf_counter()
        load0 = os.getloadavg()[0]
        try:
            for r in range(s.timing_rounds):
                for k in built:
                    events.append([r, k, time.perf_counter() - t0])
                    built[k] = stepping.step(built[k], r)
        finally:
            for run in built.values():
                trainer.close_files(run.files)
        names = list(built)
        opd_setup = built[names[0]].setup
        rows = (opd_rows(opd_setup.config, opd_setup.task) * len(seeds)
                * int(opd_setup.config.optim.grad_accum))
        costs = {k: [dict(c) for c in run.host.costs] for k, run in built.items()}
        rep = fairclock.report(costs[names[0]], costs[names[1]], rows,
                               latencies=tuple(x / 1000 for x in s.latencies_ms))
        rep.update(runs=names, seeds=len(seeds), B=pil["B"], pilot_used=not pil.get("default"),
                   rounds=s.timing_rounds, events=events,
                   per_update=costs, load_avg_1min=[load0, os.getloadavg()[0]],
                   wall_s=time.perf_counter() - t0)
        m = rep["median"]
        self.say(f"clock: ratio at 0 {m['ratio']['0']}, at 10 ms {m['ratio'].get('0.01')}, "
                 f"break-even {m['break_even_latency_s']} s, teacher compute "
                 f"{rep['ratio_teacher_compute']}")
        return rep


# ---------------------------------------------------------------------------- run
def run(cache: Path, out: Path, sizes: Sizes, parts: tuple) -> dict:
    """Runs ``parts`` in order, merging each into ``<out>/study.json`` and the tables into
    ``<out>/report.md``; a finished training run under ``out`` is reused."""
    fp = resume.study_fingerprint(cache, sizes)
    resume.check_study(out, fp)   # another cache or config: refused, nothing written
    out.mkdir(parents=True, exist_ok=True)
    resume.write_study(out, fp)
    path = out / "study.json"
    res = json.loads(path.read_text()) if path.exists() else {
        "synthetic": True, "task": "kg_lookup_v1", "cache": str(cache),
        "sizes": dataclasses.asdict(sizes), "log": []}
    res["study"] = "reopd_kg"   # which study wrote the folder (studies.reopd_vs_opd.study_kind)
    res["fingerprint"] = {k: fp[k] for k in ("cache_sha", "config_sha")}
    st = Study(cache, out, sizes, fp)
    need = _shared.need

    def one(part: str) -> dict | None:
        if part == "paths":
            got = st.paths()
        elif part == "cold":
            got = st.cold()
        elif part == "pilot":
            got = st.pilot(need(res, "cold"))
        elif part == "compare":
            got = st.compare(need(res, "cold"), need(res, "pilot"))
        elif part == "reliability":
            got = _reliability(st, res, out, sizes, fp)
        else:
            got = st.clock(need(res, "cold"), res.get("pilot"))
        if got is not None:
            got["sizes"] = dataclasses.asdict(sizes)   # a part may run with other flags
        return got
    return _shared.run_parts(res, parts, one, st.b, path, out / "report.md", report.markdown)


def _reliability(st: Study, res: dict, out: Path, sizes: Sizes, fp: dict) -> dict | None:
    """The reliability part: the cold start and, once it exists, the first verdict seed's OPD
    student; None (reused) when it ran with the same students."""
    extra = {}
    d = out / "compare" / "opd" / f"seed_{sizes.seeds[0]}" / "student_hf"
    if resume.record_path(out, "compare", "opd", sizes.seeds[0]).exists():
        extra[f"opd_trained_seed{sizes.seeds[0]}"] = str(d)
    key = {**{k: fp[k] for k in ("cache_sha", "config_sha")},
           "cold_sha": cold_sha(_shared.need(res, "cold")), "students": sorted(extra)}
    if (res.get("reliability") or {}).get("fingerprint") == key:
        st.say("reliability: finished with the same students; reused")
        return None
    r = st.reliability(_shared.need(res, "cold"), extra)
    r.pop("sources")   # rows are large; the curves carry the numbers
    r["fingerprint"] = key
    return r
