"""Pieces every benchmark command shares: timing a jitted call with its compilation apart, and
writing the result JSON of ``--json``."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import jax

from prada_jax.jsonio import write_json


def time_repeats(fn: Callable, state, repeats: int, *, carry: bool = True):
    """Times ``fn(key, state) -> (state, out)``: one call with ``jax.random.key(1)`` (compile
    and warm-up), then ``repeats`` calls with keys 2, 3, ..., each waited for
    (``block_until_ready``). With ``carry`` each call starts from the state the previous one
    returned; without it every timed call starts from the warm-up's state. Returns
    ``(state, out, compile_s, median_s)``: the last call's state and output, the first call's
    seconds and the median seconds of the timed calls."""
    t0 = time.perf_counter()
    state, out = fn(jax.random.key(1), state)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - t0
    times, last = [], state
    for i in range(repeats):
        t0 = time.perf_counter()
        last, out = fn(jax.random.key(2 + i), last if carry else state)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    return last, out, compile_s, statistics.median(times)


def median_time(fn: Callable, *args, repeats: int = 5) -> float:
    """Median seconds of ``repeats`` calls of ``fn(*args)``, each waited for, after one
    warm-up call (compilation)."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def save_json(path: str | None, result: Any, indent: int = 2) -> None:
    """Writes ``result`` to ``path`` as JSON, creating missing parent folders (as
    ``config_utils.check_output_file``, which checked the path before the run, promises);
    nothing when ``path`` is empty or None."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=indent)


def print_and_save_json(result: Any, path: str | None) -> None:
    """Prints ``result`` as indented JSON and writes it to ``path`` (``jsonio.write_json``)
    when one is given."""
    print(json.dumps(result, indent=2))
    if path:
        write_json(path, result, newline=False)
