"""Capacity measurements (``studies/capacity`` registers the study that uses them): the SLO's
reference run, the per-operating-point price fit on validation and the test grid.

Every point is ``evals.evaluate``'s measurement on the serving server; all rows of one rate
run in one vmapped call (``evals.curve.make_curve_fn``), compiled once per (split, U) and
shared by the policy samples (one network architecture, so one ``apply_fn``).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from envs import edge
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
    size (``evals.policy_samples.SIZES``) and their PPO seeds."""
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
                 seeds: int):
        self.traces, self.env_kw, self.sizes = traces, dict(env_kw), sizes
        self.apply_fn, self.seed0, self.seeds = apply_fn, seed0, seeds
        self._fns: dict[int, Callable] = {}

    def users(self, rate: float) -> int:
        return suite.users_for(rate, self.sizes.drain * float(self.env_kw["tau_s"]))

    def params(self, rate: float) -> edge.EnvParams:
        kw = dict(self.env_kw, num_users=self.users(rate), arrival_rate_hz=float(rate))
        return edge.make_params(self.traces, **kw)

    def run(self, rate: float, rows: Sequence[ev.PolicySpec], net_params) -> dict:
        """``{row name: {metric: [S]}}`` of ``rows`` at ``rate``."""
        s = self.sizes
        params = self.params(rate)
        suite.check_fits(len(rows) * self.seeds, params.num_users)
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
    rows = [ev.PolicySpec(f"λ_s={lam:g}", "policy", "threshold", lam, 0.0)
            for lam in PRICE_GRID]
    out = {}
    for rate in sizes.rates:
        out[str(rate)] = {}
        for k, pol in zip(sizes.samples, policies):
            res = g.run(rate, rows, pol.params)
            obj = {r.name: float(np.nanmean(res[r.name]["objective"])) for r in rows}
            best = max(rows, key=lambda r: (obj[r.name], -r.lambda_s))   # ties: the lower
            out[str(rate)][str(k)] = {"lambda_s": best.lambda_s, "mu": 0.0,
                                      "objective": obj,
                                      "link_binds": float(np.nanmean(
                                          res[best.name]["uplink_bound_share"]))}
        log(f"  [{pair}] prices at λ = {rate:g}/s: " + ", ".join(
            f"#{k} λ_s={v['lambda_s']:g}" for k, v in out[str(rate)].items()))
    return out


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

