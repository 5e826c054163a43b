"""The screening comparison at light load: the oracle's ceiling, and PRADA against random at
equal offload share (``python -m evals.screening``; issue 51 item 4).

One evaluator (``evals.evaluate``: same seeds, so every difference is paired) runs:

* **All-SLM** and the **LLM alone** (``evals.suite.ALL_LLM``): the two ends of the accuracy
  gap; a method *recovers* ``(acc − acc_SLM) / (acc_LLM − acc_SLM)`` of it (a ratio of means
  over seeds, 95 % CI by resampling the seeds of every row together).
* **Oracle screening** (``prada_jax.traces.oracle``): unlimited (its minimum offload share)
  and every budget k = 1 … up to the pool's largest minimum (k = 0 is All-SLM). Its exact
  values on the pool (every problem once, no env) are printed beside.
* **PRADA at θ** (nominate iff the critic's ΔQ > θ; θ from ``evals.knobs.theta_grid``), the
  same over the actor's logit margin (``prada_actor``: through the policy's own operating
  point) and, for each point, **random screening matched to PRADA's measured offload share**
  (one correction pass, ``evals.evaluate.matched_random_probability``). Both serve their nominations with the
  FIFO-greedy scheduler, as does the oracle (offload-all: the same rule), so only the screen
  differs. At light load every nomination is served (an outage refuses a few), so the
  comparison is one of screening alone, not of scheduling.
* **PRADA as trained** (the actor's greedy nominations, FIFO-greedy) and random matched to it:
  the one operating point training put the policy at, beside the θ curve.

Everything here runs on trace sets; a synthetic set's numbers are labelled SYNTHETIC by the
command. The light-load accuracy of a row does not depend on the server's speed model (the
path through the tree is what the screen and the served nominations choose), so a change of
server (e.g. a prefix cache) moves its latency, not its accuracy.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np

from evals import evaluate as ev
from evals import knobs
from evals import suite
from prada_jax import stats
from prada_jax.traces import oracle as oracle_lib

#: Offload shares the PRADA θ points aim at (issue 51: ≈ 5 % to ≈ 80 %).
DEFAULT_SHARES = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8)
#: The scheduler of the PRADA and random rows (the oracle's offload_all is the same rule).
SCHEDULER = "fifo_greedy"
#: Bootstrap resamples of the gap-recovered intervals.
GAP_RESAMPLES = 2000
SLM, LLM = "All-SLM", suite.ALL_LLM
#: The policy's own operating point: the actor's greedy nominations.
ACTOR_ROW = "PRADA as trained (actor)"


class Comparison(NamedTuple):
    """``per_seed[row][metric]`` [S]; ``pairs``: one dict per θ (``theta``, ``prada`` and
    ``random`` row names, ``p`` the matched probability, ``predicted_share``); ``oracle_rows``
    (k or None, row name); ``exact``: the oracle's pool curve and the All-SLM / LLM pool
    accuracies (``oracle_lib.budget_curve``; no env)."""

    per_seed: dict
    pairs: list
    oracle_rows: list
    exact: dict


def exact_pool(traces) -> dict:
    """The oracle's curve over k and the walks of All-SLM / the LLM on every problem of the
    pool once (no env: no outage, no timeout)."""
    tr = jax.device_get(traces)
    tables = oracle_lib.oracle_tables(tr)
    curve = oracle_lib.budget_curve(tr, tables)
    n = tr.child.shape[0]
    slm = oracle_lib.walk(tr, np.zeros(n, np.int8))
    llm = oracle_lib.walk(tr, np.ones(n, np.int8))
    return {"oracle_curve": {k: v.tolist() for k, v in curve.items()},
            "min_offloads": oracle_lib.problem_min_offloads(tr, tables).tolist(),
            "slm_accuracy": float(slm["correct"].mean()),
            "llm_accuracy": float(llm["correct"].mean())}


def compare(evaluator: ev.Evaluator, scores: dict, shares=DEFAULT_SHARES,
            progress: Callable[[str], None] | None = None) -> Comparison:
    """Runs every row of the module docstring on ``evaluator`` (which holds the policy) and
    returns them with the pairing (``scores``: ``{method: [N]}`` for ``prada`` and/or
    ``prada_actor``, the score each thresholds per node of the evaluator's trace set,
    ``evals.knobs.node_scores``)."""
    say = progress or (lambda m: None)
    traces = evaluator.base_params.traces
    exact = exact_pool(traces)
    rows: dict[str, dict] = {}
    for spec in (ev.PolicySpec(SLM, "never", "keep_local"),
                 ev.PolicySpec(LLM, "always", "offload_all")):
        say(f"evaluating {spec.name}")
        rows[spec.name] = suite.run_row(evaluator, spec)
    mins = [m for m in exact["min_offloads"] if m >= 0]
    k_top = max(mins, default=0)
    oracle_rows = []
    for spec in knobs.knob_specs("oracle", [None] + list(range(1, k_top))):
        say(f"evaluating {spec.name}")
        rows[spec.name] = evaluator.run(spec)
        oracle_rows.append((spec.oracle_budget, spec.name))
    points = [("actor", None, None)]
    for method in [m for m in ("prada", "prada_actor") if m in scores]:
        thetas, predicted = knobs.theta_grid(traces, scores[method], shares)
        points += [(method, t, p) for t, p in zip(thetas, predicted)]
    actor = ev.PolicySpec(ACTOR_ROW, "policy", SCHEDULER)
    pairs = []
    for method, theta, pred in points:
        spec = actor if theta is None else knobs.knob_specs(method, [theta],
                                                            scheduler=SCHEDULER)[0]
        say(f"evaluating {spec.name}" + ("" if pred is None else
                                         f" (share ≈ {pred:.2f} if every nomination is served)"))
        rows[spec.name] = evaluator.run(spec)
        target = float(np.nanmean(rows[spec.name]["offload_rate"]))
        p, res = ev.matched_random_probability(evaluator, target)
        name = f"Random p={p:.3g} (≡ {spec.name})"
        say(f"evaluating {name}")
        rows[name] = res
        pairs.append({"method": method, "theta": None if theta is None else float(theta),
                      "prada": spec.name,
                      "random": name, "p": p,
                      "predicted_share": None if pred is None else float(pred)})
    return Comparison(rows, pairs, oracle_rows, exact)


def gap_recovered(per_seed: dict, row: str, resamples: int = GAP_RESAMPLES, seed: int = 0
                  ) -> dict:
    """``(acc_row − acc_SLM) / (acc_LLM − acc_SLM)`` of seed means, with a 95 % percentile
    interval from resampling the seeds (the same seeds for the three rows)."""
    a, s, l = (np.asarray(per_seed[k]["accuracy"], np.float64) for k in (row, SLM, LLM))

    def ratio(idx):
        den = l[idx].mean() - s[idx].mean()
        return (a[idx].mean() - s[idx].mean()) / den if den != 0 else np.nan

    draws = [ratio(i) for i in stats.resample_indices(a.size, resamples, seed)]
    lo, hi = stats.percentile_interval(np.asarray(draws)[np.isfinite(draws)])
    return {"mean": float(ratio(np.arange(a.size))), "ci_low": lo, "ci_high": hi}


def summarize(comp: Comparison) -> dict:
    """The numbers the command prints, as plain floats (JSON-ready): per row the mean ± CI of
    accuracy, offload share and ρ and the gap recovered; per pair the paired accuracy
    difference PRADA − random."""
    ps = comp.per_seed
    rows = {}
    for name, m in ps.items():
        rows[name] = {k: stats.mean_ci(m[k]).to_json_dict()
                      for k in ("accuracy", "offload_rate", "nomination_rate", "rho",
                                "outage_rate", "timeout_rate", "blocked_rate",
                                "latency_mean_s")}
        if name not in (SLM, LLM):
            rows[name]["gap_recovered"] = gap_recovered(ps, name)
    pairs = []
    for pr in comp.pairs:
        d = stats.paired_diff_ci(ps[pr["prada"]]["accuracy"], ps[pr["random"]]["accuracy"])
        ds = stats.paired_diff_ci(ps[pr["prada"]]["offload_rate"],
                                  ps[pr["random"]]["offload_rate"])
        pairs.append(dict(pr, accuracy_diff=d.to_json_dict(), share_diff=ds.to_json_dict()))
    return {"rows": rows, "pairs": pairs,
            "oracle_rows": [[k, n] for k, n in comp.oracle_rows], "exact": comp.exact}


def _ci(d: dict, digits: int = 3, scale: float = 1.0) -> str:
    m, lo, hi = d.get("mean"), d.get("ci_low"), d.get("ci_high")
    if m is None:
        return "n/a"
    if lo is None or hi is None:
        return f"{m * scale:.{digits}f}"
    return f"{m * scale:.{digits}f} [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]"


def format_report(summary: dict, title: str) -> str:
    """The command's text: reference rows, the oracle and its budget curve, PRADA vs random."""
    r, ex = summary["rows"], summary["exact"]
    out = [title, "", "mean [95% CI] over seeds; offload share = offloaded steps / steps; "
           "gap = share of the SLM→LLM accuracy gap recovered", ""]
    head = f"{'row':<34}{'accuracy':>24}{'offload share':>24}{'ρ':>7}{'gap recovered':>26}"
    out.append(head)

    def line(name, label=None):
        m = r[name]
        gap = _ci(m["gap_recovered"], 2) if "gap_recovered" in m else ""
        rho = m["rho"]["mean"]
        return (f"{(label or name):<34}{_ci(m['accuracy']):>24}{_ci(m['offload_rate']):>24}"
                f"{(f'{rho:.2f}' if rho is not None else 'n/a'):>7}{gap:>26}")

    out += [line(SLM), line(LLM, "LLM alone (All-LLM)")]
    out += ["", "Oracle screening (knows every answer: the ceiling of any screening policy); "
            "exact = every pool problem once, no env"]
    curve = ex["oracle_curve"]
    for k, name in summary["oracle_rows"]:
        i = len(curve["budget"]) - 1 if k is None else int(k)
        label = "oracle, k=∞ (minimum offloads)" if k is None else f"oracle, ≤ {k} offload(s)"
        out.append(line(name, label) + f"   exact: acc {curve['accuracy'][i]:.3f}, share "
                   f"{curve['offload_share'][i]:.3f}")
    out.append(f"{'  (exact pool: All-SLM':<34} acc {ex['slm_accuracy']:.3f}, LLM alone acc "
               f"{ex['llm_accuracy']:.3f})")
    out += ["", "PRADA vs random screening at equal offload share (paired over seeds): "
            "'as trained' = the actor's greedy nominations; 'ΔQ > θ' = the critic's threshold; "
            "'margin > m' = the actor's log-odds threshold"]
    out.append(f"{'PRADA point':<20}{'PRADA share':>12}{'random share':>14}{'PRADA acc':>12}"
               f"{'random acc':>12}{'PRADA − random [95% CI]':>30}{'gap PRADA':>12}"
               f"{'gap random':>12}")
    for pr in summary["pairs"]:
        a, b = r[pr["prada"]], r[pr["random"]]
        theta = ("as trained" if pr["theta"] is None else
                 f"{'ΔQ' if pr['method'] == 'prada' else 'margin'} > {pr['theta']:+.4g}")
        out.append(f"{theta:<20}{a['offload_rate']['mean']:>12.3f}"
                   f"{b['offload_rate']['mean']:>14.3f}{a['accuracy']['mean']:>12.3f}"
                   f"{b['accuracy']['mean']:>12.3f}{_ci(pr['accuracy_diff'], 3):>30}"
                   f"{a['gap_recovered']['mean']:>12.2f}{b['gap_recovered']['mean']:>12.2f}")
    return "\n".join(out)
