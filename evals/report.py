"""Summaries of per-seed evaluation metrics: mean ± 95% CI per policy, terminal table, JSON, CSV,
TensorBoard scalars.

Input everywhere: ``per_seed = {policy: {metric: [value per seed]}}`` (S seeds, the same seeds
for every policy so ratios can be paired). Metric names and units are listed in ``METRICS``.

Row flags (``row_flags``, from the summary; the measurement rule is ``evals.evaluate``'s).
Stability and every flag are **per seed** (issue 42): ``summarize`` adds, from the per-seed
values, the indicator metrics of ``SEED_FLAG_METRICS`` (1 on a seed that trips the rule, 0
otherwise; their mean is the share of seeds that trip it), and a flag is raised when any seed
trips it:

* ``unstable`` when the offered server load ρ is ≥ 1 on any seed (the queue has no steady
  state there: the row's latencies, which then measure the window and the timeout, are
  withheld everywhere: the table prints ``unstable``, JSON and CSV carry no mean, TensorBoard
  no tag);
* ``not steady`` when the mean relative drift between the two halves of the window exceeds
  ``STEADY_TOL`` in size and its 95 % CI excludes 0, **or** any seed drifts by more than
  ``SEED_DRIFT_TOL`` in size (a CI that merely includes 0 does not pass seeds drifting −0.6 and
  +0.7);
* ``U binds`` when more than ``BLOCKED_TOL`` of the arrivals were blocked on any seed because
  all U user slots were full (the population was sized too small for the point: its numbers
  describe the cell, not the server);
* ``link binds`` when the uplink or downlink asked more than the cell's bandwidth in more than
  ``LINK_TOL`` of the slots (mean over seeds; serving server).

A row is **stable** (``stable``) when neither ``unstable`` nor ``U binds`` is raised: only a
stable row's objective may enter a crossover or a capacity (``evals.curve``,
``evals.capacity``). Results without per-seed ρ (older JSON) fall back to the mean rule.
"""
from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from prada_jax import stats

# name -> (column header, unit, digits, scale for display)
METRICS: dict[str, tuple[str, str, int, float]] = {
    "accuracy": ("acc", "correct answers / arrivals (blocked and timed-out users count as "
                 "wrong)", 3, 1.0),
    "latency_mean_s": ("lat mean s", "mean end-to-end latency per arrival, blocked and timed-out "
                       "users at the timeout (s)", 2, 1.0),
    "latency_p95_s": ("lat p95 s", "95th percentile end-to-end latency per arrival, censored at "
                      "the timeout (s)", 2, 1.0),
    "latency_p90_s": ("lat p90 s", "90th percentile end-to-end latency per arrival, censored at "
                      "the timeout (s); the capacity SLO's latency term", 2, 1.0),
    "unstable_seed": ("unstable seeds", "share of seeds with ρ ≥ 1", 2, 1.0),
    "u_binds_seed": ("U-bound seeds", "share of seeds blocking more than BLOCKED_TOL of the "
                     "arrivals", 2, 1.0),
    "drift_seed": ("drifting seeds", "share of seeds whose |drift| exceeds SEED_DRIFT_TOL", 2,
                   1.0),
    "goodput_hz": ("goodput/s", "correct answers per second of window", 2, 1.0),
    "rho": ("ρ", "offered server load: requested server-unit seconds / available (M·τ per "
            "slot), scaled up for blocked arrivals", 2, 1.0),
    "steady_drift": ("drift", "(second-half − first-half cohort mean latency) / mean latency",
                     2, 1.0),
    "timeout_rate": ("timeout", "share of arrivals admitted but unfinished at the timeout", 3,
                     1.0),
    "arrivals": ("arrivals", "arrivals in the window (the measured cohort)", 0, 1.0),
    "processing_s": ("proc s", "mean processing (SLM + LLM compute) delay per problem (s)", 2,
                     1.0),
    "communication_s": ("comm s", "mean communication (uplink + downlink) delay per problem (s)",
                        2, 1.0),
    "queueing_s": ("queue s", "mean queueing delay per problem (s)", 2, 1.0),
    "offload_rate": ("offload", "share of decisions executed on the server", 3, 1.0),
    "server_util": ("util", "mean busy server units / M", 3, 1.0),
    "queue_len": ("queue", "mean queued requests per slot", 2, 1.0),
    "outage_rate": ("outage", "share of upload attempts lost to outage", 3, 1.0),
    "blocked_rate": ("blocked", "share of arrivals blocked (env full)", 3, 1.0),
    "fallback_share": ("fallback", "share of steps that used a trace fallback", 3, 1.0),
    "finished": ("finished", "cohort users finished within the timeout per run", 0, 1.0),
    "objective": ("objective", "accuracy − β · mean latency, over every arrival (PRM units)", 3,
                  1.0),
    "nomination_rate": ("nominate", "share of decision points nominated", 3, 1.0),
    "capacity_bound_share": ("cap binds", "share of slots where a request waits with all M_t "
                             "units busy", 3, 1.0),
    "bandwidth_bound_share": ("bw binds", "share of slots where a request waits with a unit "
                              "free (its bandwidth does not fit)", 3, 1.0),
    "uplink_bound_share": ("up binds", "share of slots whose uploads ask more than B_t·τ "
                           "(serving server; they share the link)", 3, 1.0),
    "downlink_bound_share": ("down binds", "share of slots whose downloads ask more than "
                             "B_t·τ (serving server)", 3, 1.0),
    "server_batch": ("batch", "mean sequences in the server's decode batch per slot (serving "
                     "server)", 1, 1.0),
    "prefix_hit_rate": ("prefix hit", "share of the context tokens of admitted server jobs "
                        "(LLM and PRM) that the server's prefix cache served (serving server)",
                        3, 1.0),
    "evicted_tokens_per_s": ("evicted tok/s", "prefix tokens evicted from the server's KV "
                             "cache per second (LRU, KV budget; serving server)", 0, 1.0),
    "kv_in_use_tokens": ("KV tokens", "mean LLM-KV tokens held per slot: running sequences + "
                         "cached prefixes (serving server)", 0, 1.0),
}
TABLE_METRICS = ("accuracy", "latency_mean_s", "latency_p95_s", "processing_s", "communication_s",
                 "queueing_s", "offload_rate", "server_util", "outage_rate", "blocked_rate",
                 "timeout_rate", "fallback_share", "objective", "goodput_hz", "rho")
#: Metrics a row with ρ ≥ 1 does not report (they would read as a stable latency).
LATENCY_METRICS = ("latency_mean_s", "latency_p90_s", "latency_p95_s", "processing_s", "communication_s",
                   "queueing_s")
#: Largest relative drift between the window's halves a steady row may show (when its 95 % CI
#: excludes 0): 10 %.
STEADY_TOL = 0.10
UNSTABLE, NOT_STEADY = "unstable", "not steady"
U_BINDS, LINK_BINDS = "U binds", "link binds"
#: Largest share of arrivals a row may lose to a full population before it is flagged: 0.1 %.
BLOCKED_TOL = 0.001
#: Largest share of slots in which a link may be over-asked before the row is flagged: 1 %.
LINK_TOL = 0.01
#: Largest relative drift between the window's halves one seed may show: 50 % (a large
#: drift; a small window's noise reaches 30 % on a stationary seed with ~50 arrivals).
SEED_DRIFT_TOL = 0.5
#: Per-seed indicator metrics ``summarize`` derives (1 where the seed trips the rule).
SEED_FLAG_METRICS = ("unstable_seed", "u_binds_seed", "drift_seed")


def _indicator(values, rule) -> list[float]:
    out = []
    for v in values:
        v = float(v)
        out.append(float(math.isfinite(v) and rule(v)))
    return out


def with_seed_flags(per_seed: Mapping[str, Mapping[str, Sequence[float]]]
                    ) -> dict[str, dict[str, Sequence[float]]]:
    """``per_seed`` with the indicator metrics of ``SEED_FLAG_METRICS`` added to every row
    that has the metric they read (``rho``, ``blocked_rate``, ``steady_drift``)."""
    out = {}
    for pol, metrics in per_seed.items():
        row = dict(metrics)
        if "rho" in row:
            row["unstable_seed"] = _indicator(row["rho"], lambda v: v >= 1.0)
        if "blocked_rate" in row:
            row["u_binds_seed"] = _indicator(row["blocked_rate"], lambda v: v > BLOCKED_TOL)
        if "steady_drift" in row:
            row["drift_seed"] = _indicator(row["steady_drift"],
                                           lambda v: abs(v) > SEED_DRIFT_TOL)
        out[pol] = row
    return out


def _any_seed(row: Mapping[str, stats.MeanCI], key: str) -> bool | None:
    """True if some seed tripped ``key``'s rule; None if the row has no such indicator."""
    v = row.get(key)
    if v is None or not math.isfinite(v.mean):
        return None
    return v.mean > 0


def row_flags(row: Mapping[str, stats.MeanCI]) -> list[str]:
    """Flags of one summarised row (see the module docstring): ``unstable`` if ρ ≥ 1 on any
    seed, ``not steady`` if |mean drift| > ``STEADY_TOL`` and its CI excludes 0 (with one
    seed, no CI: the size alone) or any seed's |drift| > ``SEED_DRIFT_TOL``, ``U binds`` if
    the blocked share > ``BLOCKED_TOL`` on any seed, ``link binds`` if a link was over-asked
    in > ``LINK_TOL`` of the slots. A summary without the per-seed indicators (older results)
    uses the means; rows without these metrics get none of their flags."""
    out = []
    rho = row.get("rho")
    seed = _any_seed(row, "unstable_seed")
    if seed or (seed is None and rho is not None and math.isfinite(rho.mean)
                and rho.mean >= 1.0):
        out.append(UNSTABLE)
    dr = row.get("steady_drift")
    drifts = bool(_any_seed(row, "drift_seed"))
    if dr is not None and math.isfinite(dr.mean) and abs(dr.mean) > STEADY_TOL:
        if not math.isfinite(dr.half_width) or dr.low > 0 or dr.high < 0:
            drifts = True
    if drifts:
        out.append(NOT_STEADY)
    bl = row.get("blocked_rate")
    seed = _any_seed(row, "u_binds_seed")
    if seed or (seed is None and bl is not None and math.isfinite(bl.mean)
                and bl.mean > BLOCKED_TOL):
        out.append(U_BINDS)
    links = [row.get(k) for k in ("uplink_bound_share", "downlink_bound_share")]
    if any(v is not None and math.isfinite(v.mean) and v.mean > LINK_TOL for v in links):
        out.append(LINK_BINDS)
    return out


def stable(row: Mapping[str, stats.MeanCI]) -> bool:
    """True if the row is stable on every seed: neither ``unstable`` nor ``U binds``."""
    fl = row_flags(row)
    return UNSTABLE not in fl and U_BINDS not in fl


def withheld(row: Mapping[str, stats.MeanCI], metric: str) -> bool:
    """True where ``metric`` of this row is not reported: a latency of an unstable row."""
    return metric in LATENCY_METRICS and UNSTABLE in row_flags(row)


def summarize(per_seed: Mapping[str, Mapping[str, Sequence[float]]],
              confidence: float = 0.95) -> dict[str, dict[str, stats.MeanCI]]:
    """policy -> metric -> MeanCI over seeds, the per-seed flag indicators included
    (``with_seed_flags``)."""
    return {pol: {m: stats.mean_ci(v, confidence) for m, v in metrics.items()}
            for pol, metrics in with_seed_flags(per_seed).items()}


def ratios(per_seed: Mapping[str, Mapping[str, Sequence[float]]], policy: str, reference: str,
           metrics: Sequence[str] = ("accuracy", "latency_mean_s"),
           confidence: float = 0.95) -> dict[str, stats.MeanCI]:
    """Per-seed paired ratio ``policy / reference`` of each metric, with a CI."""
    for name in (policy, reference):
        if name not in per_seed:
            raise KeyError(f"policy '{name}' not in results (have {sorted(per_seed)})")
    return {m: stats.paired_ratio_ci(per_seed[policy][m], per_seed[reference][m], confidence)
            for m in metrics}


def format_table(summary: Mapping[str, Mapping[str, stats.MeanCI]],
                 metrics: Sequence[str] = TABLE_METRICS, title: str | None = None) -> str:
    """Fixed-width text table: one row per policy, ``mean ± half-width`` per metric."""
    cols = [m for m in metrics if any(m in row for row in summary.values())]
    flagged = any("rho" in row for row in summary.values())
    header = ["policy"] + [METRICS[m][0] if m in METRICS else m for m in cols] \
        + (["flags"] if flagged else [])
    rows = []
    for pol, row in summary.items():
        cells = [pol]
        for m in cols:
            digits = METRICS[m][2] if m in METRICS else 3
            if withheld(row, m):
                cells.append(UNSTABLE)
            else:
                cells.append(row[m].fmt(digits) if m in row else "-")
        if flagged:
            cells.append(", ".join(row_flags(row)) or "-")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    return "\n".join(lines)


def to_json_dict(per_seed, summary, extra: Mapping | None = None) -> dict:
    """JSON-ready dict: per policy, per metric, the summary and the per-seed values."""
    out = {"policies": {}, "flags": {}}
    per_seed = with_seed_flags(per_seed)
    for pol, row in summary.items():
        entry = {}
        for m, ci in row.items():
            values = [stats.finite_or_none(float(x)) for x in per_seed[pol][m]]
            if withheld(row, m):   # no mean to misread; the censored values stay, labelled
                entry[m] = {"mean": None, "withheld": "unstable (rho >= 1)",
                            "per_seed_censored": values}
            else:
                entry[m] = {**ci.to_json_dict(), "per_seed": values}
        out["policies"][pol] = entry
        out["flags"][pol] = row_flags(row)
    out["metric_units"] = {m: METRICS[m][1] for m in METRICS}
    if extra:
        out.update(extra)
    return out


def csv_text(summary: Mapping[str, Mapping[str, stats.MeanCI]], extra_cols: Mapping | None = None
             ) -> str:
    """Long-format CSV: ``[extra...,] policy, metric, mean, ci_low, ci_high, ci_half_width, n,
    flags`` (a withheld latency has empty mean and bounds)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    extra_cols = dict(extra_cols or {})
    w.writerow(list(extra_cols) + ["policy", "metric", "mean", "ci_low", "ci_high",
                                   "ci_half_width", "n_seeds", "flags"])
    for pol, row in summary.items():
        fl = ";".join(row_flags(row))
        for m, ci in row.items():
            if withheld(row, m):
                w.writerow(list(extra_cols.values()) + [pol, m, "", "", "", "", ci.n, fl])
            else:
                w.writerow(list(extra_cols.values()) + [pol, m, ci.mean, ci.low, ci.high,
                                                        ci.half_width, ci.n, fl])
    return buf.getvalue()


def write_csv(path: os.PathLike | str, summary, extra_cols: Mapping | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(csv_text(summary, extra_cols))
    return path


def tag_name(label: str) -> str:
    """A TensorBoard-safe tag part: ``RSD (online PRM)`` -> ``RSD_online_PRM``,
    ``PRADA (λ=µ=0)`` -> ``PRADA_lambda_mu_0``."""
    s = label.replace("λ", "lambda").replace("µ", "mu").replace("μ", "mu")
    s = re.sub(r"[^A-Za-z0-9_.\-]+", "_", s)
    return s.strip("_") or "policy"


def tb_scalars(summary: Mapping[str, Mapping[str, stats.MeanCI]], prefix: str = "eval"
               ) -> dict[str, float]:
    """TensorBoard tags ``<prefix>/<policy>/<metric>`` (mean) and ``.../<metric>_ci`` (half).

    Undefined values (NaN/inf, e.g. the latency of a policy under which nobody finished, or a
    CI from a single seed) and the withheld latencies of an unstable row are left out of
    TensorBoard; ``<prefix>/<policy>/unstable`` is 1 for an unstable row, 0 otherwise."""
    out = {}
    for pol, row in summary.items():
        tag_pol = tag_name(pol)
        if "rho" in row:
            out[f"{prefix}/{tag_pol}/unstable"] = float(UNSTABLE in row_flags(row))
        for m, ci in row.items():
            if withheld(row, m):
                continue
            for tag, v in ((f"{prefix}/{tag_pol}/{m}", ci.mean),
                           (f"{prefix}/{tag_pol}/{m}_ci95", ci.half_width)):
                if math.isfinite(v):
                    out[tag] = v
    return out
