"""``python -m studies.reopd_gate`` (the module docstring of ``studies.reopd_gate`` says what
it runs)."""
from __future__ import annotations

import json
from pathlib import Path

from absl import flags

from prada_jax import cli
from prada_jax.errors import BadInput
from studies import _shared
from studies import reopd_gate as G

PREREQ = {"seeds": ("reopd_pilot",), "analysis": ("reopd_pilot",)}


def _define(fv) -> None:
    flags.DEFINE_string("out", "", "study folder (runs, study.json, report.md)", flag_values=fv)
    flags.DEFINE_string("regime", "checkpoints/reopd_regime", "the regime study's folder "
                        "(cache/ and cold.json)", flag_values=fv)
    flags.DEFINE_boolean("quick", False, "tiny sizes (a test)", flag_values=fv)
    flags.DEFINE_list("parts", [], "parts to run, in order; empty = all", flag_values=fv)
    flags.DEFINE_string("seeds", "", "verdict seeds of the seeds part, 'a-b' (default: the "
                        "registered 0-7)", flag_values=fv)


def main(argv=None) -> int:
    a = _shared.parse(_define, argv, "studies.reopd_gate", G.__doc__)
    parts = tuple(a.parts) or G.PARTS
    bad = [p for p in parts if p not in G.PARTS]
    if bad:
        raise BadInput(f"--parts: unknown part {bad[0]!r}; choose from {list(G.PARTS)}")
    design = G.QUICK if a.quick else G.FULL
    seeds = None
    if a.seeds:
        seeds = _shared.seed_range(a.seeds, "seeds")
        if not set(seeds) <= set(design.seeds):
            raise BadInput(f"--seeds: {a.seeds} is outside the registered verdict seeds "
                           f"{design.seeds[0]}-{design.seeds[-1]}")
    out = Path(a.out)
    try:
        stored = set(json.loads((out / "study.json").read_text()))
    except (OSError, ValueError):
        stored = set()
    _shared.check_prereqs(parts, PREREQ, stored, out)
    G.run(Path(a.regime), out, parts, seeds, a.quick)
    print((out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    cli.run_local(main)
