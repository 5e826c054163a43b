"""Every dotted module name (``prada_jax.…``, ``envs.…``, ``evals.…``, ``train.…``,
``benchmarks.…``, ``studies.…``, ``tests.…``) and every repository path (``docs/…``,
``evals/capacity/study.py``, …) cited in a ``.py`` or ``.md`` file of the repository resolves
(issue 54 item 3): a module or package exists, and its first attribute, if any, is defined at
its top level (read with ``ast``: nothing is imported). Config fields (``train.steps``) and
TensorBoard tags (``train/loss``) are not names of the tree and are skipped.

A name that no longer exists may still appear where the text is a record of its time: on the
record pages (``docs/history.md``, ``docs/results/README.md``: what moved where; a study's
pages and records, whose registrations stay as registered), and in any line that says so
(``(was …``, "when it ran", "of that time", "no longer", "moved from", …, or one of the two
lines before it does). Present-tense pages, docstrings and comments must name what exists.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPS = ("prada_jax", "envs", "evals", "train", "benchmarks", "studies", "tests")
DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(TOPS))
PATH = re.compile(r"(?<![\w./-])((?:%s|docs)/[\w./-]*[\w/])" % "|".join(TOPS))
#: A line (or one of the two before it) that marks a name as a record of its time.
HISTORICAL = re.compile(r"\(was\b|\bwas `|old path|formerly|moved from|no longer|of that time|"
                        r"renamed|deleted|when it ran|names? quoted below|not a module|"
                        r"registration names|It ran as|ran first as|\band not\b")
SKIP_PARTS = {".venv", "checkpoints", ".git", ".pytest_cache", "node_modules"}


def _is_record_page(rel: str) -> bool:
    return (rel in ("docs/history.md", "docs/results/README.md")
            or (rel.startswith("studies/") and (rel.endswith(".md") or "/results/" in rel)))


def _module_file(parts) -> Path | None:
    p = REPO.joinpath(*parts)
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py")
    if p.is_dir():
        return p
    return None


@functools.lru_cache(maxsize=None)
def _top_names(path: Path) -> frozenset:
    """Names a module binds anywhere in its file (defs, classes, assignments, imports,
    arguments): generous on purpose, so only a name nowhere in the file fails."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        f = _module_file(parts[:k])
        if f is None:
            continue
        rest = parts[k:]
        if not rest:
            return True
        return f.is_file() and rest[0] in _top_names(f)
    return False


def _files():
    for top in TOPS:
        yield from sorted((REPO / top).rglob("*.py"))
    yield from sorted(p for p in REPO.rglob("*.md") if not SKIP_PARTS & set(p.parts))


def unresolved() -> list[str]:
    bad = []
    for f in _files():
        if SKIP_PARTS & set(f.relative_to(REPO).parts):
            continue
        rel = str(f.relative_to(REPO))
        if rel == "tests/test_doc_names.py":
            continue                              # names missing things on purpose
        lines = f.read_text().splitlines()
        for i, line in enumerate(lines):
            if any(HISTORICAL.search(x) for x in lines[max(i - 2, 0):i + 1]):
                continue
            for m in DOTTED.finditer(line):
                name = m.group(1)
                if name.endswith((".py", ".md", ".json", ".png", ".txt", ".csv")):
                    continue
                if f.suffix == ".py" and line[m.end():m.end() + 1] == "(":
                    continue                      # a call on a variable named like a package
                if name.startswith("train.") and _module_file(name.split(".")[:2]) is None:
                    continue                      # a config field (config.train.steps)
                if resolves(name) or _is_record_page(rel):
                    continue
                bad.append(f"{rel}:{i + 1}: {name}")
            for m in PATH.finditer(line):
                p = m.group(1).split("#")[0].rstrip(".:,)")
                if any(c in p for c in "*<{") or line[m.end():m.end() + 1] in "*{<":
                    continue                      # a pattern, not a path
                if p.startswith("train/") and not p.endswith(".py"):
                    continue                      # a TensorBoard tag (train/loss)
                if (REPO / p).exists() or (REPO / (p + ".py")).exists():
                    continue
                if _is_record_page(rel):
                    continue                      # records cite paths as they were
                bad.append(f"{rel}:{i + 1}: {p}")
    return bad


def test_every_cited_module_and_path_resolves():
    bad = unresolved()
    assert not bad, ("names or paths that do not exist (fix the text, or mark a record of its "
                     "time):\n" + "\n".join(bad))


def test_the_resolver_can_fail():
    assert resolves("evals.capacity.study.run_study")
    assert not resolves("evals.capacity.study.no_such_function")
    assert not resolves("evals.stage2")
    assert resolves("envs.prefix_cache.evict_lru")
