"""The distillation commands' error contract (the entries of ``prada_jax.distill``): bad input
→ exit 2, exactly one stderr line ``error: ...`` naming the flag/file, nothing written. The
exporter's data errors are covered in ``test_export.py``; ``train.distill`` in
``tests/train/test_distill.py``."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

CASES = [
    # (command, argv with {tmp}, regex of the message, slow)
    ("prada_jax.distill.pool", ["validate", "--pool={tmp}/missing"], r"missing", False),
    ("prada_jax.distill.pool", ["bogus"], r"expected a command", False),
    ("prada_jax.distill.pool", ["convert", "--jsonl={tmp}/x.jsonl", "--tokenizer={tmp}",
                                "--out={tmp}/p"], r"--tokenizer .*no tokenizer files", False),
    ("prada_jax.distill.ratio", ["--pool={tmp}/missing", "--logits={tmp}", "--student={tmp}"],
     r"missing", False),
    ("prada_jax.distill.ratio", ["--kappa-min=2", "--pool=a", "--logits=b", "--student=c"],
     r"--kappa_min", False),   # the former dash spelling still parses
    ("prada_jax.distill.task.evaluate", ["--student={tmp}/missing"], r"--student .*missing",
     False),
    ("prada_jax.distill.task.evaluate", ["--n=0", "--student=x"], r"--n", False),
    ("prada_jax.distill.task.teacher", ["--cache={tmp}/c", "--steps=0"], r"--steps", False),
    ("prada_jax.distill.export", ["--teacher={tmp}/missing", "--pool={tmp}", "--out={tmp}/o"],
     r"--teacher .*missing", False),
    ("prada_jax.distill.export", ["--teacher={tmp}", "--pool={tmp}", "--out={tmp}/o",
                                  "--top-k=3", "--no-progress"], r"--teacher .*no config\.json",
     False),
]


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


@pytest.mark.parametrize("cmd,argv,pattern,slow", [
    pytest.param(*c, marks=[pytest.mark.slow] if c[3] else [], id=f"{c[0]}:{c[1][0]}")
    for c in CASES])
def test_bad_input_exit_2_one_line_nothing_written(tmp_path, cmd, argv, pattern, slow,
                                                   run_command):
    """In-process through each command's ``__main__`` (``run_command``); the real entries run
    as subprocesses in ``tests/test_cli_errors.py``."""
    import re
    before = _tree(tmp_path)
    code, _, err = run_command(cmd, *[a.format(tmp=tmp_path) for a in argv], cwd=ROOT)
    p = subprocess.CompletedProcess(cmd, code, "", err)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-1500:]
    assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), lines
    assert _tree(tmp_path) == before


def test_library_modules_hold_no_main():
    import importlib
    for mod in ("prada_jax.distill.export", "prada_jax.distill.pool", "prada_jax.distill.ratio",
                "prada_jax.distill.task.teacher", "prada_jax.distill.task.evaluate",
                "prada_jax.distill.trainer", "prada_jax.distill.opd",
                "prada_jax.distill.host_update", "prada_jax.distill.evaluation",
                "prada_jax.distill.results", "prada_jax.distill.validation"):
        assert not hasattr(importlib.import_module(mod), "main"), mod
