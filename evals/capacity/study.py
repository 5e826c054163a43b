"""Capacity per server GPU under an SLO, measured end to end for given policy samples
(docs/design.md §8; the study that registers it: ``studies/capacity``; the samples it trains
when it has none: ``train.capacity_study``): per hardware pair the SLO's
reference, the prices fitted per rate on validation, the test grid, the exact test-pool
accuracy and the capacities by bisection, each written at once under the output folder and
reused on a rerun only if its key matches: the sizes, the policies' parameter hashes, the
price grid, **the pair's name and the sha256 of its resolved figures**
(``prada_jax.latency.pair_latency_params``: a pair file's content and the profile table both
enter it), the env's resolved settings (``measure.env_fingerprint``: a changed default such as
the server's prefix cache is measured again), and the parts it was computed from; then the analysis, the report and the plots.
The whole ``pairs`` list is checked for two pairs that would share a folder before anything
is measured (``BadInput`` naming both; ``train.capacity_study`` checks it before training).

Output under ``out``: ``<pair>/reference.json``,
``<pair>/prices.json``, ``<pair>/test.json``, ``<pair>/test_pool.json``,
``<pair>/bisect.json`` (sizes with a ``BISECTION`` resolution), ``study.json``,
``report.md`` (both SLO anchors of ``analysis.ANCHORS``), ``capacity_slo_<anchor>.png``
(capacity against the SLO sweep), ``curve_<pair>.png`` (the objective curve). Every number is
from the traces the policies were trained on (SYNTHETIC unless a real trace set is used).
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from envs import edge
from evals import curve, suite
from evals.capacity import analysis, measure
from evals.capacity.measure import Sizes
from prada_jax import latency as lat
from prada_jax.errors import BadInput
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
#: The bisection's resolution per size (the bracket [met, broken] ends at hi / lo ≤ 1 + it);
#: None: no bisection (``make demo``'s size keeps its 5-rate grid, its table says so). The
#: quick size's is coarse so the tests stay short.
BISECTION = {"study": 0.05, "demo": None, "quick": 0.2}
#: The per-pair part files (``analyse_pairs`` reads them; ``bisect`` only where it ran).
PARTS = ("reference", "prices", "test", "test_pool")




def log_stderr(msg: str) -> None:
    """The study's default progress log: one line on stderr."""
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


def pair_key(pair: str) -> dict:
    """What identifies a pair's measurements: its name and the sha256 of its resolved
    figures (every ``LatencyParams`` field under the pair: a pair file's profiles, or the
    ``PROFILES`` entries a named pair resolves to)."""
    figures = repr(lat.pair_latency_params(pair))
    return {"name": pair, "figures_sha256": hashlib.sha256(figures.encode()).hexdigest()}


def pair_folders(out: Path, pairs) -> dict[str, Path]:
    """``{pair: out/<tag>}`` for the whole list at once (``curve.pair_tags``: ``BadInput``
    naming both pairs where two would share a folder)."""
    return {p: Path(out) / t for p, t in curve.pair_tags(list(pairs)).items()}


def run_study(out: Path, pairs, size: str = "study", log=None, *, policy_dirs) -> dict:
    """Runs (or resumes) every part under ``out`` for the policies of ``policy_dirs`` (refit
    policy folders, the samples 0, 1, ...: ``make demo`` passes its own policy,
    ``train.capacity_study`` the size's samples it trained); returns ``{"results", "report",
    "tables", "meta"}``. ``log``: progress lines (default: stderr)."""
    log = log or log_stderr
    sizes = SIZES[size]
    out = Path(out)
    t0 = time.time()
    folders = pair_folders(out, pairs)       # a clash stops here, before any measurement
    if not policy_dirs:
        raise ValueError("policy_dirs: give at least one policy folder")
    dirs = [Path(d) for d in policy_dirs]    # the given policies are the samples 0, 1, ...
    sizes = sizes._replace(samples=tuple(range(len(dirs))))
    pols = [suite.load_policy(str(d)) for d in dirs]
    key = {"sizes": sizes._asdict(), "policies": [suite.params_sha256(p.params) for p in pols],
           "price_grid": list(measure.PRICE_GRID)}
    for pair in pairs:
        d = folders[pair]
        d.mkdir(parents=True, exist_ok=True)
        pkey = dict(key, pair=pair_key(pair), env=measure.env_fingerprint(pols, pair, sizes))
        log(f"[{pair}] reference (LLM alone, λ = {sizes.rates[0]:g}/s, validation)")
        ref = _cached(d / "reference.json", pkey,
                      lambda: measure.reference_run(pols, pair, sizes))
        log(f"[{pair}] prices fitted per rate on validation")
        prices = _cached(d / "prices.json", pkey,
                         lambda: measure.fit_prices(pols, pair, sizes, log))
        log(f"[{pair}] test grid")
        test = _cached(d / "test.json", dict(pkey, prices=prices),
                       lambda: measure.test_grid(pols, pair, sizes, prices, log))
        pool = _cached(d / "test_pool.json", pkey, lambda: measure.test_pool(pols))
        res = BISECTION[size]
        if res is not None:
            data = {"reference": ref, "test": test, "test_pool": pool}
            slos = {a: analysis.slo_for(data, a) for a in analysis.ANCHORS}
            log(f"[{pair}] capacities by bisection to {res:.0%} (test)")
            _cached(d / "bisect.json",
                    dict(pkey, resolution=res, slos={a: s._asdict() for a, s in slos.items()}),
                    lambda: measure.bisect_rows(pols, pair, sizes, slos, res, log))
    results, tests = analyse_pairs(out, pairs)   # from the files just written or reused
    meta = {"synthetic": True, "size": size, "sizes": sizes._asdict(),
            "samples": list(sizes.samples), "policies": [str(d) for d in dirs],
            "pairs": list(pairs), "bisection": _bisection_text(size),
            "wall_s": round(time.time() - t0, 1),
            "load_conditioned_map": "not run (registration: prices fitted per operating point)"}
    return write_report(out, pairs, results, tests, meta)


def _bisection_text(size: str) -> str:
    res = BISECTION[size]
    return "not run (grid capacities)" if res is None else f"per row, to {res:.0%}"


def _part(path: Path):
    """A part file's ``data``; ``BadInput`` naming the file where it is not a part file."""
    obj = read_json(path)
    if not isinstance(obj, dict) or "data" not in obj:
        raise BadInput(f"--report_only: {path} has no 'data' field (not a part this study "
                       f"writes)")
    return obj["data"]


def analyse_pairs(out: Path, pairs) -> tuple[dict, dict]:
    """``(results {anchor: {pair: analysis}}, tests {pair: test grid})`` from the per-pair
    files under ``out`` (whatever run wrote them; ``bisect.json`` where it exists). Every
    file is read and analysed before anything is written; a file that is not a part of this
    study is ``BadInput`` naming it."""
    results, tests = {}, {}
    for pair, d in pair_folders(out, pairs).items():
        data = {k: _part(d / f"{k}.json") for k in PARTS}
        if (d / "bisect.json").is_file():
            data["bisect"] = _part(d / "bisect.json")
        try:
            per_anchor = {a: analysis.analyse(data, a) for a in analysis.ANCHORS}
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise BadInput(f"--report_only: {d}: its part files do not hold this study's "
                           f"records ({type(e).__name__}: {e})") from None
        for anchor, a in per_anchor.items():
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
            "bisection": ("per row (bisect.json)" if all(
                a["capacity_method"] != "grid" for a in results["validation"].values())
                else "not run for these results (grid capacities)"), "report_only": True,
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
    for pair, tag in curve.pair_tags(list(pairs)).items():
        analysis.curve_plot({pair: results["same split"][pair]}, {pair: tests[pair]},
                            out / f"curve_{tag}.png")
    return {"results": results, "report": md, "meta": meta,
            "tables": {a: analysis.headline_table(r) for a, r in results.items()}}


