"""ReOPD against OPD with a gate that can pass (issue 53; registration:
studies/reopd_gate/README.md), SYNTHETIC.

    python -m studies.reopd_gate --out=DIR [--regime=DIR] [--parts=P,...] [--seeds=a-b]
    python -m studies.reopd_gate --quick --regime=DIR --out=DIR    # tiny sizes (a test)

Builds on the regime study's folder ``--regime`` (default ``checkpoints/reopd_regime``: its
``cache/`` — teacher T, pool, logits — and ``cold.json`` with the un-annealed cold start,
made by ``python -m studies.reopd_regime --out=DIR --parts=teacher,cold``). Parts, in the
order given (default all three):

* ``reopd_pilot``: ReOPD κ 0.6's mini-pilot, lr ∈ {1e-3, 3e-3} on pilot seeds 100, 101, greedy
  success on the pilot set; one extension by :func:`studies.reopd_gate.rules.extension`;
* ``seeds``: per verdict seed (``--seeds``, default 0-7), in seed order: OPD, SFT
  continuation, ReOPD κ 0.6, OPD at ReOPD's modelled rollout cost; greedy outcomes on the 4
  verdict sets (2 048 problems) and the probe curve every 25 updates in each record; the cold
  start's outcomes on the same sets (``cold_outcomes.json``);
* ``analysis``: the gate G1/G2/G3 and, if it passes, endpoints (a), (c), (e) from every record
  there is: at the 8 registered seeds the verdict, at fewer an interim reading (no verdict).

Resumable: every finished run is written at once as ``<out>/runs/<part>/<name>_seed<s>.json``
and skipped on a restart (``studies.reopd_kg.resume``: records carry the cache / config /
cold-start fingerprint; a restart against another cache or design is refused, exit 2); a
killed trainer resumes from its last checkpoint (every 25 updates). Writes
``<out>/study.json`` and ``<out>/report.md``. Bad input: one line on stderr, exit 2.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from prada_jax.distill.task import kg
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from studies import _shared
from studies import reopd_regime as RS
from studies.reopd_gate import rules
from studies.reopd_kg import resume

PARTS = ("reopd_pilot", "seeds", "analysis")
ROOT = Path(__file__).resolve().parents[2]
REGIME_RECORDS = ROOT / "studies" / "reopd_regime" / "results"


@dataclasses.dataclass(frozen=True)
class Design:
    """Every size of this study (README, "Design"); ``FULL`` is the registered one."""

    seeds: tuple = tuple(range(8))
    verdict_sets: tuple = (11, 12, 13, 14)     # make_problems(es * 1000 + 3, n_verdict)
    n_verdict: int = 512
    updates: int = 400
    B: int = 42                                # ReOPD / SFT pairs per update (regime's)
    lr: tuple = (("opd", 3e-3), ("sft", 1e-3))
    kappa: float = 0.6
    pilot_lrs: tuple = (1e-3, 3e-3)
    pilot_seeds: tuple = (100, 101)
    pilot_tol: float = 0.01
    n_boot: int = 2000


FULL = Design()
QUICK = Design(seeds=(0, 1), verdict_sets=(11, 12), n_verdict=4, updates=2, B=8,
               pilot_seeds=(100,), n_boot=200)


def fingerprint(cache: Path, sizes, design: Design) -> dict:
    """The regime study's fingerprint (cache, its sizes) with this design added to the
    config, so records of another design are never pooled."""
    fp = resume.study_fingerprint(cache, sizes)
    d = json.loads(json.dumps(dataclasses.asdict(design)))
    d.pop("seeds")   # each verdict seed is its own run: a longer range extends the study
    fp["config"] = {**fp["config"], "reopd_gate": d}
    fp["config_sha"] = resume.digest(fp["config"])
    return fp


class GateStudy(_shared.Log):
    def __init__(self, regime: Path, out: Path, sizes, design: Design):
        super().__init__()
        import torch  # lazy: torch is the [torch] extra (the teacher's scorer)
        # one thread, as the regime's teacher part: the scorer's default 2 threads spin against
        # the other processes of a shared 2-core machine (scoring was 1-3 s of a ReOPD update)
        torch.set_num_threads(1)
        self.regime, self.out, self.d = Path(regime), Path(out), design
        self.cache = self.regime / "cache"
        cold_path = self.regime / "cold.json"
        if not cold_path.is_file():
            raise BadInput(f"--regime: {cold_path} not found (build it with python -m "
                           f"studies.reopd_regime --out={self.regime} --parts=teacher,cold)")
        self.cold = json.loads(cold_path.read_text())
        self.fp = fingerprint(self.cache, sizes, design)
        if self.cold.get("fingerprint") != self.fp["cache_sha"]:
            raise BadInput(f"--regime: {cold_path} was made on another cache (field "
                           "fingerprint); rebuild the cold start")
        resume.check_study(self.out, self.fp)
        self.st = RS.Study(self.cache, self.out, sizes)
        self.st.fp = self.fp
        self.st.say = self.say
        self.sizes = sizes

    @property
    def sets(self) -> dict:
        return {f"v{es}": (es, self.d.n_verdict) for es in self.d.verdict_sets}

    def lr(self, mode: str) -> float:
        return dict(self.d.lr)[mode]

    # ------------------------------------------------------------------ mini-pilot
    def reopd_pilot(self) -> dict:
        s, d = self.sizes, self.d
        sets = {"pilot": (s.pilot_eval_seed, s.pilot_n)}

        def runs(lr):
            return [self.st.unit("reopd", lr, sd, self.cold, d.B, part="pilot",
                                 name=f"reopd_lr{lr:g}", kappa=d.kappa, updates=d.updates,
                                 sets=sets) for sd in d.pilot_seeds]
        recs = {lr: runs(lr) for lr in d.pilot_lrs}
        means = {lr: float(np.mean([r["success"]["pilot"] for r in rs]))
                 for lr, rs in recs.items()}
        ext = rules.extension(means, d.pilot_lrs, d.pilot_tol)
        if ext is not None:
            recs[ext] = runs(ext)
            means[ext] = float(np.mean([r["success"]["pilot"] for r in recs[ext]]))
        lr = rules.choose_lr(means)
        chosen = recs[lr]
        per = sum((r["per_update_counts"] for r in chosen), [])
        cost_r = rules.price_counts(per, "reopd", kg.MAX_ACTION_TOKENS)
        cost_o = self.opd_regime_cost()
        nc = rules.n_cost(d.updates, s.curve_every, cost_r["rollout_s"], cost_o["rollout_s"])
        self.say(f"ReOPD mini-pilot: means {means}, extension {ext}, lr {lr:g}; OPD at equal "
                 f"rollout cost: {nc} updates (SYNTHETIC)")
        return {"means": {f"{k:g}": v for k, v in means.items()}, "extension": ext, "lr": lr,
                "n_cost": nc, "rollout_s_per_update": {"reopd": cost_r["rollout_s"],
                                                       "opd": cost_o["rollout_s"]},
                "runs": [r["workdir"] for rs in recs.values() for r in rs]}

    def opd_regime_cost(self) -> dict:
        """OPD's (lr 3e-3) modelled cost per update from the regime study's committed pilot
        records (its seeds 100–102)."""
        per = []
        for sd in (100, 101, 102):
            p = REGIME_RECORDS / "runs" / "pilot" / f"opd_lr{self.lr('opd'):g}_seed{sd}.json"
            if p.is_file():
                per += json.loads(p.read_text())["per_update_counts"]
        if not per:
            raise BadInput(f"--regime: no OPD pilot records under {REGIME_RECORDS}")
        return rules.price_counts(per, "opd", kg.MAX_ACTION_TOKENS)

    # ------------------------------------------------------------------ the verdict seeds
    def methods(self, pil: dict) -> list:
        d = self.d
        return [("opd", "opd", self.lr("opd"), d.updates),
                ("sft_cont", "sft", self.lr("sft"), d.updates),
                ("reopd", "reopd", pil["lr"], d.updates),
                ("opd_cost", "opd", self.lr("opd"), pil["n_cost"])]

    def cold_outcomes(self) -> dict:
        path = self.out / "cold_outcomes.json"
        if path.is_file():
            got = json.loads(path.read_text())
            if got.get("cold_sha") == self.cold["cold_sha"] and set(got["outcomes"]) >= {
                    *self.sets, "probe"}:
                return got
        s = self.sizes
        hf = Path(self.cold["student"])
        out = self.st.outcomes(hf, {**self.sets, "probe": (s.probe_eval_seed, s.probe_n)})
        got = {"synthetic": True, "cold_sha": self.cold["cold_sha"], "outcomes": out,
               "success": {k: float(np.mean([int(c) for c in v])) for k, v in out.items()}}
        write_json(path, got, indent=1, newline=False)
        self.say(f"cold start on the verdict sets: {got['success']} (SYNTHETIC)")
        return got

    def seeds(self, pil: dict, seeds: tuple) -> dict:
        self.cold_outcomes()
        done = {}
        for sd in seeds:
            for name, mode, lr, upd in self.methods(pil):
                rec = self.st.unit(mode, lr, sd, self.cold, None if mode == "opd" else self.d.B,
                                   part="compare", name=name, kappa=self.d.kappa, updates=upd,
                                   sets=self.sets)
                done.setdefault(name, []).append(sd)
                self.say(f"seed {sd} {name}: verdict-set success "
                         f"{np.mean([rec['success'][k] for k in self.sets]):.4f}, train "
                         f"{rec['train_s']:.0f} s, eval {rec['eval_s']:.0f} s (SYNTHETIC)")
        return {"seeds_run": list(seeds)}

    # ------------------------------------------------------------------ the analysis
    def records(self, pil: dict) -> tuple:
        """``{name: [records]}`` over the seeds where every method has a record, and those
        seeds."""
        have = {}
        for sd in self.d.seeds:
            got = {name: resume.load_record(resume.record_path(self.out, "compare", name, sd),
                                            {**self.fp, "cold_sha": self.cold["cold_sha"]})
                   for name, *_ in self.methods(pil)}
            if all(v is not None for v in got.values()):
                have[sd] = got
        seeds = sorted(have)
        return {n: [have[sd][n] for sd in seeds] for n, *_ in self.methods(pil)}, seeds

    def analysis(self, pil: dict) -> dict:
        d = self.d
        recs, seeds = self.records(pil)
        if len(seeds) < 2:
            raise BadInput(f"--parts: analysis needs >= 2 complete verdict seeds, {self.out} "
                           f"has {len(seeds)} (run --parts=seeds)")
        co = self.cold_outcomes()
        keys = list(self.sets)
        strata = [d.n_verdict] * len(keys)

        def mat(rs):
            return np.array([[int(ch) for k in keys for ch in r["outcomes"][k]] for r in rs],
                            np.float64)
        X = {k: mat(v) for k, v in recs.items()}
        cold = np.array([int(ch) for k in keys for ch in co["outcomes"][k]], np.float64)
        final = len(seeds) == len(d.seeds)
        out = {"seeds": seeds, "complete": final, "n_problems": int(cold.size),
               "reading": "verdict (the registered 8 seeds)" if final else
               f"interim: {len(seeds)} of {len(d.seeds)} seeds, no verdict",
               "success": {k: float(x.mean()) for k, x in X.items()},
               "success_per_seed": {k: x.mean(1).tolist() for k, x in X.items()},
               "cold_success": float(cold.mean()), "cold_probe": co["success"]["probe"],
               "tool_calls": {k: [r["tool_calls"] for r in v] for k, v in recs.items()}}
        g = rules.gate(X["opd"], X["sft_cont"], cold, strata, d.n_boot)
        out["gate"] = g
        self.say(f"gate ({out['reading']}): {g['outcome']}; G1 {g['G1']['mean']:+.4f} "
                 f"[{g['G1']['ci_low']:+.4f}, {g['G1']['ci_high']:+.4f}], G2 "
                 f"{g['G2']['mean']:+.4f} [{g['G2']['ci_low']:+.4f}, {g['G2']['ci_high']:+.4f}]"
                 f", G3 {g['G3']['mean']:.4f} (SYNTHETIC)")
        costs = {}
        for tool_s, key in ((rules.COST_TOOL_S, "rollout"), (0.0, "rollout_l0")):
            costs[key] = {}
            for name, mode in (("opd", "opd"), ("reopd", "reopd")):
                per = sum((r["per_update_counts"] for r in recs[name]), [])
                p = rules.price_counts(per, mode, kg.MAX_ACTION_TOKENS, tool_s=tool_s)
                costs[key][name] = p["rollout_s"]
                if key == "rollout":
                    costs.setdefault("total", {})[name] = p["total_s"]
        steps = [0] + [p[0] for p in recs["opd"][0]["curves"]["eval/success_rate"]]

        def curve(rs):
            return np.array([[co["success"]["probe"]] + [p[1] for p in
                                                         r["curves"]["eval/success_rate"]]
                             for r in rs])
        out["curves"] = {"steps": steps, "opd": curve(recs["opd"]).tolist(),
                         "reopd": curve(recs["reopd"]).tolist(),
                         "sft_cont": curve(recs["sft_cont"]).tolist()}
        out["cost_per_update_s"] = costs
        if g["passed"]:
            cu_ = {"steps": steps, "opd": curve(recs["opd"]), "reopd": curve(recs["reopd"]),
                   "cold": co["success"]["probe"], **costs}
            out["endpoints"] = rules.endpoints(X, cold, strata, cu_, d.n_boot)
            e = out["endpoints"]
            self.say(f"endpoints ({out['reading']}): (a) {e['a_reopd_vs_opd']['mean']:+.4f} "
                     f"{e['a_reopd_vs_opd']['verdict']}; (c) "
                     f"{e['c_time_to_80']['rollout']['ratio']} {e['c_time_to_80']['verdict']}; "
                     f"(e1) {e['e1_reopd_vs_sft']['verdict']}; (e2) "
                     f"{e['e2_reopd_vs_opd_equal_cost']['verdict']} (SYNTHETIC)")
        else:
            out["endpoints"] = None
        return out


def run(regime: Path, out: Path, parts: tuple, seeds: tuple | None, quick: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    sizes = RS.QUICK if quick else RS.FULL
    design = QUICK if quick else FULL
    gs = GateStudy(regime, out, sizes, design)
    resume.write_study(out, gs.fp)
    path = out / "study.json"
    res = json.loads(path.read_text()) if path.exists() else {
        "synthetic": True, "task": "kg_short_v1", "regime": str(regime),
        "design": dataclasses.asdict(design), "fingerprint": {k: gs.fp[k] for k in (
            "cache_sha", "config_sha")}, "cold_sha": gs.cold["cold_sha"],
        "cold_stopped_at": gs.cold["stopped_at"], "log": []}
    seeds = design.seeds if seeds is None else seeds

    def one(part: str) -> dict:
        if part == "reopd_pilot":
            return gs.reopd_pilot()
        pil = _shared.need(res, "reopd_pilot")
        if part == "seeds":
            return gs.seeds(pil, seeds)
        return gs.analysis(pil)
    return _shared.run_parts(res, parts, one, gs, path, out / "report.md", markdown)


def _f(x, fmt="+.4f"):
    return "—" if x is None else format(x, fmt)


def markdown(res: dict) -> str:
    """The study's report (SYNTHETIC)."""
    L = ["# ReOPD against OPD with a gate that can pass (issue 53) — SYNTHETIC task, CPU", ""]
    p = res.get("reopd_pilot")
    if p:
        L += [f"ReOPD κ 0.6 mini-pilot (pilot set, seeds 100–101): means {p['means']}, "
              f"extension {p['extension']}, chosen lr {p['lr']:g}; OPD at equal modelled "
              f"rollout cost: {p['n_cost']} updates.", ""]
    a = res.get("analysis")
    if a:
        g = a["gate"]
        L += [f"## Gate ({a['reading']}; seeds {a['seeds']}, {a['n_problems']} problems)", "",
              "| check | value | 95 % CI | rule | holds |", "|---|---|---|---|---|"]
        for k, rule, key in (("G1", "≥ +0.05, CI > 0", "G1_opd_gain"),
                             ("G2", "≥ +0.03, CI > 0", "G2_opd_vs_sft"),
                             ("G3", "≥ 0.10", "G3_headroom")):
            x = g[k]
            L.append(f"| {k} | {_f(x['mean'])} | [{_f(x['ci_low'])}, {_f(x['ci_high'])}] | "
                     f"{rule} | {g['checks'][key]} |")
        L += ["", f"Outcome: **{g['outcome']}**. Success (greedy, verdict sets): "
              + ", ".join(f"{k} {v:.4f}" for k, v in a["success"].items())
              + f", cold start {a['cold_success']:.4f}.", ""]
        e = a.get("endpoints")
        if e:
            L += ["## Endpoints", "", "| endpoint | value | 95 % CI | MDE | reading |",
                  "|---|---|---|---|---|"]
            for name, key in (("(a) ReOPD − OPD, 400 updates", "a_reopd_vs_opd"),
                              ("(e1) ReOPD − SFT continuation", "e1_reopd_vs_sft"),
                              ("(e2) ReOPD − OPD at equal rollout cost",
                               "e2_reopd_vs_opd_equal_cost")):
                x = e[key]
                L.append(f"| {name} | {_f(x['mean'])} | [{_f(x['ci_low'])}, "
                         f"{_f(x['ci_high'])}] | {x['mde']:.4f} | {x['verdict']} |")
            for key in ("rollout", "total", "rollout_no_tool_latency", "updates_only"):
                c = e["c_time_to_80"][key]
                L.append(f"| (c) time to 80 % of OPD's gain, ReOPD / OPD ({key}) | "
                         f"{_f(c['ratio'], '.4g')} | [{_f(c['ci_low'], '.4g')}, "
                         f"{_f(c['ci_high'], '.4g')}] | — | {c['verdict']} (OPD step "
                         f"{c['opd_step']}, ReOPD step {c['reopd_step']}) |")
            L.append("")
    return "\n".join(L) + "\n"
