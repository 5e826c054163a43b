"""PRADA's frontier (issue 52; registration: ``studies/frontier/README.md``), end to end: per
hardware pair the θ / m grids of each policy sample (on validation), the exact pool
accuracies, phase A (every knob row, validation, light load), phase B (every knob row, test,
light load) with random matched to PRADA's chosen shares, phase C (each chosen setting's
capacity at each r by bisection on test, and the latency rates) and, for the default pair, the
no-cache ablation; then the analysis (``studies.frontier.analysis``), ``report.md``,
``study.json`` and ``frontier_<pair>.png``.

Each part is written under ``out/<pair>/`` at once (phases A and B after every row, phase C
and the ablation after every probe) with its key: the sizes, the policies' parameter hashes,
the pair's name and figures' sha256 (``evals.capacity.study.pair_key``), the env's resolved
settings (``evals.capacity.measure.env_fingerprint``) and the sha256 of the parts it was
computed from; a rerun reuses a part (or resumes a partial one) only if its key matches, so a
``kill -9`` loses at most one row or probe. ``report_only`` reads the parts alone.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from evals import curve, suite
from evals.capacity import measure as cm
from evals.capacity.study import pair_key
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from train import policy_samples
from studies.frontier import analysis
from studies.frontier import report
from studies.frontier import measure as fm
from studies.frontier.measure import Sizes

DEFAULT_PAIR = "a100_orin_int4"
PAIRS = (DEFAULT_PAIR, "a100_phone_int4", "h100_orin_int4")
_SHARES = (0.05, 0.10, 0.20, 0.40, 0.60, 0.80)
#: ``study``: what README.md registers; ``demo``: ``make demo``'s (one policy sample, 4 seeds,
#: two shares a knob, a shorter window, bisection to 25 %: the machinery, no verdict);
#: ``quick``: the tests' (seconds).
SIZES = {
    "study": Sizes(4.0, 8, 8, 1000, 200, 400, 256, 20e6, fm.STUDY_BRACKET, 0.05, _SHARES,
                   (0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8), (0.5, 0.6, 0.7, 0.8, 0.9),
                   (0, 1, 2, None), (0.90, 0.95, 0.98), (4.0, 8.0, 16.0, 32.0), "demo",
                   (0, 1, 2)),
    "demo": Sizes(4.0, 4, 4, 600, 100, 300, 256, 20e6, fm.STUDY_BRACKET, 0.25, (0.1, 0.4),
                  (0.1, 0.4), (0.5, 0.8), (1,), (0.90, 0.95, 0.98), (4.0, 32.0), "demo", (0,)),
    # quick: retentions low enough that some settings reach them on the quick traces (5
    # arrivals a seed), so every path (selection, matched random, bisection, latency) runs
    "quick": Sizes(1.0, 2, 2, 60, 10, 30, 4, 20e6, (1.0, 2.0), 0.2, (0.1, 0.4), (0.1, 0.4),
                   (0.7,), (0, None), (0.3, 0.6, 0.8), (1.0, 2.0), "quick", (0, 1)),
}
#: The per-pair part files, in the order they are computed (``ablation``: default pair only).
PARTS = ("thetas", "pools", "phase_a", "phase_b", "matched", "phase_c", "ablation")
REQUIRED = ("thetas", "pools", "phase_a", "phase_b")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _norm(key: dict) -> dict:
    return json.loads(json.dumps(key))   # tuples as JSON lists, as read back


def _read_part(path: Path, key: dict):
    """``(data, complete)`` of ``path`` if written with ``key``; else ``(None, False)``."""
    if path.is_file():
        d = read_json(path)
        if isinstance(d, dict) and d.get("key") == _norm(key):
            return d["data"], bool(d.get("complete", True))
    return None, False


def _part(path: Path, key: dict, make):
    """A whole part: reused if its key matches, else ``make()`` written at once."""
    data, complete = _read_part(path, key)
    if data is not None and complete:
        return data
    data = make()
    write_json(path, {"key": _norm(key), "complete": True, "data": data})
    return data


def _resumable(path: Path, key: dict, make):
    """A part measured row by row: ``make(done, save)`` gets the partial data of a killed run
    (same key) and ``save(partial)`` writes it at once (``complete`` False)."""
    data, complete = _read_part(path, key)
    if data is not None and complete:
        return data

    def save(partial):
        write_json(path, {"key": _norm(key), "complete": False, "data": partial})

    data = make(data, save)
    write_json(path, {"key": _norm(key), "complete": True, "data": data})
    return data


def pair_folders(out: Path, pairs) -> dict[str, Path]:
    return {p: Path(out) / t for p, t in curve.pair_tags(list(pairs)).items()}


def policy_dirs(root: Path, pair: str, sizes: Sizes, log=_log, train: bool = True
                ) -> list[Path]:
    """``root/<pair>/seed_<k>/critic`` for each sample, trained under ``pair``'s clock
    (``train.policy_samples.train_sample``) where missing; a folder trained under another pair
    is refused (``BadInput``)."""
    out = []
    for k in sizes.samples:
        crit = Path(root) / pair / f"seed_{k}" / "critic"
        if not (crit / "critic_check.json").is_file():
            if not train:
                raise BadInput(f"--policies={root}: {crit} is not a trained policy sample")
            crit = policy_samples.train_sample(Path(root) / pair, k, sizes.policy_size,
                                               log=log, hardware=pair)
        policy_samples.check_policy_pair(read_json(crit / "policy_meta.json"), pair,
                                         str(crit), flag="--policies")
        out.append(crit)
    return out


def run_pair(out_dir: Path, pair: str, sizes: Sizes, pols, dirs, log=_log,
             ablation: bool = False) -> None:
    """Every part of one pair under ``out_dir`` (module docstring)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    hashes = [suite.params_sha256(p.params) for p in pols]
    key = {"sizes": sizes._asdict(), "policies": hashes, "pair": pair_key(pair),
           "env": cm.env_fingerprint(pols, pair, fm.capacity_sizes(sizes))}
    log(f"[{pair}] θ and m grids (validation)")
    thetas = _part(out_dir / "thetas.json", key, lambda: dict(
        fm.theta_grids(pols, pair, sizes),
        policies=[{"sample": int(k), "dir": str(d), "params_sha256": h}
                  for k, d, h in zip(sizes.samples, dirs, hashes)]))
    pools = _part(out_dir / "pools.json", key, lambda: {
        s: fm.pool_accuracy(pols[0], s)["llm_alone_accuracy"] for s in ("validation", "test")})
    k2 = dict(key, thetas=_sha(thetas))
    log(f"[{pair}] phase A: every knob row, validation, {sizes.light_rate:g}/s")
    a = _resumable(out_dir / "phase_a.json", k2, lambda done, save: fm.light_rows(
        pols, pair, sizes, "validation", thetas, log, done, save))
    log(f"[{pair}] phase B: every knob row, test, {sizes.light_rate:g}/s")
    b = _resumable(out_dir / "phase_b.json", k2, lambda done, save: fm.light_rows(
        pols, pair, sizes, "test", thetas, log, done, save))
    sel = analysis.select(a, pools["validation"], sizes.retentions)
    r95 = analysis.headline_r(sizes.retentions)
    targets = {}
    for g, by_r in sel.items():
        row = by_r[r95]["row"]
        if fm.method_of(g) == fm.PRADA and row is not None:
            targets[row] = fm.finite_mean(b["rows"][row]["record"]["offload_rate"])
    k3 = dict(k2, phase_a=_sha(a), phase_b=_sha(b))
    log(f"[{pair}] random matched to PRADA's r = 0.95 settings (test)")
    _part(out_dir / "matched.json", k3, lambda: fm.matched_random(pols, pair, sizes,
                                                                   targets, log))
    specs = {n: fm.spec_from_json(d["spec"]) for n, d in a["rows"].items()}
    rows = analysis.chosen_rows(sel)
    slo_by_r = analysis.slos(a["rows"][fm.LLM_ALONE]["record"], pools["test"],
                             sizes.retentions)
    bracket = fm.bracket_of(sizes, pair)
    k4 = dict(k3, bracket=list(bracket), rows=rows)
    lat_rows = [fm.LLM_ALONE] + [by_r[r95]["row"] for g, by_r in sorted(sel.items())
                                 if fm.method_of(g) == fm.PRADA and by_r[r95]["row"]]

    def phase_c(done, save, overrides=None, rows=rows, latency=True):
        probes = (done or {}).get("probes", {})
        prober = fm.Prober(pols, pair, sizes, specs, probes,
                           lambda p: save({"probes": p}), overrides, log)
        by_r = fm.bisect(prober, rows, slo_by_r, bracket, sizes.resolution, log)
        if latency:
            for rate in sizes.latency_rates:
                for row in lat_rows:
                    prober(row, rate)
        return {"probes": prober.probes, "by_r": by_r, "bracket": list(bracket),
                "rows": rows}

    log(f"[{pair}] phase C: capacities by bisection ({bracket[0]:g}–{bracket[1]:g}/s, "
        f"{sizes.resolution:.0%}), test, rows {rows}")
    _resumable(out_dir / "phase_c.json", k4, phase_c)
    if ablation:
        abl_rows = [fm.LLM_ALONE] + [r for r in rows if fm.method_of(r) == fm.PRADA]
        log(f"[{pair}] ablation: the no-cache server, rows {abl_rows}")
        _resumable(out_dir / "ablation.json", dict(k4, ablation=fm.NO_CACHE, rows=abl_rows),
                   lambda done, save: phase_c(done, save, fm.NO_CACHE, abl_rows, False))


def run_study(out: Path, pairs, size: str = "study", policies_root: Path | None = None,
              log=_log) -> dict:
    """Runs (or resumes) every pair under ``out``; then the report from the parts."""
    sizes = SIZES[size]
    out = Path(out)
    t0 = time.time()
    folders = pair_folders(out, pairs)
    root = Path(policies_root) if policies_root is not None else out / "policies"
    for pair in pairs:
        dirs = policy_dirs(root, pair, sizes, log)
        pols = [suite.load_policy(str(d)) for d in dirs]
        run_pair(folders[pair], pair, sizes, pols, dirs, log,
                 ablation=(pair == DEFAULT_PAIR and size != "demo"))
    log(f"measured in {time.time() - t0:.0f} s wall")
    return write_report(out, pairs, size)


def load_parts(out: Path, pairs) -> dict:
    """``{pair: {part: data}}`` from the part files under ``out`` (a partial phase C or
    ablation is marked ``complete`` False and is not analysed); ``BadInput`` naming a file
    that is not a part of this study or a required part that is missing."""
    res = {}
    for pair, d in pair_folders(out, pairs).items():
        parts = {}
        for name in PARTS:
            p = d / f"{name}.json"
            if not p.is_file():
                if name in REQUIRED:
                    raise BadInput(f"--report_only: {out} lacks {d.name}/{name}.json")
                continue
            obj = read_json(p)
            if not isinstance(obj, dict) or "data" not in obj:
                raise BadInput(f"--report_only: {p} has no 'data' field (not a part this "
                               f"study writes)")
            data = obj["data"]
            if name in ("phase_c", "ablation"):
                data = dict(data, complete=bool(obj.get("complete", True)))
            elif not obj.get("complete", True):
                raise BadInput(f"--report_only: {p} is a partial part (a run still going or "
                               f"killed: rerun the command without --report_only)")
            parts[name] = data
        res[pair] = parts
    return res


def write_report(out: Path, pairs, size: str) -> dict:
    """``study.json``, ``report.md`` and ``frontier_<pair>.png`` under ``out`` from the parts
    alone (what ``--report_only`` runs)."""
    sizes = SIZES[size]
    parts = load_parts(out, pairs)
    results = {}
    for pair, p in parts.items():
        try:
            results[pair] = analysis.analyse(p, sizes, fm.bracket_of(sizes, pair)[1])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise BadInput(f"--report_only: {out}/{pair}: its parts do not hold this study's "
                           f"records ({type(e).__name__}: {e})") from None
    meta = {"synthetic": True, "size": size, "sizes": sizes._asdict(), "pairs": list(pairs)}
    write_json(Path(out) / "study.json", {"meta": meta, "results": results})
    md = report.to_markdown(results, meta)
    (Path(out) / "report.md").write_text(md)
    for pair, tag in curve.pair_tags(list(pairs)).items():
        report.plot_frontier(results[pair], pair, Path(out) / f"frontier_{tag}.png")
    return {"results": results, "report": md, "meta": meta}
