"""ReOPD in a regime where distillation learns (issue 44; registration:
studies/reopd_regime/README.md), SYNTHETIC.

    python -m studies.reopd_regime --out=DIR [--cache=DIR] [--parts=P,...]
    python -m studies.reopd_regime --quick --out=DIR       # tiny end-to-end run (a test)

Parts (``--parts``, in the order given; default the six up to the gate):

* ``cost``: the declared GPU cost model's OPD / ReOPD ratio sweep (no run needed);
* ``teacher``: T on solved + error-and-recovery episodes (``--inject_rate``), its τ = 1 pool
  and its logits at top_k = the vocabulary, under ``--cache`` (default ``<out>/cache``);
* ``cold``: SFT on T's pool to its plateau (curve committed), the cold start's and T's
  outcomes on the gate and pilot sets;
* ``depth``: the cold start's own τ = 1 episodes on the probe set: T's log-prob of its
  actions and the exact reverse KL to T, by agent turn (items 2, 3);
* ``pilot``: the lr grids of OPD (exact arm) and SFT continuation on the pilot seeds;
* ``gate``: the registered gate; "no distillation regime" stops the study: the parts below
  then refuse to run (exit 2);
* ``reopd_pilot``: ReOPD κ 0.6's lr grid (exact arm) on the pilot seeds;
* ``secondary``: the single-sample + baseline arm of OPD and ReOPD κ 0.6 (reported only);
* ``compare``: every method (OPD, ReOPD κ 0.6 / 0.8 / 1, SFT continuation, OPD at ReOPD's
  modelled cost) on the 8 verdict seeds, greedy and τ = 1 outcomes on the 2 048 verdict
  problems, the registered claims (``studies.reopd_regime.verdicts``).

Resumable (``studies.reopd_kg.resume``): every pilot run is written at once as
``<out>/runs/pilot/<mode>_lr<lr>_seed<s>.json`` and skipped on a restart; a killed trainer
resumes from its last checkpoint; ``<out>/fingerprint.json`` pins the cache and the sizes.
Writes ``<out>/study.json`` and ``<out>/report.md``. Bad input (an injection rate outside
[0, 1], an unknown part, a part whose prerequisite has not run, ``--cache`` with ``--quick``):
one line on stderr, exit 2, nothing written.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from absl import flags

from prada_jax import cli
from prada_jax.errors import BadInput
from studies import _shared
from studies import reopd_regime as S
from studies.reopd_kg import resume

PREREQ = {"cold": ("teacher",), "depth": ("cold",), "pilot": ("cold",), "gate": ("pilot",),
          "reopd_pilot": ("gate",), "secondary": ("reopd_pilot",),
          "compare": ("reopd_pilot",)}


def _define(fv) -> None:
    flags.DEFINE_string("out", "", "study folder (runs, study.json, report.md)", flag_values=fv)
    flags.DEFINE_string("cache", "", "task cache (teacher/, pool/, logits/); default "
                        "<out>/cache", flag_values=fv)
    flags.DEFINE_boolean("quick", False, "tiny sizes (a test)", flag_values=fv)
    flags.DEFINE_list("parts", [], "parts to run, in order; empty = all", flag_values=fv)
    flags.DEFINE_float("inject_rate", 0.5, "teacher data: share of episodes with one injected "
                       "error and its recovery, in [0, 1]", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags; None = the command line. Bad input raises ``BadInput`` before
    anything is written."""
    a = _shared.parse(_define, argv, "studies.reopd_regime", __doc__)
    if not (math.isfinite(a.inject_rate) and 0.0 <= a.inject_rate <= 1.0):
        raise BadInput(f"--inject_rate: {a.inject_rate} is outside [0, 1]")
    parts = tuple(a.parts) or S.PARTS[:6]   # default: up to the gate
    bad = [p for p in parts if p not in S.PARTS]
    if bad:
        raise BadInput(f"--parts: unknown part {bad[0]!r}; choose from {list(S.PARTS)}")
    out = Path(a.out)
    if a.quick and a.cache:
        raise BadInput("--cache: not with --quick (it builds its own tiny cache)")
    cache = Path(a.cache) if a.cache else out / "cache"
    try:
        stored = set(json.loads((out / "study.json").read_text()))
    except (OSError, ValueError):
        stored = set()
    if (cache / "teacher" / "model.safetensors").is_file():   # a teacher built earlier
        stored.add("teacher")
    _shared.check_prereqs(parts, PREREQ, stored, out)
    sizes = dataclasses.replace(S.QUICK if a.quick else S.FULL, inject_rate=a.inject_rate)
    if (out / "fingerprint.json").exists() and (cache / "pool").is_dir():
        resume.check_study(out, resume.study_fingerprint(cache, sizes))
    S.run(cache, out, sizes, parts, S.QUICK_COMPARE if a.quick else S.COMPARE)
    print((out / "report.md").read_text())
    print(f"{out / 'study.json'}: parts {parts}")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
