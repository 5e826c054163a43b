"""The pre-registered addendum of studies/reopd_vs_opd/README.md (issue 24), SYNTHETIC: rule (b)
from interleaved timing, a valid far equal-wall-time run, and the near cold start at a budget
that can move the student.

    python -m studies.reopd_vs_opd.addendum --study_json=F --cache=DIR --out=DIR --parts=P
    python -m studies.reopd_vs_opd.addendum --quick --out=DIR   # tiny end-to-end run

(The runs of studies/reopd_vs_opd/README.md were made as ``python -m studies.reopd_vs_opd
--addendum ...`` with the same flags; the addendum became its own command afterwards, so that
the study module does not import it back, an import cycle.)

``--study_json`` is the study's per-seed JSON (studies/reopd_vs_opd/results/study.json): its cold-start
students (``cold_starts[*].student``, read, never written), the pilot's lr / warm-up, each cold
start's B and the far ``opd`` run's per-seed success. Parts (``--parts``, in the order given;
finished training runs under ``--out`` are reused):

* ``near_long``: from the near cold start, ``opd``, ``reopd_k0.6``, ``sft_cont``, ``reopd_k1``
  at N' updates (B from this ``opd`` run, the study's rule); rules (a) equal turns, (c), (d),
  (e), the MDE of each, and each method's change from the cold start;
* ``timing``: per cold start, ``opd`` (tool latency ``latency_s``), ``opd_lat0`` and ReOPD
  κ = 0.6 built in one process and stepped update by update in turn (K + 1 rounds), the pool
  collection C measured after the rounds in ``coll_after``; rule (b) from the medians (each
  cold start's ``events``: [round, run or "C", start s since its first round], in order);
* ``wall``: ``reopd_k0.6_wall`` from the far cold start with N_w = round(N × t_OPD / t_ReOPD)
  updates (t from ``timing``) against the study's far ``opd``: rule (a) at equal wall time.

Each part merges its results into ``<out>/addendum.json`` (atomic write) and the tables into
``<out>/addendum.md``. Bad input (no study JSON, an unknown part, ``wall`` before ``timing``):
one line, exit 2, nothing written.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import time
from pathlib import Path

from absl import flags

from prada_jax.distill import stepping, trainer
from prada_jax.distill.task.teacher import tiny_cache
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json
from prada_jax.stats import mean_ci, paired_mde
from studies import _shared
from studies import reopd_vs_opd as base
from studies.reopd_vs_opd import report as base_report
from studies._shared import fmt

PARTS = ("near_long", "timing", "wall")
NEAR_METHODS = ("opd", "reopd_k0.6", "sft_cont", "reopd_k1")
TIMED_RUNS = ("opd", "opd_lat0", "reopd_k0.6")   # the order of each interleaved round


@dataclasses.dataclass
class AddSizes:
    """The addendum's own sizes (``ADD_FULL`` = the pre-registered ones)."""

    near_updates: int = 100           # N': updates of every near_long method
    rounds: int = 21                  # K + 1 interleaved rounds (the first compiles)
    coll_after: tuple = (7, 14, 21)   # rounds after which C is measured
    wall_base: int = 20               # N of the equal-wall rule (the study's N)


ADD_FULL = AddSizes()
ADD_QUICK = AddSizes(near_updates=3, rounds=4, coll_after=(2, 3, 4), wall_base=3)


# ---------------------------------------------------------------------------- arithmetic
def timing_stats(costs: list[dict]) -> dict:
    """One interleaved run's numbers from its per-update cost records (``opd.cost_summary``'s
    ``per_update``: counts, ``rollout_s``/``scoring_s``/``update_s`` [s], ``timed``): over the
    timed updates with supervised turns, the median of rollout s per supervised turn, the
    study's ratio of sums, the median whole-update seconds t, mean turns per update, and the
    tool calls of every update."""
    timed = [c for c in costs if c.get("timed") and c["supervised_turns"] > 0]
    if not timed:
        return {"timed_updates": 0, "untimed_updates": len(costs),
                "rollout_s_per_turn_median": None, "rollout_s_per_turn_sum": None,
                "update_total_s_median": None, "turns_per_update_mean": None,
                "tool_calls": int(sum(c["tool_calls"] for c in costs))}
    per_turn = [c["rollout_s"] / c["supervised_turns"] for c in timed]
    total = [c["rollout_s"] + c["scoring_s"] + c["update_s"] for c in timed]
    turns = [c["supervised_turns"] for c in timed]
    return {"timed_updates": len(timed), "untimed_updates": len(costs) - len(timed),
            "rollout_s_per_turn_median": float(statistics.median(per_turn)),
            "rollout_s_per_turn_sum": float(sum(c["rollout_s"] for c in timed) / sum(turns)),
            "update_total_s_median": float(statistics.median(total)),
            "rollout_s_median": float(statistics.median(c["rollout_s"] for c in timed)),
            "turns_per_update_mean": float(sum(turns) / len(turns)),
            "tool_calls": int(sum(c["tool_calls"] for c in costs))}


def speed_interleaved(st: dict, coll_s: list[float], n_updates: int, n_seeds: int,
                      stat: str = "median") -> dict:
    """Rule (b) on interleaved timings ``st`` (:func:`timing_stats` of ``opd``, ``opd_lat0``,
    ``reopd_k0.6``), ``stat`` = "median" (the addendum's verdict statistic) or "sum" (the
    study's): OPD / ReOPD rollout s per supervised turn at the latency and at 0, and with the
    pool: C = median of ``coll_s`` [s] charged once to an ``n_updates``-update run of all seeds
    (its turns = ``n_updates`` × ReOPD's mean turns per update), and (no verdict) to every
    seed."""
    key = f"rollout_s_per_turn_{stat}"
    o, o0, r = (st[k][key] for k in TIMED_RUNS)
    C = float(statistics.median(coll_s)) if coll_s else None
    if None in (o, o0, r, C) or not r:   # a run without timed updates: no ratio, no verdict
        return {"statistic": stat, "opd": o, "opd_lat0": o0, "reopd": r, "C_s": C,
                "C_runs_s": list(coll_s), "reopd_turns_of_run": None, "ratio_latency": None,
                "ratio_lat0": None, "ratio_with_pool": None, "ratio_with_pool_per_seed": None,
                "verdict_rollout": "no timed update", "verdict_with_pool": "no timed update"}
    turns_run = n_updates * st["reopd_k0.6"]["turns_per_update_mean"]
    out = {"statistic": stat, "opd": o, "opd_lat0": o0, "reopd": r, "C_s": C,
           "C_runs_s": list(coll_s), "reopd_turns_of_run": turns_run,
           "ratio_latency": o / r, "ratio_lat0": o0 / r,
           "ratio_with_pool": o / (r + C / turns_run),
           "ratio_with_pool_per_seed": o / (r + C * n_seeds / turns_run)}
    out["verdict_rollout"] = ("pass" if out["ratio_latency"] >= base.SPEED_MIN
                              and out["ratio_lat0"] >= base.SPEED_MIN else "fail")
    out["verdict_with_pool"] = "pass" if out["ratio_with_pool"] > base.SPEED_MIN_POOL else "fail"
    return out


def n_wall(n: int, t_opd: float | None, t_reopd: float | None) -> int | None:
    """The equal-wall-time budget: round(n × t_opd / t_reopd), at least 1 (None without both
    times)."""
    if not t_opd or not t_reopd:
        return None
    return max(1, round(n * t_opd / t_reopd))


def moved(runs: dict, start: float) -> dict:
    """Each run's per-seed success minus the cold start's ``start`` (mean and 95% CI)."""
    return {k: {**mean_ci([x - start for x in r["success"]]).to_json_dict(), "start": start}
            for k, r in runs.items() if r.get("success")}


def with_mde(d: dict, runs: dict) -> dict:
    """A :func:`reopd_vs_opd.paired` dict with the MDE of its per-seed differences."""
    sa = dict(zip(runs[d["a"]]["seeds"], runs[d["a"]]["success"]))
    sb = dict(zip(runs[d["b"]]["seeds"], runs[d["b"]]["success"]))
    common = sorted(set(sa) & set(sb))
    mde = paired_mde([sa[k] for k in common], [sb[k] for k in common])
    return {**d, "mde": mde if mde == mde else None}


def near_verdicts(runs: dict) -> dict:
    a = with_mde(base.paired(runs, "reopd_k0.6", "opd"), runs)
    c = with_mde(base.paired(runs, "reopd_k0.6", "sft_cont"), runs)
    d = with_mde(base.paired(runs, "reopd_k0.6", "reopd_k1"), runs)
    calls = {k: runs[k]["tool_calls"] for k in runs if k.startswith("reopd")}
    e_ok = all(v == 0 for v in calls.values()) and runs["opd"]["tool_calls"] > 0
    return {"a_equal_turns": {**a, "verdict": base.noninferior(a, base.MARGIN)},
            "c_vs_sft": {**c, "verdict": base.superior(c)},
            "d_kappa": {**d, "verdict": base.noninferior(d, base.MARGIN)},
            "e_tool_calls": {"reopd": calls, "opd": runs["opd"]["tool_calls"],
                             "verdict": "pass" if e_ok else "fail"}}


# ---------------------------------------------------------------------------- the parts
class Addendum:
    def __init__(self, src: dict, cache: Path, out: Path, sizes: base.Sizes, asz: AddSizes):
        self.src, self.out, self.s, self.a = src, Path(out), sizes, asz
        self.study = base.Study(cache, self.out, sizes)
        self.cold = {c["name"]: c for c in src["cold_starts"]}
        self.B = {st["cold"]: int(st["B"]) for st in src["studies"]}
        self.choice = src["pilot"]["choice"]

    def _lr(self, mode: str) -> dict:
        return {"optim.lr": self.choice[mode]["lr"],
                "optim.warmup_steps": self.choice[mode]["warmup"]}

    def near_long(self) -> dict:
        cold = self.cold["near"]
        self.study.s = dataclasses.replace(self.s, updates=self.a.near_updates)
        try:
            st = self.study.study(cold, self.choice, methods=NEAR_METHODS, tag="near_long")
        finally:
            self.study.s = self.s
        start = float(cold["success_verdict_problems"])
        st.update(start_success=start, moved=moved(st["runs"], start),
                  verdicts=near_verdicts(st["runs"]))
        return st

    def _timing_configs(self, name: str, rounds: int) -> dict:
        s, init = self.s, self.cold[name]["student"]
        c = lambda variant, **f: base._config(   # noqa: E731
            self.study.cache, variant, s, rounds, s.seeds, s.eval_seed,
            **{"student.init": init, "eval.n_problems": 0, **f})
        opd = {"opd.episodes": s.episodes, **self._lr("opd")}
        return {"opd": c("opd", **opd, **{"opd.tool_latency_s": s.latency_s}),
                "opd_lat0": c("opd", **opd, **{"opd.tool_latency_s": 0.0}),
                "reopd_k0.6": c("onpolicy", **self._lr("reopd"),
                                **{"train.batch_size": self.B[name], "sampler.kappa": 0.6})}

    def timing(self) -> dict:
        out = {"load_avg_1min_start": os.getloadavg()[0], "rounds": self.a.rounds,
               "coll_after": list(self.a.coll_after), "cold": {}}
        for name in ("far", "near"):
            root = self.out / "timing" / name
            if root.exists():   # a timing is never resumed: each is one process's rounds
                shutil.rmtree(root)
            built = {k: stepping.open_run(
                         trainer.build_setup(c, teacher_score_fn=self.study.score_fn), root / k)
                     for k, c in self._timing_configs(name, self.a.rounds).items()}
            colls, events, t0 = [], [], time.perf_counter()
            try:
                for r in range(1, self.a.rounds + 1):
                    for k in built:
                        events.append([r, k, time.perf_counter() - t0])
                        built[k] = stepping.step(built[k], r - 1)
                    if r in self.a.coll_after:
                        events.append([r, "C", time.perf_counter() - t0])
                        colls.append(self.study.collection())
            finally:
                for run in built.values():
                    trainer.close_files(run.files)
            st = {k: {**timing_stats(run.host.costs),
                      "per_update": [dict(c) for c in run.host.costs]}
                  for k, run in built.items()}
            n_seeds = len(self.s.seeds)
            cs = [c["seconds"] for c in colls]
            res = {"B": self.B[name], "runs": st, "collections": colls, "events": events,
                   "wall_s": time.perf_counter() - t0,
                   "b_speed": speed_interleaved(st, cs, self.a.wall_base, n_seeds, "median"),
                   "b_speed_sum": speed_interleaved(st, cs, self.a.wall_base, n_seeds, "sum"),
                   "t_opd_s": st["opd"]["update_total_s_median"],
                   "t_reopd_s": st["reopd_k0.6"]["update_total_s_median"]}
            res["N_wall"] = n_wall(self.a.wall_base, res["t_opd_s"], res["t_reopd_s"])
            b, f = res["b_speed"], fmt
            self.study.say(f"timing {name}: OPD/ReOPD {f(b['ratio_latency'], 2)}x, lat0 "
                           f"{f(b['ratio_lat0'], 2)}x, with pool {f(b['ratio_with_pool'], 2)}x "
                           f"(C {f(b['C_s'], 1)} s); N_w {res['N_wall']}")
            out["cold"][name] = res
        out["load_avg_1min_end"] = os.getloadavg()[0]
        return out

    def wall(self, timing: dict) -> dict:
        s, cold = self.s, self.cold["far"]
        far = timing["cold"]["far"]
        nw = n_wall(self.a.wall_base, far["t_opd_s"], far["t_reopd_s"])
        if nw is None:
            raise BadInput("--parts: wall needs timed updates of opd and reopd_k0.6 in the "
                           "timing part (it has none)")
        c = base._config(self.study.cache, "onpolicy", s, nw, s.seeds, s.eval_seed,
                         **{"student.init": cold["student"], "train.batch_size": self.B["far"],
                            "sampler.kappa": 0.6}, **self._lr("reopd"))
        t0 = time.perf_counter()
        res = self.study.train("far/reopd_k0.6_wall", c)
        secs = time.perf_counter() - t0
        wall = base._summary(res)
        per = base._per_seed(res)[0]["cost"]["per_update"]
        wall["train_s_sum"] = float(sum(u["rollout_s"] + u["scoring_s"] + u["update_s"]
                                        for u in per))
        opd = next(st for st in self.src["studies"] if st["cold"] == "far")["runs"]["opd"]
        runs = {"opd": opd, "reopd_k0.6_wall": wall}
        a = with_mde(base.paired(runs, "reopd_k0.6_wall", "opd"), runs)
        return {"N": self.a.wall_base, "N_wall": nw, "t_opd_s": far["t_opd_s"],
                "t_reopd_s": far["t_reopd_s"], "call_s": secs,
                "opd_budget_s": self.a.wall_base * far["t_opd_s"], "run": wall,
                "a_equal_wall": {**a, "verdict": base.noninferior(a, base.MARGIN)}}


# ---------------------------------------------------------------------------- report
def markdown(res: dict) -> str:
    f, pd = fmt, base_report.paired_cell
    L = ["# ReOPD vs online OPD — addendum tables (SYNTHETIC)", ""]
    if "timing" in res:
        t = res["timing"]
        L += [f"## (A) Interleaved timing ({t['rounds']} rounds; load average "
              f"{t['load_avg_1min_start']:.2f} → {t['load_avg_1min_end']:.2f})", "",
              "| cold start | run | timed updates | rollout s / turn (median) | (sum ratio) | "
              "median s / update | turns / update | tool calls |",
              "|---|---|---|---|---|---|---|---|"]
        for name, c in t["cold"].items():
            for k, r in c["runs"].items():
                L.append(f"| {name} | {k} | {r['timed_updates']} | "
                         f"{f(r['rollout_s_per_turn_median'], 6)} | "
                         f"{f(r['rollout_s_per_turn_sum'], 6)} | "
                         f"{f(r['update_total_s_median'], 3)} | "
                         f"{f(r['turns_per_update_mean'], 1)} | {r['tool_calls']} |")
        L += ["", "| cold start | statistic | OPD/ReOPD at latency | at 0 | verdict ≥ 4 both | "
              "with pool (C median) | verdict > 2 | C per seed (no verdict) | C runs [s] | N_w |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for name, c in t["cold"].items():
            for key in ("b_speed", "b_speed_sum"):
                b = c[key]
                L.append(f"| {name} | {b['statistic']} | {f(b['ratio_latency'], 2)}× | "
                         f"{f(b['ratio_lat0'], 2)}× | **{b['verdict_rollout']}** | "
                         f"{f(b['ratio_with_pool'], 2)}× (C {f(b['C_s'], 1)} s) | "
                         f"**{b['verdict_with_pool']}** | "
                         f"{f(b['ratio_with_pool_per_seed'], 2)}× | "
                         f"{', '.join(f(x, 1) for x in b['C_runs_s'])} | "
                         f"{c['N_wall'] if key == 'b_speed' else ''} |")
    if "wall" in res:
        w = res["wall"]
        r = w["run"]
        L += ["", f"## (B) Far equal wall time: N_w = round({w['N']} × {f(w['t_opd_s'], 3)} / "
              f"{f(w['t_reopd_s'], 3)}) = {w['N_wall']}", "",
              f"reopd_k0.6_wall: success {mean_ci(r['success']).fmt()}, "
              f"{r['totals']['supervised_turns'] / len(r['seeds']):.0f} supervised turns / seed, "
              f"{r['tool_calls']} tool calls, its own update seconds {f(r['train_s_sum'], 1)} s "
              f"(OPD's budget {w['N']} × t_OPD = {f(w['opd_budget_s'], 1)} s); "
              f"(a) at equal wall time: {pd(w['a_equal_wall'])}, MDE "
              f"{f(w['a_equal_wall']['mde'])}: **{w['a_equal_wall']['verdict']}**"]
    if "near_long" in res:
        n = res["near_long"]
        L += ["", f"## (C) Near cold start at N' = {n['N']} updates (B = {n['B']})", "",
              "| method | success (mean ± 95% CI) | change from the start (CI) | final c̄ | "
              "supervised turns / seed | tool calls |", "|---|---|---|---|---|---|"]
        ns = len(n["runs"]["opd"]["seeds"])
        for k, r in n["runs"].items():
            m = n["moved"][k]
            L.append(f"| {k} | {mean_ci(r['success']).fmt()} | {f(m['mean'])} "
                     f"[{f(m['ci_low'])}, {f(m['ci_high'])}] | {base_report.run_cells(r, ns)} |")
        v = n["verdicts"]
        L += ["", "| rule | numbers | MDE | verdict |", "|---|---|---|---|"]
        for key, label in (("a_equal_turns", "(a) ReOPD ≥ OPD − 0.02, equal turns"),
                           ("c_vs_sft", "(c) ReOPD > SFT continuation"),
                           ("d_kappa", "(d) κ = 0.6 ≥ κ = 1 − 0.02")):
            L.append(f"| {label} | {pd(v[key])} | {f(v[key]['mde'])} | "
                     f"**{v[key]['verdict']}** |")
        e = v["e_tool_calls"]
        L.append(f"| (e) 0 tool calls in ReOPD | ReOPD {sorted(set(e['reopd'].values()))}, "
                 f"OPD {e['opd']} | — | **{e['verdict']}** |")
    return "\n".join(L) + "\n"


def quick_source(out: Path) -> tuple[dict, Path]:
    """A tiny stand-in for the study's JSON (``--quick``): a tiny cache, the quick cold
    starts and the far ``opd`` run at the quick sizes (fixed lr 1e-3, no warm-up)."""
    cache = out / "cache"
    if not (cache / "pool").is_dir():
        out.mkdir(parents=True, exist_ok=True)
        tiny_cache(cache, 12)
    study = base.Study(cache, out / "source", base.QUICK)
    colds = study.cold_starts()
    choice = {m: {"lr": 1e-3, "warmup": 0} for m in ("opd", "reopd")}
    far = study.study(colds[0], choice, methods=("opd",))
    studies = [{"cold": "far", "B": far["B"], "runs": far["runs"]},
               {"cold": "near", "B": far["B"], "runs": {}}]
    return {"cold_starts": colds, "pilot": {"choice": choice}, "studies": studies,
            "sizes": dataclasses.asdict(base.QUICK)}, cache


def run(src: dict, cache: Path, out: Path, parts: tuple, sizes: base.Sizes,
        asz: AddSizes) -> dict:
    """Runs ``parts`` in order, merging each into ``<out>/addendum.json``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "addendum.json"
    res = read_json(path) if path.exists() else {
        "synthetic": True, "sizes": dataclasses.asdict(sizes),
        "addendum_sizes": dataclasses.asdict(asz), "log": []}
    add = Addendum(src, cache, out, sizes, asz)

    def one(part: str) -> dict:
        if part == "near_long":
            return add.near_long()
        return add.timing() if part == "timing" else add.wall(res["timing"])
    return _shared.run_parts(res, parts, one, add.study, path, out / "addendum.md", markdown)


def _define(fv) -> None:
    """The study's flags (``studies.reopd_vs_opd``) and the addendum's own."""
    base._define(fv)
    flags.DEFINE_string("study_json", "", "the study's per-seed JSON (cold starts, pilot "
                        "choice, B, the far opd run)", flag_values=fv)
    flags.DEFINE_list("parts", [], "parts to run, in order (near_long, timing, wall); empty "
                      "= all", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags; None = the command line. Bad input raises ``BadInput`` before
    anything is written."""
    a = _shared.parse(_define, argv, "studies.reopd_vs_opd.addendum", __doc__)
    parts = tuple(a.parts) or PARTS
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise BadInput(f"--parts: unknown part {bad[0]!r}; choose from {list(PARTS)}")
    out = Path(a.out)
    if ("wall" in parts and "timing" not in parts[:parts.index("wall")]
            and "timing" not in _stored(out)):
        raise BadInput(f"--parts: wall needs the timing part's results ({out / 'addendum.json'} "
                       "has none; run --parts=timing first)")
    if a.quick:
        if a.cache or a.study_json:
            raise BadInput("--cache: not with --quick (it builds its own tiny cache and study)")
        src, cache = quick_source(out)
        sizes, asz = base.QUICK, ADD_QUICK
    else:
        if not a.study_json:
            raise BadInput("--study_json: required (the study's per-seed JSON)")
        try:
            src = read_json(a.study_json)
            {c["name"]: c["student"] for c in src["cold_starts"]}
            {st["cold"]: st["B"] for st in src["studies"]}
            src["pilot"]["choice"]["opd"]["lr"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BadInput(f"--study_json: not a study JSON ({a.study_json}: {e})") from None
        cache = Path(a.cache)
        _shared.check_cache(cache)
        ss = src["sizes"]
        sizes = dataclasses.replace(base.FULL, seeds=tuple(ss["seeds"]), updates=ss["updates"],
                                    episodes=ss["episodes"], latency_s=ss["latency_s"],
                                    n_eval=ss["n_eval"], eval_seed=ss["eval_seed"])
        asz = dataclasses.replace(ADD_FULL, wall_base=int(ss["updates"]))
    res = run(src, cache, out, parts, sizes, asz)
    print((out / "addendum.md").read_text())
    print(f"{out / 'addendum.json'}: parts {[p for p in PARTS if p in res]}")
    return 0


def _stored(out: Path) -> dict:
    try:
        return read_json(out / "addendum.json")
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    from prada_jax import cli as _cli
    _cli.run_local(main)
