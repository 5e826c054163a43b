"""The evaluation protocol: which problems and which seeds belong to train, validation and test.

Problems. A trace set is split by problem into three disjoint parts that together hold every
problem. The split is a list of problem indices per part, recorded in ``meta.json`` under
``splits`` (``{"train": [...], "validation": [...], "test": [...]}``, each sorted), so a real
trace set is split once by index and every command reads the same parts. A synthetic set gets
its split from :func:`problem_split`, drawn from its own random stream after the set is
generated: the feature projection and the calibration are drawn from the whole set whatever
lands where, so the three parts share one feature map.

Seeds. A seed is an integer fed to ``jax.random.key``. Training runs use seeds in
``[0, VALIDATION_SEED_BASE)``; evaluations on the validation split use
``VALIDATION_SEED_BASE + seed0 + s``, every other table (test, and train or all problems
when asked) ``TEST_SEED_BASE + seed0 + s`` (``s < seeds``), so the three ranges are disjoint by
construction; :func:`evaluation_seeds` and :func:`check_training_seeds` refuse a request that
would leave its range or meet another.
"""
from __future__ import annotations

import numpy as np

from prada_jax.errors import BadInput

#: The parts of a trace set, in the order they are written to ``meta.json``.
SPLITS = ("train", "validation", "test")
#: ``--split`` value that selects every problem (a number on it includes training problems).
ALL = "all"
#: Default shares of problems (train, validation, test).
DEFAULT_FRACTIONS = (0.7, 0.15, 0.15)
#: Stream tag that keeps the split's random draws apart from the trace generator's.
_SPLIT_STREAM = 0x5B117

#: Seed ranges: [0, VALIDATION_SEED_BASE) training; then validation; then test.
SEED_RANGE = 1_000_000
VALIDATION_SEED_BASE = SEED_RANGE
TEST_SEED_BASE = 2 * SEED_RANGE
_SEED_BASE = {"train": 0, "validation": VALIDATION_SEED_BASE, "test": TEST_SEED_BASE}


class SplitError(BadInput):
    """A bad split request or split record; the message names the flag, field or file."""


def problem_split(num_problems: int, seed: int = 0,
                  fractions=DEFAULT_FRACTIONS) -> dict[str, list[int]]:
    """A random split of ``num_problems`` problem indices: ``{part: sorted indices}``.

    Sizes: ``round(f · P)`` for validation and test (at least 1 each when P ≥ 3), the rest
    train. The permutation comes from ``np.random.default_rng([seed, _SPLIT_STREAM])``, a
    stream of its own, so it never shifts what the generator draws.
    """
    p = int(num_problems)
    if p < 1:
        raise SplitError(f"cannot split {p} problems")
    f = [float(x) for x in fractions]
    if len(f) != 3 or min(f) < 0 or not np.isclose(sum(f), 1.0):
        raise SplitError(f"split fractions must be 3 numbers >= 0 summing to 1, got {fractions}")
    n_val = int(round(f[1] * p))
    n_test = int(round(f[2] * p))
    if p >= 3:
        n_val, n_test = max(n_val, 1 if f[1] > 0 else 0), max(n_test, 1 if f[2] > 0 else 0)
    n_train = p - n_val - n_test
    if n_train < 1:
        raise SplitError(f"{p} problems leave no training problem with fractions {fractions}")
    perm = np.random.default_rng([int(seed), _SPLIT_STREAM]).permutation(p)
    parts = (perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:])
    return {name: sorted(int(i) for i in part) for name, part in zip(SPLITS, parts)}


def check_splits(splits, num_problems: int, where: str = "meta.json") -> dict[str, list[int]]:
    """Validates a ``splits`` record against ``num_problems``; returns it with int lists.

    Raises :class:`SplitError` (``.field``, ``.problem`` set) naming ``where`` and the part: a
    dict with exactly the keys of :data:`SPLITS`, each a list of problem indices in
    ``[0, P)``, disjoint, together every problem, train not empty.
    """
    def bad(field, problem):
        e = SplitError(f"{where}: field '{field}': {problem}")
        e.field, e.problem = field, problem
        return e

    if not isinstance(splits, dict) or set(splits) != set(SPLITS):
        raise bad("splits", f"must be an object with keys {', '.join(SPLITS)}")
    out, seen = {}, np.zeros(int(num_problems), np.int64)
    for name in SPLITS:
        ids = splits[name]
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise bad(f"splits.{name}", "must be a list of problem indices")
        a = np.asarray(ids, np.int64)
        if a.size and (a.min() < 0 or a.max() >= num_problems):
            raise bad(f"splits.{name}", f"has a problem index outside [0, {num_problems})")
        np.add.at(seen, a, 1)
        out[name] = sorted(int(i) for i in ids)
    if np.any(seen > 1):
        raise bad("splits", f"problem {int(np.argmax(seen > 1))} is in more than one part")
    if np.any(seen == 0):
        raise bad("splits", f"problem {int(np.argmin(seen > 0))} is in no part")
    if not out["train"]:
        raise bad("splits.train", "is empty")
    return out


def check_split_name(split, name: str = "--split") -> str | None:
    """``split`` as a part name, or None for :data:`ALL` / None; :class:`SplitError` naming
    ``name`` for anything else."""
    if split is None or split == ALL:
        return None
    if split not in SPLITS:
        raise SplitError(f"{name}={split}: unknown split; choose from "
                         f"{', '.join(SPLITS + (ALL,))}")
    return str(split)


def subset_problems(traces, problem_ids):
    """The trace set restricted to ``problem_ids`` (sorted, distinct), renumbered: problem j of
    the result is ``problem_ids[j]``; node ids, ``child``, ``fallback`` and ``root`` follow
    (edges never leave a problem). Arrays are NumPy; the type is the input's ``TraceSet``."""
    tr = {k: np.asarray(v) for k, v in traces.to_dict().items()}
    ids = np.asarray(problem_ids, np.int64)
    keep = np.isin(tr["problem"], ids)
    old_nodes = np.nonzero(keep)[0]
    new_of_old = np.full(tr["problem"].shape[0], -1, np.int64)
    new_of_old[old_nodes] = np.arange(old_nodes.size)
    new_problem = np.full(tr["root"].shape[0], -1, np.int64)
    new_problem[ids] = np.arange(ids.size)
    remap = lambda a: np.where(a >= 0, new_of_old[np.maximum(a, 0)], -1)  # noqa: E731
    out = {}
    for k, v in tr.items():
        if k in ("root", "n_nodes", "answer_id"):
            continue
        out[k] = v[keep]
    out["child"] = remap(out["child"]).astype(tr["child"].dtype)
    out["fallback"] = remap(out["fallback"]).astype(tr["fallback"].dtype)
    out["problem"] = new_problem[out["problem"]].astype(tr["problem"].dtype)
    out["root"] = new_of_old[tr["root"][ids]].astype(tr["root"].dtype)
    out["n_nodes"] = tr["n_nodes"][ids]
    out["answer_id"] = tr["answer_id"][ids]
    return type(traces)(**out)


def seed_base(split) -> int:
    """First evaluation seed for a table on ``split``: the validation range for
    ``validation`` (choices), else the test range (tables on test, train or every problem
    share the evaluation seeds, so a train-vs-test gap is paired)."""
    return VALIDATION_SEED_BASE if split == "validation" else TEST_SEED_BASE


def check_seed_ranges(ranges: dict) -> None:
    """Refuses overlapping seed ranges: ``ranges`` maps a label (naming the flags or run that
    set it) to ``(first, stop)``; raises :class:`SplitError` naming the first overlapping
    pair."""
    items = [(str(k), int(a), int(b)) for k, (a, b) in ranges.items() if int(b) > int(a)]
    for i, (ka, a0, a1) in enumerate(items):
        for kb, b0, b1 in items[i + 1:]:
            if a0 < b1 and b0 < a1:
                raise SplitError(f"seed ranges overlap: {ka} [{a0}, {a1}) and {kb} "
                                 f"[{b0}, {b1})")


def evaluation_seeds(split, seed0: int, seeds: int, train_seeds=(),
                     flag: str = "--seed0/--seeds") -> tuple[int, int]:
    """``(first, stop)`` of the evaluation seeds for ``seed0`` and ``seeds`` on ``split``,
    checked at start: they stay in their range (validation or test) and apart from the other
    ranges and from ``train_seeds`` (the policy run's training seeds, ``policy_meta.json``).
    Raises :class:`SplitError` naming ``flag``."""
    base = seed_base(split)
    if int(seed0) < 0 or int(seeds) < 1:
        raise SplitError(f"{flag}: seed0 must be >= 0 and seeds >= 1, got {seed0}, {seeds}")
    first, stop = base + int(seed0), base + int(seed0) + int(seeds)
    label = "validation" if base == VALIDATION_SEED_BASE else "test"
    others = {"training seeds": (0, VALIDATION_SEED_BASE)}
    if label == "validation":
        others["test seeds"] = (TEST_SEED_BASE, TEST_SEED_BASE + SEED_RANGE)
    else:
        others["validation seeds"] = (VALIDATION_SEED_BASE, TEST_SEED_BASE)
    others["seeds past the test range"] = (TEST_SEED_BASE + SEED_RANGE, 2 ** 62)
    for s in sorted(int(x) for x in train_seeds):
        others[f"the policy's training seed {s}"] = (s, s + 1)
    mine = f"{flag} ({label} evaluation seeds)"
    for name, rng in others.items():
        check_seed_ranges({mine: (first, stop), name: rng})
    return first, stop


def check_training_seeds(seed: int, num_seeds: int, flag: str = "config.seed") -> None:
    """Refuses training seeds outside ``[0, VALIDATION_SEED_BASE)`` (they would meet the
    validation or test seeds); :class:`SplitError` naming ``flag``."""
    check_seed_ranges({f"{flag}/config.num_seeds (training)": (int(seed), int(seed) +
                                                                int(num_seeds)),
                       "validation and test seeds": (VALIDATION_SEED_BASE, 3 * SEED_RANGE)})
    if int(seed) < 0:
        raise SplitError(f"{flag}={seed}: must be >= 0")

