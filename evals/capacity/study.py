"""Capacity per server GPU under an SLO, end to end (docs/design.md §8; the study that
registers it: ``studies/capacity``): policy samples, then per hardware pair the SLO's
reference, the prices fitted per rate on validation and the test grid, each written at once
under the output folder and reused on a rerun with the same sizes; then the analysis, the
report and the plots.

Output under ``out``: ``policies/seed_<k>/`` (unless given), ``<pair>/reference.json``,
``<pair>/prices.json``, ``<pair>/test.json``, ``study.json``, ``report.md`` (both SLO
anchors of ``analysis.ANCHORS``), ``capacity_slo_<anchor>.png`` (capacity against the SLO
sweep), ``curve_<pair>.png`` (the objective curve). Every number is from the traces the policies were trained on (SYNTHETIC unless a
real trace set is used).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from envs import edge
from evals import curve, policy_samples, suite
from evals.capacity import analysis, measure
from evals.capacity.measure import Sizes
from prada_jax.jsonio import read_json, write_json

#: Sizes: ``study`` is what studies/capacity/README.md registers; ``demo`` is ``make
#: demo``'s; ``quick`` the tests'.
SIZES = {
    "study": Sizes(tuple(round(4.0 * 2.0 ** (k / 4), 4) for k in range(17)), 1000, 200, 400,
                   8, 4, edge.DEFAULT_MAX_NUM_SEQS, 20e6, "demo", (0, 1, 2)),
    # make demo: one policy sample (the demo's), 4 seeds, rates a factor 2 apart, a shorter
    # window (the demo's table says so)
    "demo": Sizes((4.0, 8.0, 16.0, 32.0, 64.0), 600, 100, 400, 4, 2,
                  edge.DEFAULT_MAX_NUM_SEQS, 20e6, "demo", (0,)),
    "quick": Sizes((1.0, 2.0), 60, 10, 30, 2, 2, 4, 20e6, "quick", (0, 1)),
}




def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _cached(path: Path, key: dict, make):
    """``path``'s ``data`` if it was written with ``key``; else ``make()``, written at once."""
    key = json.loads(json.dumps(key))   # tuples as JSON lists, as read back
    if path.is_file():
        d = read_json(path)
        if d.get("key") == key:
            return d["data"]
    data = make()
    write_json(path, {"key": key, "data": data})
    return data


def run_study(out: Path, pairs, size: str = "study", log=_log, policy_dirs=None) -> dict:
    """Runs (or resumes) every part under ``out``; returns ``{"results", "report", "tables",
    "meta"}``. ``policy_dirs``: refit policy folders to use as the samples 0, 1, ... (``make
    demo`` passes its own policy) instead of training the size's samples under
    ``out/policies``."""
    sizes = SIZES[size]
    out = Path(out)
    t0 = time.time()
    if policy_dirs is not None:   # the given policies are the samples 0, 1, ...
        if not policy_dirs:
            raise ValueError("policy_dirs: give at least one policy folder")
        dirs = [Path(d) for d in policy_dirs]
        sizes = sizes._replace(samples=tuple(range(len(dirs))))
    else:
        dirs = [policy_samples.train_sample(out / "policies", k, sizes.policy_size, log=log)
                for k in sizes.samples]
    pols = [suite.load_policy(str(d)) for d in dirs]
    key = {"sizes": sizes._asdict(), "policies": [suite.params_sha256(p.params) for p in pols],
           "price_grid": list(measure.PRICE_GRID)}
    for pair in pairs:
        d = out / curve.pair_tags([pair])[pair]
        d.mkdir(parents=True, exist_ok=True)
        log(f"[{pair}] reference (LLM alone, λ = {sizes.rates[0]:g}/s, validation)")
        _cached(d / "reference.json", key,
                      lambda: measure.reference_run(pols, pair, sizes))
        log(f"[{pair}] prices fitted per rate on validation")
        prices = _cached(d / "prices.json", key,
                         lambda: measure.fit_prices(pols, pair, sizes, log))
        log(f"[{pair}] test grid")
        _cached(d / "test.json", dict(key, prices=prices),
                lambda: measure.test_grid(pols, pair, sizes, prices, log))
    results, tests = analyse_pairs(out, pairs)   # from the files just written or reused
    meta = {"synthetic": True, "size": size, "sizes": sizes._asdict(),
            "samples": list(sizes.samples), "policies": [str(d) for d in dirs],
            "pairs": list(pairs), "wall_s": round(time.time() - t0, 1),
            "load_conditioned_map": "not run (registration: prices fitted per operating point)"}
    return write_report(out, pairs, results, tests, meta)


def analyse_pairs(out: Path, pairs) -> tuple[dict, dict]:
    """``(results {anchor: {pair: analysis}}, tests {pair: test grid})`` from the per-pair
    files under ``out`` (whatever run wrote them)."""
    results, tests = {}, {}
    for pair in pairs:
        d = Path(out) / curve.pair_tags([pair])[pair]
        data = {k: read_json(d / f"{k}.json")["data"] for k in ("reference", "prices", "test")}
        for anchor in analysis.ANCHORS:
            a = analysis.analyse(data, anchor)
            a["prices"] = data["prices"]
            results.setdefault(anchor, {})[pair] = a
        tests[pair] = data["test"]
    return results, tests


def report_only(out: Path, pairs, size: str = "study") -> dict:
    """The analysis, report and plots again from the per-pair files under ``out`` (no
    policy, no evaluation): what regenerates a committed study's results."""
    results, tests = analyse_pairs(out, pairs)
    meta = {"synthetic": True, "size": size, "sizes": SIZES[size]._asdict(),
            "samples": list(SIZES[size].samples), "pairs": list(pairs),
            "report_only": True,
            "load_conditioned_map": "not run (registration: prices fitted per operating point)"}
    return write_report(out, pairs, results, tests, meta)


def write_report(out: Path, pairs, results: dict, tests: dict, meta: dict) -> dict:
    """``study.json``, ``report.md``, ``capacity_slo_<anchor>.png`` and ``curve_<pair>.png``
    under ``out``."""
    out = Path(out)
    write_json(out / "study.json", {"meta": meta, "results": results})
    md = analysis.to_markdown(results, meta, tests)
    (out / "report.md").write_text(md)
    for anchor, res in results.items():
        analysis.plot(res, out / f"capacity_slo_{anchor.replace(' ', '_')}.png")
    for pair in pairs:
        tag = curve.pair_tags([pair])[pair]
        analysis.curve_plot({pair: results["same split"][pair]}, {pair: tests[pair]},
                            out / f"curve_{tag}.png")
    return {"results": results, "report": md, "meta": meta,
            "tables": {a: analysis.headline_table(r) for a, r in results.items()}}


