"""A ratchet on function-local imports (issue 34 item 4).

An ``import`` inside a function hides a dependency from the module's header and from the
import-linter contracts' reader, so each one needs a reason: a ``# lazy: <why>`` comment on
its line or on the line just above it (e.g. ``# lazy: torch is an optional extra``). The count
of function-local imports WITHOUT a reason, over the project's source packages (tests
excluded), may not exceed ``CEILING``; when it falls, lower ``CEILING`` to the new count in the
same commit (the test says so), so the count can only go down.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("prada_jax", "envs", "evals", "train", "benchmarks", "studies")
#: The ceiling's history, oldest first: ``(ceiling, reason)``. Lower it (append a row) as the
#: count falls. A raise is refused unless its row's reason starts with ``"raise: "`` and says
#: why in a sentence (test_ceiling_history_explains_every_raise), so a raise is a reviewed
#: line in this file, never a silent edit.
CEILING_HISTORY = [
    (258, "issue 46: the count when the history began (was raised once by 57 before it)"),
    (20, "issue 46: the studies' and distill's imports at module level, torch/transformers/"
         "tensorboard/pyplot waits marked with their reasons"),
    (0, "issue 46: studies/distill_claims' imports at module level too"),
]
CEILING = CEILING_HISTORY[-1][0]
MARK = "# lazy:"


def local_imports(source: str, filename: str = "<src>") -> list[tuple[int, bool]]:
    """``[(line, has_reason)]`` for every import statement nested in a function body.

    ``has_reason``: the statement's first line, or a comment line just above it, carries
    ``# lazy:`` followed by a non-empty reason.
    """
    tree = ast.parse(source, filename)
    lines = source.splitlines()

    def reasoned(lineno: int) -> bool:
        def has(i: int) -> bool:
            return 0 <= i < len(lines) and MARK in lines[i] and bool(
                lines[i].split(MARK, 1)[1].strip())
        above = lineno - 2   # the line above counts only when it is a comment line
        return has(lineno - 1) or (has(above) and lines[above].lstrip().startswith("#"))

    out: list[tuple[int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child.lineno, reasoned(child.lineno)))
            visit(child, inside)

    visit(tree, False)
    return out


def project_files() -> list[Path]:
    files = []
    for pkg in PACKAGES:
        root = REPO / pkg
        if root.is_dir():
            files.extend(sorted(root.rglob("*.py")))
    return files


def unmarked_count() -> tuple[int, list[str]]:
    where = []
    for f in project_files():
        for line, ok in local_imports(f.read_text(), str(f)):
            if not ok:
                where.append(f"{f.relative_to(REPO)}:{line}")
    return len(where), where


def test_counter_counts_only_unreasoned_function_local_imports():
    src = (
        "import os\n"
        "def f():\n"
        "    import json\n"                       # 1: unmarked
        "    # lazy: torch is an optional extra\n"
        "    import torch\n"                      # marked on the line above
        "    from math import pi  # lazy: cheap, keeps the header short\n"  # marked inline
        "    from sys import path  # lazy:\n"     # empty reason: unmarked
        "    class C:\n"
        "        def g(self):\n"
        "            import re\n"                 # nested: unmarked
        "    return json, torch, pi, path, C\n"
        "class K:\n"
        "    import abc\n"                        # class body, not a function: not counted
    )
    got = local_imports(src)
    assert [line for line, ok in got if not ok] == [3, 7, 10]
    assert [line for line, ok in got if ok] == [5, 6]


def test_unmarked_function_local_imports_do_not_grow():
    n, where = unmarked_count()
    assert n <= CEILING, (
        f"{n} function-local imports lack a '# lazy: <reason>' comment (ceiling {CEILING}); "
        f"add a reason or move the import to the module header. Newest offenders: "
        f"{where[-10:]}")
    if n < CEILING:
        # The ratchet: a lower count must be recorded so it cannot silently regrow.
        raise AssertionError(f"only {n} unmarked function-local imports now: append "
                             f"({n}, '<why>') to CEILING_HISTORY in {Path(__file__).name}")


def test_ceiling_history_explains_every_raise():
    """Each row lowers the ceiling, or raises it with a ``raise: <why>`` reason of a sentence."""
    assert CEILING_HISTORY, "CEILING_HISTORY is empty"
    for (before, _), (after, why) in zip(CEILING_HISTORY, CEILING_HISTORY[1:]):
        assert isinstance(after, int) and after >= 0, f"bad ceiling {after!r}"
        if after > before:
            reason = why.removeprefix("raise: ") if why.startswith("raise: ") else ""
            assert len(reason.split()) >= 5, (
                f"CEILING raised {before} -> {after} without a reason: the row's reason must "
                f"start with 'raise: ' and say why in a sentence (got {why!r})")


def test_ceiling_history_check_refuses_an_unexplained_raise(monkeypatch):
    import sys
    mod = sys.modules[__name__]
    monkeypatch.setattr(mod, "CEILING_HISTORY", [(100, "start"), (120, "more imports")])
    try:
        test_ceiling_history_explains_every_raise()
    except AssertionError as e:
        assert "without a reason" in str(e)
    else:
        raise AssertionError("an unexplained raise passed")
    monkeypatch.setattr(mod, "CEILING_HISTORY", [
        (100, "start"), (120, "raise: the torch extra moved into the core dependencies")])
    test_ceiling_history_explains_every_raise()
