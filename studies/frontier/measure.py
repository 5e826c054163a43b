"""The frontier study's measurements (registration: ``studies/frontier/README.md``): the knob
rows of every method, phase A (validation, light load), phase B (test, light load), the
bisections of phase C and the latency rates, each row by ``evals.evaluate``'s measurement on
the serving server of one pair (``evals.capacity.measure``'s env: M, B, the window).

A *row* is an ``evals.evaluate.PolicySpec``; a PRADA row carries its policy sample in its
name (``... #k``) and runs with that sample's parameters. Every row of one split runs on the
same evaluation seeds (paired comparisons). Server-seconds per user is the offered server
load over the window divided by the window's arrivals: ρ · window seconds / arrivals, per seed
(GPU-seconds a user asks of the one server GPU, ``server_s_per_user``).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from envs import edge
from evals import capacity as cap
from evals import evaluate as ev
from evals import knobs, suite
from evals.capacity import measure as cm

LLM_ALONE, ALL_SLM = cm.LLM_ALONE, cm.ALL_SLM
#: Method of a row (what the selection rule groups by); PRADA per sample.
PRADA, RANDOM, RSD, ORACLE = "PRADA", "Random", "RSD", "Oracle"
#: The no-cache ablation's env overrides (envs.edge: every offload / PRM pass re-prefills).
NO_CACHE = {"server_kv_cache": False, "prm_prefix_cache": False}
#: The accuracy clause the registration names (``evals.capacity``'s pooled rule as it stood:
#: issue 51's share-weighted cells, since renamed ``POOLED_SHARES``; the README's caveat).
ACCURACY_RULE = cap.POOLED_SHARES


class Sizes(NamedTuple):
    """One run's sizes. ``light_rate`` [users/s per GPU] of phases A and B; ``seeds`` (test:
    phases B, C and the latency rates) and ``val_seeds`` (phase A); the window (``slots``,
    ``warmup``, ``drain``); the server's ``num_servers`` (M) and the cell's ``bandwidth_hz``;
    the bisection ``bracket`` [lo, hi] and ``resolution``; the knob grids (``shares``: the
    target offload shares PRADA's θ and m grids aim at; ``random_ps``; ``rsd_taus``;
    ``oracle_ks``, None = unlimited); ``retentions`` r; ``latency_rates``; the policy
    samples' size and seeds."""
    light_rate: float
    seeds: int
    val_seeds: int
    slots: int
    warmup: int
    drain: int
    num_servers: int
    bandwidth_hz: float
    bracket: tuple
    resolution: float
    shares: tuple
    random_ps: tuple
    rsd_taus: tuple
    oracle_ks: tuple
    retentions: tuple
    latency_rates: tuple
    policy_size: str
    samples: tuple


def capacity_sizes(s: Sizes) -> cm.Sizes:
    """The ``evals.capacity.measure.Sizes`` of the same window (its ``Grid`` and env)."""
    return cm.Sizes((float(s.light_rate),), s.slots, s.warmup, s.drain, s.seeds, s.val_seeds,
                    s.num_servers, s.bandwidth_hz, s.policy_size, tuple(s.samples))


def sample_name(name: str, k: int) -> str:
    return f"{name} #{int(k)}"


def split_sample(row: str) -> tuple[str, int | None]:
    """``("PRADA θ=+0.01", 0)`` from ``"PRADA θ=+0.01 #0"``; a baseline: ``(row, None)``."""
    if " #" in row:
        name, k = row.rsplit(" #", 1)
        if k.isdigit():
            return name, int(k)
    return row, None


def method_of(row: str) -> str:
    """The method a row belongs to (``LLM_ALONE``, ``ALL_SLM``, ``PRADA``, ``RANDOM``,
    ``RSD``, ``ORACLE``)."""
    name, _ = split_sample(row)
    for m in (PRADA, RANDOM, RSD, ORACLE):
        if name.startswith(m + " "):
            return m
    return name


def spec_json(spec: ev.PolicySpec) -> dict:
    return {k: getattr(spec, k) for k in ev.PolicySpec._fields}


def spec_from_json(d: Mapping) -> ev.PolicySpec:
    return ev.PolicySpec(**{k: d[k] for k in ev.PolicySpec._fields if k in d})


def baseline_specs(sizes: Sizes) -> list[ev.PolicySpec]:
    """LLM alone, All-SLM, random p, RSD τ, oracle k (no policy needed)."""
    rows = [ev.PolicySpec(LLM_ALONE, "always", "offload_all"),
            ev.PolicySpec(ALL_SLM, "never", "keep_local")]
    rows += knobs.knob_specs("random", sizes.random_ps)
    rows += knobs.knob_specs("rsd", sizes.rsd_taus)
    rows += knobs.knob_specs("oracle", list(sizes.oracle_ks))
    return rows


def prada_specs(thetas: Mapping[str, Sequence[float]], k: int) -> list[ev.PolicySpec]:
    """Sample ``k``'s PRADA rows: the critic's θ and the actor's margin m (``thetas``:
    ``{"prada": [θ], "prada_actor": [m]}``), threshold scheduler at λ = µ = 0, named with the
    sample."""
    out = []
    for method in ("prada", "prada_actor"):
        for s in knobs.knob_specs(method, list(thetas[method]), scheduler="threshold"):
            out.append(s._replace(name=sample_name(s.name, k)))
    return out


class Split:
    """One split of one pair: its traces, env keywords, seeds, and an evaluator per U
    (``evals.capacity.measure.Grid``'s U: ``suite.users_for`` of the rate and the timeout,
    bucketed to powers of two above 64 so a bisection compiles once per bucket)."""

    def __init__(self, policy, pair: str, sizes: Sizes, split: str, seeds: int,
                 overrides: Mapping | None = None):
        self.sizes, self.seeds = sizes, int(seeds)
        self.loaded = cm.load_split(policy, split)
        kw = dict(cm.env_kwargs(policy, pair, capacity_sizes(sizes)), **(overrides or {}))
        self.grid = cm.Grid(self.loaded.traces, kw, capacity_sizes(sizes), policy.apply_fn,
                            suite.evaluation_seed0(self.loaded.info, policy, self.seeds),
                            self.seeds, bucketed=True)
        self.apply_fn = policy.apply_fn
        self._evals: dict[int, ev.Evaluator] = {}

    @property
    def window_s(self) -> float:
        return (self.sizes.slots - self.sizes.warmup) * float(self.grid.env_kw["tau_s"])

    def evaluator(self, rate: float) -> ev.Evaluator:
        params = self.grid.params(rate)
        e = self._evals.get(params.num_users)
        if e is None:
            s = self.sizes
            e = self._evals[params.num_users] = ev.Evaluator(
                params, self.seeds, s.slots, s.warmup, self.apply_fn, None,
                seed0=self.grid.seed0, drain_slots=s.drain)
        e.base_params = params
        return e

    def run(self, spec: ev.PolicySpec, rate: float, net_params) -> dict:
        """Per-seed metrics (lists) of ``spec`` at ``rate`` with ``server_s_per_user``."""
        e = self.evaluator(rate)
        suite.check_fits(self.seeds, e.base_params.num_users)
        e.net_params = net_params
        over = dict(suite.LLM_ONLY_OVERRIDES) if spec.name == LLM_ALONE else {}
        m = e.run(spec, **over)
        rec = {k: [float(x) for x in np.asarray(v, np.float64)] for k, v in m.items()}
        rec["server_s_per_user"] = server_seconds(rec, self.window_s)
        return rec


def server_seconds(rec: Mapping, window_s: float) -> list[float]:
    """[S] server GPU-seconds per user: ρ · window_s / arrivals (the offered load over the
    window, a blocked arrival counted as asking as much as an admitted one, per arrival)."""
    rho = np.asarray(rec["rho"], np.float64)
    n = np.asarray(rec["arrivals"], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(n > 0, rho * float(window_s) / np.maximum(n, 1e-300), np.nan)
    return [float(x) for x in v]


def pool_accuracy(policy, split: str) -> dict:
    """The LLM alone's exact accuracy over ``split``'s problems (``envs.edge.llm_path``; the
    arrivals draw problems uniformly), from the traces: the retention anchor."""
    tr = cm.load_split(policy, split)
    t = tr.traces
    correct = np.asarray(edge.llm_path(t).correct, np.float64)
    return {"llm_alone_accuracy": float(np.mean(correct[np.asarray(t.root)])),
            "problems": int(np.asarray(t.root).size), "split": split}


def theta_grids(policies, pair: str, sizes: Sizes) -> dict:
    """Per sample, the θ (critic ΔQ) and m (actor margin) values aimed at ``sizes.shares``
    on the **validation** traces (``evals.knobs.theta_grid``; the same values run on test):
    ``{k: {"prada": [θ], "prada_actor": [m], "predicted": {...}}}``."""
    out = {}
    for k, pol in zip(sizes.samples, policies):
        sp = Split(pol, pair, sizes, "validation", 1)
        params = sp.grid.params(sizes.light_rate)
        rec = {"predicted": {}}
        for method in ("prada", "prada_actor"):
            scores = knobs.node_scores(pol.apply_fn, pol.params, params, method)
            th, pred = knobs.theta_grid(params.traces, scores, sizes.shares)
            rec[method] = [float(x) for x in th]
            rec["predicted"][method] = [float(x) for x in pred]
        out[str(k)] = rec
    return out


def light_rows(policies, pair: str, sizes: Sizes, split: str, thetas: Mapping,
               log=print, done: Mapping | None = None, save: Callable | None = None) -> dict:
    """Every knob row at ``sizes.light_rate`` on ``split`` (phase A: validation,
    ``val_seeds``; phase B: test, ``seeds``): ``{"rows": {row: {"spec", "record"}},
    "window_s"}``. ``done``: rows already measured (a resumed part), ``save(partial)`` is
    called after each row."""
    seeds = sizes.val_seeds if split == "validation" else sizes.seeds
    sp = Split(policies[0], pair, sizes, split, seeds)
    out = {"rows": dict((done or {}).get("rows", {})), "window_s": sp.window_s}
    todo = [(s, policies[0].params) for s in baseline_specs(sizes)]
    for k, pol in zip(sizes.samples, policies):
        todo += [(s, pol.params) for s in prada_specs(thetas[str(k)], k)]
    for spec, params in todo:
        if spec.name in out["rows"]:
            continue
        rec = sp.run(spec, sizes.light_rate, params)
        out["rows"][spec.name] = {"spec": spec_json(spec), "record": rec}
        log(f"  [{pair}] {split} λ={sizes.light_rate:g}/s {spec.name}: acc "
            f"{np.nanmean(rec['accuracy']):.3f} share {np.nanmean(rec['offload_rate']):.3f} "
            f"server-s/user {np.nanmean(rec['server_s_per_user']):.4f}")
        if save is not None:
            save(out)
    return out


def matched_random(policies, pair: str, sizes: Sizes, targets: Mapping[str, float],
                   log=print) -> dict:
    """Random screening matched to each target offload share (test, light load, the same
    seeds as phase B; ``evals.evaluate.matched_random_probability``: one correction pass):
    ``{name: {"target", "p", "record"}}`` for ``targets`` ``{name: share}``."""
    sp = Split(policies[0], pair, sizes, "test", sizes.seeds)
    e = sp.evaluator(sizes.light_rate)
    e.net_params = policies[0].params
    out = {}
    for name, target in targets.items():
        p, res = ev.matched_random_probability(e, float(target))
        rec = {k: [float(x) for x in np.asarray(v, np.float64)] for k, v in res.items()}
        rec["server_s_per_user"] = server_seconds(rec, sp.window_s)
        out[name] = {"target": float(target), "p": float(p), "record": rec}
        log(f"  [{pair}] random matched to {name} (share {target:.3f}): p {p:.3f}, acc "
            f"{np.nanmean(rec['accuracy']):.3f}")
    return out


class Prober:
    """Measures (row, rate) probes on test once each, keeping every probe's per-seed record
    in ``probes`` ``{row: {rate: record}}`` (``save(probes)`` after each new one), so the
    bisections at every r and the latency rates share them and a killed run resumes."""

    def __init__(self, policies, pair: str, sizes: Sizes, specs: Mapping[str, ev.PolicySpec],
                 probes: Mapping | None = None, save: Callable | None = None,
                 overrides: Mapping | None = None, log=print):
        self.sizes, self.pair, self.specs, self.log = sizes, pair, dict(specs), log
        self.params = {str(k): p.params for k, p in zip(sizes.samples, policies)}
        self.split = Split(policies[0], pair, sizes, "test", sizes.seeds, overrides)
        self.probes = {r: dict(v) for r, v in (probes or {}).items()}
        self.save = save

    def __call__(self, row: str, rate: float) -> dict:
        rec = self.probes.setdefault(row, {})
        key = f"{float(rate):g}"
        if key not in rec:
            _, k = split_sample(row)
            params = self.params[str(k if k is not None else self.sizes.samples[0])]
            rec[key] = self.split.run(self.specs[row], float(rate), params)
            self.log(f"  [{self.pair}] probe {row} at {float(rate):g}/s: ρ "
                     f"{np.nanmean(rec[key]['rho']):.2f} p90 "
                     f"{np.nanmean(rec[key]['latency_p90_s']):.2f} s acc "
                     f"{np.nanmean(rec[key]['accuracy']):.3f}")
            if self.save is not None:
                self.save(self.probes)
        return rec[key]


def bisect(prober: Prober, rows: Sequence[str], slos: Mapping[str, cap.SLO],
           bracket: Sequence[float], resolution: float, log=print) -> dict:
    """Each row's capacity at each SLO (``{r: SLO}``) by ``evals.capacity.bisect_capacity``
    on ``bracket``; probes shared through ``prober``: ``{r: {row: {"capacity", "censored",
    "bracket", "probed"}}}``."""
    lo, hi = float(bracket[0]), float(bracket[1])
    out: dict[str, dict] = {}
    for row in rows:
        for r, slo in slos.items():
            def measure(rate, row=row):
                return prober(row, float(f"{rate:g}"))
            b = cap.bisect_capacity(measure, slo, lo, hi, resolution, ACCURACY_RULE)
            out.setdefault(r, {})[row] = {
                "capacity": b["capacity"], "censored": b["censored"], "bracket": b["bracket"],
                "probed": [f"{p.rate:g}" for p in b["probes"]]}
            log(f"  [{prober.pair}] r={r} {row}: capacity {b['capacity']:g} "
                f"(bracket {b['bracket'][0]:g}–{b['bracket'][1]:g})")
    return out


def bracket_of(sizes: Sizes, pair: str) -> tuple[float, float]:
    """The registered bracket: ``sizes.bracket``, its top doubled for an H100 server (the
    LLM alone is not contended below 64/s there: studies/capacity)."""
    lo, hi = (float(x) for x in sizes.bracket)
    if pair.startswith("h100") and sizes.bracket == STUDY_BRACKET:
        hi = 2.0 * hi
    return lo, hi


#: The study size's bracket (the H100 pair's top is doubled: ``bracket_of``).
STUDY_BRACKET = (4.0, 64.0)


def finite_mean(x) -> float:
    a = np.asarray(x, np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan
