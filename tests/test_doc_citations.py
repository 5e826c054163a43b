"""Code cites documents that ship with it: a docstring or comment under the packages names a
file of this repository (``docs/latency.md``, ``docs/design.md §3``), never the design notes
kept outside it (``DESIGN §3``, which a reader of the repository cannot open)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("prada_jax", "envs", "evals", "train", "benchmarks", "studies")


def test_no_code_cites_the_design_notes_outside_the_repository():
    bad = []
    for top in PACKAGES:
        for f in sorted((REPO / top).rglob("*.py")):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if re.search(r"(?<![/\w])DESIGN(\.md)?\s*§", line):
                    bad.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert not bad, "cite docs/latency.md or docs/design.md instead:\n" + "\n".join(bad)
