"""ReOPD where its mechanism can appear (issue 35; registration: studies/reopd_kg/README.md),
SYNTHETIC.

    python -m studies.reopd_kg --cache=DIR --out=DIR [--parts=P,...] [--seeds=0-19]
    python -m studies.reopd_kg --quick --out=DIR       # tiny end-to-end run (a test)

``--cache`` is a kg task cache (``python -m prada_jax.distill.task.kg_teacher --cache=C`` then
``C/seed0``); ``--quick`` builds a tiny one under ``--out``. Parts (``--parts``, in the order
given; default all; a finished training run under ``--out`` is reused):

* ``paths``: item 4, how unique the pool's solution paths are (the SFT regime);
* ``cold``: the cold start (SFT on the teacher's pool until the success gate or the budget),
  the teacher's and the cold start's per-problem success on the two verdict sets, the headroom;
* ``pilot``: per mode (OPD, ReOPD κ = first of ``--kappas``, SFT) the lr grid on the pilot
  seeds and problems; B = the first OPD pilot run's supervised turns per update per seed;
* ``compare``: from the cold start, OPD, ReOPD at each κ and SFT continuation, ``--updates``
  each, the verdict seeds vmapped per method; per-seed per-problem success on both sets; rules
  (a) (c) (d) (e) with two-way (seeds × problems) bootstrap CIs and MDEs;
* ``reliability``: item 2, the teacher's log-prob per depth on its own, ReOPD and OPD rows;
* ``clock``: item 3, interleaved timing of OPD (no sleep) and ReOPD; the fair clock at
  ``--latencies_ms`` per turn round and the break-even latency for 4×.

Resumable and teacher-pinned (``studies.reopd_kg.resume``): every finished pilot and compare
run (part, method, lr or κ, seed; one training run per seed) is written at once as
``<out>/runs/<part>/<name>_seed<s>.json`` and skipped on a restart; the pilot's lr choice is
made only once all its runs exist and compare uses it; ``<out>/fingerprint.json`` pins the
cache (sha256 of T's weights, the pool, the logits index) and the study's config (every size
but the verdict seeds), and a restart against another cache or config is refused (exit 2,
one line naming the file and field, nothing written). Verdicts only once the registered
number of verdict seeds (20) has run.

Writes ``<out>/study.json`` (every number and per-seed per-problem outcome) and
``<out>/report.md``. Bad input (a κ outside (0, 1], a negative or non-finite tool latency, a
verdict seed range that overlaps the pilot's, an unknown part, a part whose prerequisite has
not run, a missing cache): one line on stderr, exit 2, nothing written.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from absl import flags

from prada_jax import cli
from prada_jax.errors import BadInput
from studies import _shared
from studies import reopd_kg as S
from studies.reopd_kg import resume
from studies.reopd_vs_opd import check_study_folder

PREREQ = {"pilot": ("cold",), "compare": ("cold", "pilot"), "reliability": ("cold",),
          "clock": ("cold",)}


def _define(fv) -> None:
    FULL = S.FULL
    flags.DEFINE_string("cache", "", "kg task cache with pool/, logits/, teacher/ (not with "
                        "--quick)", flag_values=fv)
    flags.DEFINE_string("out", "", "study folder (runs, study.json, report.md)", flag_values=fv)
    flags.DEFINE_boolean("quick", False, "tiny sizes on a tiny kg cache built under --out",
                         flag_values=fv)
    flags.DEFINE_list("parts", [], "parts to run, in order; empty = all", flag_values=fv)
    flags.DEFINE_string("seeds", "0-19", "verdict seeds 'a-b'", flag_values=fv)
    flags.DEFINE_string("pilot_seeds", "100-102", "lr pilot seeds 'a-b' (disjoint from "
                        "--seeds)", flag_values=fv)
    flags.DEFINE_integer("updates", FULL.updates, "N: updates of every compared method",
                         flag_values=fv)
    flags.DEFINE_list("kappas", [str(k) for k in FULL.kappas], "ReOPD κ values in (0, 1]; "
                      "the first is the verdict's", flag_values=fv)
    flags.DEFINE_list("latencies_ms", [f"{x:g}" for x in FULL.latencies_ms], "fair clock: "
                      "simulated tool latency per turn round [ms], each >= 0", flag_values=fv)


def _floats(values, flag: str, ok, want: str) -> tuple:
    out = []
    for v in values:
        try:
            x = float(v)
        except ValueError:
            raise BadInput(f"--{flag}: {v!r} is not a number") from None
        if not (math.isfinite(x) and ok(x)):
            raise BadInput(f"--{flag}: {v} is outside {want}")
        out.append(x)
    return tuple(out)


def main(argv=None) -> int:
    """``argv``: absl flags; None = the command line. Bad input raises ``BadInput`` before
    anything is written."""
    a = _shared.parse(_define, argv, "studies.reopd_kg", __doc__)
    kappas = _floats(a.kappas, "kappas", lambda x: 0 < x <= 1, "(0, 1]")
    if not kappas:
        raise BadInput("--kappas: at least one κ")
    lat = _floats(a.latencies_ms, "latencies_ms", lambda x: x >= 0, "[0, inf) ms")
    seeds = _shared.seed_range(a.seeds, "seeds")
    pseeds = _shared.seed_range(a.pilot_seeds, "pilot_seeds")
    if set(seeds) & set(pseeds):
        raise BadInput(f"--seeds: {a.seeds} overlaps the lr pilot's seeds --pilot_seeds="
                       f"{a.pilot_seeds}")
    if a.updates < 1:
        raise BadInput(f"--updates: must be >= 1, got {a.updates}")
    parts = tuple(a.parts) or S.PARTS
    bad = [p for p in parts if p not in S.PARTS]
    if bad:
        raise BadInput(f"--parts: unknown part {bad[0]!r}; choose from {list(S.PARTS)}")
    out = Path(a.out)
    stored = check_study_folder(out, "reopd_kg")   # a file, another study: refused
    _shared.check_prereqs(parts, PREREQ, stored, out)
    if a.quick:
        if a.cache:
            raise BadInput("--cache: not with --quick (it builds its own tiny cache)")
        sizes = dataclasses.replace(S.QUICK, kappas=kappas, latencies_ms=lat)
        cache = out / "cache" / "seed0"
    else:
        cache = Path(a.cache)
        _shared.check_cache(cache, hint="prada_jax.distill.task.kg_teacher")
        sizes = dataclasses.replace(S.FULL, seeds=seeds, pilot_seeds=pseeds, updates=a.updates,
                                    kappas=kappas, latencies_ms=lat)
    if (out / "fingerprint.json").exists():   # another cache or config: refused here
        resume.check_study(out, resume.study_fingerprint(cache, sizes))
    if a.quick and not (cache / "pool").is_dir():
        out.mkdir(parents=True, exist_ok=True)
        S.tiny_cache(out / "cache")
    S.run(cache, out, sizes, parts)
    print((out / "report.md").read_text())
    print(f"{out / 'study.json'}: parts {parts}")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
