"""The import-linter contracts of pyproject.toml (layers, forbidden imports, no sibling cycles)
hold on the tree, and a broken contract makes the runner fail."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the [dev] extra")

REPO = Path(__file__).resolve().parents[1]


_EDGE = re.compile(r"^-\s+(\S+) -> (\S+)(?: \(.*\))?$")
_CYCLE_PACKAGE = re.compile(r"^No cycles are allowed in (\S+)\.$")


def lint_imports(cwd: Path, config: str | None = None) -> subprocess.CompletedProcess:
    """``lint-imports --no-cache`` in ``cwd`` (importable from there), output captured."""
    cmd = [sys.executable, "-c",
           "import sys; from importlinter.cli import lint_imports_command; "
           "sys.exit(lint_imports_command())", "--no-cache"]
    if config:
        cmd += ["--config", config]
    env = dict(os.environ, PYTHONPATH=str(cwd), NO_COLOR="1", COLUMNS="200")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def violations(output: str) -> tuple[set[tuple[str, str]], list[str]]:
    """``(edges, unparsed)``: the (importer, imported) pairs of the broken contracts, and the
    report lines that look like part of a violation but are not a single direct edge (an
    indirect chain), which the caller treats as unknown."""
    edges, unparsed, package = set(), [], None
    body = output.split("Broken contracts", 1)[1] if "Broken contracts" in output else ""
    for line in body.splitlines():
        m = _CYCLE_PACKAGE.match(line.strip())
        if m:
            package = m.group(1)
            continue
        m = _EDGE.match(line.strip())
        if m:
            a, b = m.group(1), m.group(2)
            if a.startswith(".") and package:   # acyclic_siblings names siblings relatively
                a, b = package + a, package + b
            edges.add((a, b))
        elif "->" in line and line[:1] in (" ", "-"):   # a link of an indirect chain
            unparsed.append(line)
    return edges, unparsed


def test_layer_contracts_hold():
    r = lint_imports(REPO)
    out = r.stdout + r.stderr
    assert "Contracts:" in out, out[-3000:]   # the runner read the config and checked it
    edges, unparsed = violations(out)
    assert r.returncode == 0, f"layer violations {sorted(edges)} {unparsed}:\n{out[-4000:]}"


def _package(root: Path, low_imports_high: bool) -> None:
    pkg = root / "layerpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from layerpkg import low\n")
    (pkg / "low.py").write_text("from layerpkg import high\n" if low_imports_high else "X = 1\n")
    (root / "contracts.toml").write_text(textwrap.dedent("""\
        [tool.importlinter]
        root_packages = ["layerpkg"]

        [[tool.importlinter.contracts]]
        name = "high above low"
        type = "layers"
        layers = ["layerpkg.high", "layerpkg.low"]
        """))


@pytest.mark.parametrize("broken", [False, True])
def test_a_broken_contract_fails(tmp_path, broken):
    """The same runner on a two-module package: kept when only high imports low, and a
    non-zero exit naming the edge when low imports high too."""
    _package(tmp_path, low_imports_high=broken)
    _kept_or_broken_by(tmp_path, ("layerpkg.low", "layerpkg.high") if broken else None)


def _kept_or_broken_by(root: Path, edge: tuple[str, str] | None) -> None:
    """``lint-imports`` on ``root/contracts.toml``: exit 0 if ``edge`` is None, else a
    non-zero exit whose broken contracts name exactly ``edge``."""
    r = lint_imports(root, "contracts.toml")
    out = r.stdout + r.stderr
    assert "Contracts:" in out, out[-3000:]
    if edge is None:
        assert r.returncode == 0, out[-3000:]
        return
    assert r.returncode != 0
    edges, _ = violations(out)
    assert edges == {edge}, out[-3000:]


def _contract(contract_id: str) -> dict:
    """The contract ``contract_id`` as pyproject.toml declares it."""
    with open(REPO / "pyproject.toml", "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c.get("id") == contract_id)


def _toml_value(v) -> str:
    return "[" + ", ".join(f'"{x}"' for x in v) + "]" if isinstance(v, list) else f'"{v}"'


@pytest.mark.parametrize("broken", [False, True])
def test_the_library_importing_envs_breaks_its_contract(tmp_path, broken):
    """pyproject.toml's own "library-not-envs" contract on a skeleton of the two packages: kept
    while the trainer builds no env, broken, naming the edge, once ``from envs import edge`` is
    back inside the library (DESIGN §1: trainers take their env as an argument)."""
    for d in ("prada_jax", "prada_jax/rl", "envs"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "envs" / "edge.py").write_text("X = 1\n")
    (tmp_path / "prada_jax" / "rl" / "trainer.py").write_text(
        "from envs import edge\n" if broken else "X = 1\n")
    contract = _contract("library-not-envs")
    body = "\n".join(f"{k} = {_toml_value(v)}" for k, v in contract.items())
    (tmp_path / "contracts.toml").write_text(
        '[tool.importlinter]\nroot_packages = ["prada_jax", "envs"]\n\n'
        f"[[tool.importlinter.contracts]]\n{body}\n")
    _kept_or_broken_by(tmp_path, ("prada_jax.rl.trainer", "envs.edge") if broken else None)
