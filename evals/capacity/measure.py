"""Capacity measurements (``studies/capacity`` registers the study that uses them): the SLO's
reference run, the per-operating-point price fit on validation and the test grid.

Every point is ``evals.evaluate``'s measurement on the serving server; all rows of one rate
run in one vmapped call (``evals.curve.make_curve_fn``), compiled once per (split, U) and
shared by the policy samples (one network architecture, so one ``apply_fn``). The bisection
(``bisect_rows``) measures one row per call at rates of its own choosing; its U is the
power-of-two bucket above ``suite.users_for`` (``Grid(bucketed=True)``), so a bisection
compiles once per (split, U bucket, rows per call): at most five U buckets between 4 and
64 users/s at the study's timeout, never one compile per probed rate. ``test_pool`` is the
reference's exact test-pool accuracy, from the traces.
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from envs import edge
from evals import capacity as cap
from evals import curve, suite
from evals import evaluate as ev
from prada_jax.errors import BadInput

LLM_ALONE = curve.LLM_ALONE
ALL_SLM, RSD = "All-SLM", "RSD (online PRM)"
FITTED, ZERO = "PRADA (fitted prices)", "PRADA (λ=µ=0)"
#: The registered admission-price grid of the per-point fit (1000: every nomination refused).
PRICE_GRID = (0.0, 0.01, 0.03, 0.1, 0.3, 1000.0)


class Sizes(NamedTuple):
    """One run's sizes: ``rates`` [users/s per GPU], the window (``slots``, ``warmup``,
    ``drain``: the timeout is drain·τ), test ``seeds``, validation ``val_seeds``, the server's
    sequences ``num_servers`` (one GPU), the cell's ``bandwidth_hz``, the policy samples'
    size (``train.policy_samples.SIZES``) and their PPO seeds."""
    rates: tuple
    slots: int
    warmup: int
    drain: int
    seeds: int
    val_seeds: int
    num_servers: int
    bandwidth_hz: float
    policy_size: str
    samples: tuple


def sample_row(name: str, k: int) -> str:
    return f"{name} #{k}"


def baseline_rows() -> list[ev.PolicySpec]:
    return [r for r in curve.curve_rows(None) if r.screen != "policy"]


class Grid:
    """Evaluates rows at one arrival rate on one split of one pair: the env at that rate with
    U sized for it (``suite.users_for``: the rate and the timeout), one compiled
    ``curve_fn`` per (split, U)."""

    def __init__(self, traces, env_kw: dict, sizes: Sizes, apply_fn: Callable, seed0: int,
                 seeds: int, bucketed: bool = False):
        self.traces, self.env_kw, self.sizes = traces, dict(env_kw), sizes
        self.apply_fn, self.seed0, self.seeds = apply_fn, seed0, seeds
        self.bucketed = bool(bucketed)
        self._fns: dict[int, Callable] = {}

    def users(self, rate: float) -> int:
        """U at ``rate``: ``suite.users_for`` (the rate and the timeout), or with ``bucketed``
        the smallest 64 · 2^k at least that (one compile per bucket, ≤ 2× the slots)."""
        u = suite.users_for(rate, self.sizes.drain * float(self.env_kw["tau_s"]))
        if not self.bucketed or u <= 64:
            return u
        return 64 * 2 ** math.ceil(math.log2(u / 64))

    def compiles(self) -> dict[str, int]:
        """``{U: compilations of its curve function}`` so far (one per rows-per-call shape)."""
        return {str(u): int(f._cache_size()) for u, f in sorted(self._fns.items())}

    def params(self, rate: float) -> edge.EnvParams:
        kw = dict(self.env_kw, num_users=self.users(rate), arrival_rate_hz=float(rate))
        return edge.make_params(self.traces, **kw)

    def run(self, rate: float, rows: Sequence[ev.PolicySpec], net_params) -> dict:
        """``{row name: {metric: [S]}}`` of ``rows`` at ``rate``."""
        s = self.sizes
        params = self.params(rate)
        suite.check_fits(len(rows) * self.seeds, params.num_users, drain_slots=s.drain)
        e = ev.Evaluator(params, self.seeds, s.slots, s.warmup, self.apply_fn, net_params,
                         seed0=self.seed0, drain_slots=s.drain)
        fn = self._fns.get(params.num_users)
        if fn is None:
            fn = self._fns[params.num_users] = curve.make_curve_fn(e.evaluate_fn)
        load = float(rate) / float(params.num_servers)
        return curve.run_curve(e, rows, [load], curve_fn=fn)[load]


def env_kwargs(policy, pair: str, sizes: Sizes) -> dict:
    """The study's env: the policy run's β and τ, the serving server of ``pair`` with
    ``sizes``' M and B (``suite.env_kwargs_from``; U and λ are set per rate)."""
    suite.check_hardware(pair, "--pairs")
    kw = suite.env_kwargs_from(policy.config, {"hardware": pair, "server_model": "serving",
                                               "num_servers": sizes.num_servers,
                                               "bandwidth_hz": sizes.bandwidth_hz})
    if kw["server_model"] != "serving":
        raise BadInput(f"--pairs={pair}: the capacity study needs the serving server")
    return kw


def load_split(policy, split: str):
    spec, problems, seed = suite.resolve_traces(policy, None, None, None)
    return suite.load_traces(spec, problems, seed, split=split)


def env_fingerprint(policies, pair: str, sizes: Sizes) -> dict:
    """What the env every part runs resolves to, for the parts' cache keys: the test split's
    trace set (``info``) and the sha256 of every ``EnvParams`` leaf outside the traces at the
    lightest rate (the server model, its prefix cache and every other default ``make_params``
    fills in), so a changed default is measured again rather than reused."""
    p0 = policies[0]
    tr = load_split(p0, "test")
    g = Grid(tr.traces, env_kwargs(p0, pair, sizes), sizes, p0.apply_fn, 0, 1)
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(g.params(sizes.rates[0]))[0]:
        name = jax.tree_util.keystr(path)
        if name.startswith(".traces"):
            continue
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return {"traces": {k: tr.info[k] for k in ("source", "trace_seed", "split", "problems",
                                               "problems_total") if k in tr.info},
            "params_sha256": h.hexdigest()}


def test_pool(policies) -> dict:
    """The reference's exact test-pool accuracy: the LLM alone's correctness
    (``envs.edge.llm_path``) averaged over the test problems, uniform over problems as the
    arrivals draw them; with the trace set it was computed on."""
    tr = load_split(policies[0], "test")
    t = tr.traces
    correct = np.asarray(edge.llm_path(t).correct, np.float64)
    acc = float(np.mean(correct[np.asarray(t.root)]))
    return {"llm_alone_accuracy": acc, "problems": int(np.asarray(t.root).size),
            "traces": {k: tr.info[k] for k in ("source", "trace_seed", "split", "problems",
                                               "problems_total") if k in tr.info}}


def reference_run(policies, pair: str, sizes: Sizes) -> dict:
    """The SLO's reference: the LLM alone at the lightest rate on validation (per seed)."""
    p0 = policies[0]
    tr = load_split(p0, "validation")
    seed0 = suite.evaluation_seed0(tr.info, p0, sizes.val_seeds)
    g = Grid(tr.traces, env_kwargs(p0, pair, sizes), sizes, p0.apply_fn, seed0,
             sizes.val_seeds)
    llm = next(r for r in baseline_rows() if r.name == LLM_ALONE)
    return _lists(g.run(sizes.rates[0], [llm], p0.params)[LLM_ALONE])


def fit_prices(policies, pair: str, sizes: Sizes, log=print) -> dict:
    """Per rate and policy sample, the grid price λ_s (µ = 0) with the best mean validation
    objective: ``{rate: {sample: {"lambda_s", "mu", "objective": {price: mean}}}}``."""
    p0 = policies[0]
    tr = load_split(p0, "validation")
    seed0 = suite.evaluation_seed0(tr.info, p0, sizes.val_seeds)
    g = Grid(tr.traces, env_kwargs(p0, pair, sizes), sizes, p0.apply_fn, seed0,
             sizes.val_seeds)
    out = {}
    for rate in sizes.rates:
        out[str(rate)] = {str(k): fit_price(g, rate, pol.params)
                          for k, pol in zip(sizes.samples, policies)}
        log(f"  [{pair}] prices at λ = {rate:g}/s: " + ", ".join(
            f"#{k} λ_s={v['lambda_s']:g}" for k, v in out[str(rate)].items()))
    return out


def fit_price(g: Grid, rate: float, net_params) -> dict:
    """One sample's grid price λ_s (µ = 0) at ``rate`` on ``g``'s (validation) split: the
    best mean objective over ``PRICE_GRID``, ties to the lower price."""
    rows = [ev.PolicySpec(f"λ_s={lam:g}", "policy", "threshold", lam, 0.0)
            for lam in PRICE_GRID]
    res = g.run(rate, rows, net_params)
    obj = {r.name: float(np.nanmean(res[r.name]["objective"])) for r in rows}
    best = max(rows, key=lambda r: (obj[r.name], -r.lambda_s))   # ties: the lower
    return {"lambda_s": best.lambda_s, "mu": 0.0, "objective": obj,
            "link_binds": float(np.nanmean(res[best.name]["uplink_bound_share"]))}


def bisect_rows(policies, pair: str, sizes: Sizes, slos: Mapping[str, cap.SLO],
                resolution: float = cap.RESOLUTION, log=print,
                rows: Sequence[str] | None = None) -> dict:
    """Each row's capacity by bisection on the rate (``evals.capacity.bisect_capacity``)
    between ``sizes.rates[0]`` and ``sizes.rates[-1]``, once per SLO of ``slos`` (``{anchor:
    SLO}``), on test; a PRADA (fitted) probe first fits its price at that rate on validation
    (``fit_price``). Probes are shared between the SLOs (a rate measured once per row).
    ``rows``: the row names to bisect (default: the baselines and every sample's PRADA rows).
    Returns ``{"resolution", "bracket", "probes": {row: {rate: {metric: [S]}}}, "prices":
    {rate: {sample: fit}}, "by_slo": {anchor: {row: {"capacity", "censored", "bracket",
    "probed": [rates in probe order]}}}}``: every probe's per-seed records, so an analysis can
    recompute the capacities."""
    p0 = policies[0]
    kw = env_kwargs(p0, pair, sizes)
    te = load_split(p0, "test")
    va = load_split(p0, "validation")
    g = Grid(te.traces, kw, sizes, p0.apply_fn,
             suite.evaluation_seed0(te.info, p0, sizes.seeds), sizes.seeds, bucketed=True)
    gv = Grid(va.traces, kw, sizes, p0.apply_fn,
              suite.evaluation_seed0(va.info, p0, sizes.val_seeds), sizes.val_seeds,
              bucketed=True)
    base = {r.name: r for r in baseline_rows()}
    probes: dict[str, dict] = {}
    prices: dict[str, dict] = {}

    def spec_of(row: str, rate: float):
        if row in base:
            return base[row], p0.params
        name, k = row.rsplit(" #", 1)
        pol = policies[list(sizes.samples).index(int(k))]
        if name == ZERO:
            return ev.PolicySpec(ZERO, "policy", "threshold", 0.0, 0.0), pol.params
        fit = prices.setdefault(str(rate), {})
        if k not in fit:
            fit[k] = fit_price(gv, rate, pol.params)
        return (ev.PolicySpec(FITTED, "policy", "threshold", fit[k]["lambda_s"],
                              fit[k]["mu"]), pol.params)

    def measure(row: str, rate: float) -> dict:
        rec = probes.setdefault(row, {})
        if str(rate) not in rec:
            spec, params = spec_of(row, rate)
            rec[str(rate)] = _lists(g.run(rate, [spec], params)[spec.name])
        return rec[str(rate)]

    if rows is None:
        rows = list(base) + [sample_row(n, k) for k in sizes.samples for n in (FITTED, ZERO)]
    lo, hi = float(sizes.rates[0]), float(sizes.rates[-1])
    by_slo = {}
    for anchor, slo in slos.items():
        by_slo[anchor] = {}
        for row in rows:
            b = cap.bisect_capacity(lambda r, row=row: measure(row, r), slo, lo, hi,
                                    resolution, cap.POOLED_SHARES)   # registered, deviation 3
            by_slo[anchor][row] = {"capacity": b["capacity"], "censored": b["censored"],
                                   "bracket": b["bracket"],
                                   "probed": [p.rate for p in b["probes"]]}
            log(f"  [{pair}] bisection ({anchor} SLO) {row}: capacity {b['capacity']:g} "
                f"(bracket {b['bracket'][0]:g}–{b['bracket'][1]:g}, "
                f"{len(b['probes'])} probes)")
    return {"resolution": resolution, "bracket": [lo, hi], "probes": probes,
            "prices": prices, "by_slo": by_slo,
            "compiles": {"test": g.compiles(), "validation": gv.compiles()}}


def test_grid(policies, pair: str, sizes: Sizes, prices: dict, log=print) -> dict:
    """Every row at every rate on test (per seed): ``{rate: {row: {metric: [S]}}}``; the
    PRADA rows per policy sample (``sample_row``) at that rate's fitted price and at 0."""
    p0 = policies[0]
    tr = load_split(p0, "test")
    seed0 = suite.evaluation_seed0(tr.info, p0, sizes.seeds)
    g = Grid(tr.traces, env_kwargs(p0, pair, sizes), sizes, p0.apply_fn, seed0, sizes.seeds)
    out = {}
    for rate in sizes.rates:
        point = {k: _lists(v) for k, v in g.run(rate, baseline_rows(), p0.params).items()}
        for k, pol in zip(sizes.samples, policies):
            fit = prices[str(rate)][str(k)]
            rows = [ev.PolicySpec(FITTED, "policy", "threshold", fit["lambda_s"], fit["mu"]),
                    ev.PolicySpec(ZERO, "policy", "threshold", 0.0, 0.0)]
            for name, m in g.run(rate, rows, pol.params).items():
                point[sample_row(name, k)] = _lists(m)
        out[str(rate)] = point
        log(f"  [{pair}] test λ = {rate:g}/s (U = {g.users(rate)}): LLM alone ρ "
            f"{np.nanmean(point[LLM_ALONE]['rho']):.2f}, PRADA #{sizes.samples[0]} ρ "
            f"{np.nanmean(point[sample_row(FITTED, sizes.samples[0])]['rho']):.2f}")
    return out


def _lists(metrics: dict) -> dict:
    return {m: [float(x) for x in np.asarray(v, np.float64)] for m, v in metrics.items()}

