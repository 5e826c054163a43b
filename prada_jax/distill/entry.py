"""Shared bits of the distillation commands' entry modules (``*/__main__.py``).

:func:`undash` keeps the former argparse spellings working: ``--top-k=8`` / ``--top-k 8``
become ``--top_k=8`` when ``top_k`` is one of the command's flags, and ``--no-progress``
becomes ``--noprogress``. Everything else is left to absl (``prada_jax.cli.parse_local``).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterable, Sequence

from absl import flags

from prada_jax import cli
from prada_jax.errors import BadInput
from prada_jax.lm.hf import load_hf


def undash(argv: Sequence[str] | None, names: Iterable[str]) -> list[str]:
    """``argv`` (default ``sys.argv[1:]``) with dash spellings of ``names`` rewritten."""
    names = set(names)
    out = []
    for a in list(sys.argv[1:] if argv is None else argv):
        if a.startswith("--") and "-" in a[2:].split("=", 1)[0]:
            key, eq, val = a[2:].partition("=")
            new = key.replace("-", "_")
            if new in names:
                a = f"--{new}{eq}{val}"
            elif new.startswith("no_") and new[3:] in names:
                a = f"--no{new[3:]}{eq}{val}"
        out.append(a)
    return out


def flag_names(define: Callable) -> list[str]:
    """Names of the flags ``define(flag_values)`` declares (in a throwaway ``FlagValues``)."""
    fv = flags.FlagValues()
    define(fv)
    return list(fv)


def parse(define: Callable, argv: Sequence[str] | None, prog: str, doc: str | None):
    """``prada_jax.cli.parse_local`` of ``argv`` with its dash spellings rewritten first."""
    return cli.parse_local(define, undash(argv, flag_names(define)), prog, doc)


def load_student(path: str, flag: str = "--student"):
    """``(model, config)`` of the Hugging Face student folder ``path`` (``lm.hf.load_hf``);
    ``BadInput`` naming ``flag`` if the folder is missing or does not load."""
    if not Path(path).is_dir():
        raise BadInput(f"{flag} {path}: student folder not found")
    try:
        return load_hf(path)
    except (OSError, ValueError, KeyError) as e:
        raise BadInput(f"{flag} {path}: cannot load the model ({cli.one_line(e)})") from None
