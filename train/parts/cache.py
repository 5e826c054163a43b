"""The part cache of ``train.main``'s pipeline: a finished part leaves ``part_done.json``
(its settings key and result) in its folder; a rerun with the same key reuses the result, any
other key (or a damaged marker) redoes the part. Also the log with wall-clock times and the
two loaders every evaluation part shares."""
from __future__ import annotations

import json
import time
from pathlib import Path

from evals import suite
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json

DONE_FILE = "part_done.json"
#: The marker's name in run directories written before the parts were renamed from "stages"
#: (issue 54): read when no ``DONE_FILE`` is there, never written, so such a run is reused.
OLD_DONE_FILE = "stage_done.json"


def part_done(part_dir: Path, settings) -> dict | None:
    """The saved result of a finished part with the same settings, else None."""
    f = Path(part_dir) / DONE_FILE
    if not f.is_file():
        f = Path(part_dir) / OLD_DONE_FILE
        if not f.is_file():
            return None
    try:   # a damaged marker (any malformed JSON) means: redo the part
        data = read_json(f)
    except BadInput:
        return None
    if data.get("settings") != json.loads(json.dumps(settings)):
        return None
    return data


def reuse_finished(part_dir: Path, settings, redo: bool, log, message: str) -> dict | None:
    """The saved result of the part in ``part_dir`` (:func:`part_done`) unless ``redo``, with
    ``message`` logged when there is one; None: the part must run."""
    done = None if redo else part_done(part_dir, settings)
    if done:
        log(message)
    return done


def mark_done(part_dir: Path, settings, result: dict) -> None:
    write_json(Path(part_dir) / DONE_FILE, {"settings": settings, "result": result},
               newline=False)


class Log:
    """Prints part headers with wall-clock times to stdout."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)


def table_traces(config, preset: str, policy) -> "suite.LoadedTraces":
    """The problems every table reports: the ``config.split`` split (test) of the very trace
    set the policy was generated from (same preset, generator seed and problem count), so the
    test problems are ones it never trained on."""
    n = int(policy.config.env.get("problems", 0)) or config.train_problems or None
    return suite.load_traces(preset, n, int(policy.config.env.trace_seed)
                             + suite.HELD_OUT_SEED_OFFSET, split=config.split)


def load_policy_and_multipliers(policy_dir: Path, dual_dir: Path | None):
    """``(policy, (λ_s, µ) or None, the dual run's info)`` of a policy and a dual run."""
    policy = suite.load_policy(str(policy_dir))
    mult, dual_info = None, {}
    if dual_dir is not None:
        lam, mu, dual_info = suite.load_multipliers(str(dual_dir))
        mult = (lam, mu)
    return policy, mult, dual_info
