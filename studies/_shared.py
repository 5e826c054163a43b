"""Machinery the study commands share (not a study: no command, no results).

One module, not a folder: under ``studies/`` a folder is a study (docs/design.md, "a study is one
folder"); the leading underscore says this file is none. It holds what two or more studies
did alike: the command preamble (flags parsed, ``--out`` required, a seed range, a task cache's
folders, the parts' prerequisites), the parts loop that merges each part into the study's JSON
and rewrites its report, the timestamped log, and the report's number cells. Statistics live
in ``prada_jax.stats``; a study's resume machinery in its own folder
(``studies.reopd_kg.resume``).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from evals import suite
from prada_jax import cli, config_utils
from prada_jax import latency as lat
from prada_jax.config_utils import SEED_MAX
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json

#: The most seeds a study's seed range may hold (each seed is a training run; the registered
#: studies use 20 and 3). Checked before the range is built: ``--seeds=0-99999999`` took
#: 10 GB before it was refused.
MAX_STUDY_SEEDS = 1000
#: The folders of a task cache every ReOPD study reads.
CACHE_PARTS = ("pool", "logits", "teacher")


# ---------------------------------------------------------------------------- the command
def parse(define: Callable, argv: Sequence[str] | None, prog: str, doc: str | None):
    """A study command's flags (``cli.parse_local``), Hugging Face offline for the process,
    and ``--out`` required; returns the parsed flags."""
    cli.hub_offline()
    a = cli.parse_local(define, argv, prog, doc)
    if not a.out:
        raise BadInput("--out: required")
    return a


def pairs_and_out(pairs: Sequence[str], out: str | None, study: str) -> tuple[list, Path]:
    """The capacity-type studies' checks (``--out`` required and not a file; ``--pairs`` not
    empty, each a known pair and not the paper's, which has no serving server): the pairs
    without repeats and the output folder; ``BadInput`` naming the flag otherwise."""
    config_utils.require_flag(out, "--out", "the study folder")
    pairs = list(dict.fromkeys(pairs))
    if not pairs:
        raise BadInput("--pairs: empty list")
    for pair in pairs:
        suite.check_hardware(pair, "--pairs")
        if pair == lat.PAPER:
            raise BadInput(f"--pairs=paper: the {study} study needs a roofline pair (the "
                           "serving server)")
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"--out={out} exists and is not a folder")
    return pairs, folder


def at_least_one(a, *names: str) -> None:
    """Refuses any of the integer flags ``names`` below 1."""
    for name in names:
        v = getattr(a, name)
        if v < 1:
            raise BadInput(f"--{name}: must be >= 1, got {v}")


def seed_range(text: str, flag: str) -> tuple:
    """The seeds of ``'a-b'`` (or ``'a'``) as a tuple; anything else, a range outside the PRNG's
    seeds or longer than :data:`MAX_STUDY_SEEDS`: ``BadInput`` naming ``--flag``."""
    try:
        a, _, b = text.partition("-")
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise BadInput(f"--{flag}: expected 'a-b' or 'a', got {text!r}"[:300]) from None
    if lo < 0 or hi < lo:
        raise BadInput(f"--{flag}: need 0 <= a <= b, got {text!r}")
    if hi > SEED_MAX:
        raise BadInput(f"--{flag}: {text}: seeds must lie in [0, {SEED_MAX}] (the PRNG's range)")
    if hi - lo + 1 > MAX_STUDY_SEEDS:
        raise BadInput(f"--{flag}: {text} is {hi - lo + 1} seeds; a study runs at most "
                       f"{MAX_STUDY_SEEDS} (one training run each)")
    return tuple(range(lo, hi + 1))


def check_cache(cache: Path, flag: str = "cache", hint: str = "") -> None:
    """Refuses a task cache without one of :data:`CACHE_PARTS` (``hint``: how to build one)."""
    for sub in CACHE_PARTS:
        if not (Path(cache) / sub).is_dir():
            raise BadInput(f"--{flag}: {Path(cache) / sub} not found"
                           + (f" (build one with python -m {hint})" if hint else ""))


def check_prereqs(parts: Sequence[str], prereq: dict, stored: Iterable[str], out: Path) -> None:
    """Refuses a part whose prerequisite (``prereq[part]``) neither runs before it in ``parts``
    nor has results among ``stored`` (the parts already in the study's JSON)."""
    stored = set(stored)
    for i, p in enumerate(parts):
        for need in prereq.get(p, ()):
            if need not in parts[:i] and need not in stored:
                raise BadInput(f"--parts: {p} needs the {need} part's results ({out} has "
                               f"none; run --parts={need} first)")


def need(res: dict, part: str) -> dict:
    """``res[part]``, or ``BadInput`` saying which part to run first."""
    if part not in res:
        raise BadInput(f"--parts: needs the {part} part's results first (run --parts={part})")
    return res[part]


# ---------------------------------------------------------------------------- running parts
def utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


class Log:
    """A study's timestamped log: each line printed at once and kept in ``log``."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def say(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.log.append(line)


def run_parts(res: dict, parts: Sequence[str], run_part: Callable[[str], dict | None],
              logger: Log, path: Path, report: Path, markdown: Callable[[dict], str]) -> dict:
    """Runs ``parts`` in order: ``res[part] = run_part(part)`` (None: the part was reused and
    nothing changes), stamped with its start (UTC) and wall seconds; the logger's new lines
    appended to ``res["log"]``; then ``res`` written to ``path`` (atomic) and
    ``markdown(res)`` to ``report``, so a study stopped later keeps every finished part."""
    for part in parts:
        t0, started = time.perf_counter(), utc()
        got = run_part(part)
        if got is None:
            continue
        res[part] = got
        got["started_utc"] = started
        got["part_wall_s"] = time.perf_counter() - t0
        res["log"] = res.get("log", []) + logger.log
        logger.log = []
        write_json(path, res, indent=1, newline=False)
        Path(report).write_text(markdown(res))
    return res


# ---------------------------------------------------------------------------- report cells
def fmt(x, d: int = 3) -> str:
    """``x`` with ``d`` decimals; "n/a" for None or a non-finite float."""
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{d}f}"


def mean_cell(xs: Iterable) -> str:
    """The mean of the values of ``xs`` that are not None (:func:`fmt`), "n/a" if none is."""
    got = [x for x in xs if x is not None]
    return fmt(sum(got) / len(got)) if got else "n/a"
