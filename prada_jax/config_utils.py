"""Helpers shared by the launchers: validate config fields, write the resolved config, start-up.

Validation raises ``ConfigError`` (a ``ValueError``) whose message names the field as the user
types it on the command line, e.g. ``config.ppo.lr must be > 0, got -0.001``.

Typical launcher::

    def train_and_evaluate(config, workdir):
        check_positive(config, "ppo.lr")
        check_divides(config, "ppo.minibatch_size", batch, batch_name="num_envs*rollout_len")
        workdir = prepare_workdir(workdir)
        write_config_json(config, workdir)          # <workdir>/config.json
        ...

    def main(argv):
        reject_extra_argv(argv)
        logging.info(host_info.runtime_info())
        train_and_evaluate(FLAGS.config, FLAGS.workdir)
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import ml_collections

from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json

__all__ = [
    "ConfigError", "get_field", "check", "check_positive", "check_nonnegative", "check_range",
    "check_int", "check_choice", "check_divides", "config_to_dict", "config_to_json",
    "write_config_json", "read_config_json", "check_run_dir", "prepare_workdir",
    "reject_extra_argv", "require_flag", "set_field", "parse_variants", "apply_variants",
    "REMOVED_FIELDS", "ADDED_FIELDS", "AddedField", "add_missing_fields", "config_kind",
    "is_removed", "drop_removed_fields", "check_float32",
    "float32_problem", "seed_problem", "INFINITE_OK", "SEED_MAX", "SEED_COUNT_MAX",
]

# Config fields that no longer exist: dotted name (or a whole section) -> why it went. A stored
# config.json that still holds one resumes: the resume check (run_state.check_resume) drops
# these fields from both sides before comparing, and the next config.json written lacks them.
# A field not listed here that the stored config has and the new one lacks is still refused.
# Register a field here when deleting it from a config in prada_jax/configs/.
REMOVED_FIELDS: dict[str, str] = {
    "dual.queue_price": "the admission price is the threshold rule itself (it was always True)",
}


class AddedField(NamedTuple):
    """A config field added after runs were stored: ``before`` is the value that describes how
    a run stored without it behaved, ``configs`` the config files that have it (``ppo``,
    ``dual``, ``distill``: :func:`config_kind`), ``added`` the commit / issue that added it."""

    before: Any
    configs: tuple[str, ...]
    added: str


# Config fields added after runs were stored (the one table; :data:`REMOVED_FIELDS` lists the
# other direction). A stored config.json lacking one is read as holding ``before``: by
# :func:`read_config_json` (:func:`add_missing_fields`), so code reading a stored config never
# branches on a field's absence, and by the resume check (run_state.check_resume), so an old
# run resumes when the new config keeps the old behaviour and is refused (naming the field)
# when it would change it. Register a field here when adding one whose absence a stored
# config.json can show.
ADDED_FIELDS: dict[str, AddedField] = {
    # before train/validation/test splits every problem was trained on
    "env.split": AddedField("all", ("ppo", "dual"), "3494956 (config.env.split)"),
    # before hardware pairs every run used the paper's FLOP clock
    "env.hardware": AddedField("paper", ("ppo", "dual"), "6bf8362 (hardware pairs)"),
    # before the serving server (issue 41) a roofline pair ran the legacy batching server
    "env.server_model": AddedField("legacy", ("ppo", "dual"), "issue 41 (serving server)"),
    # stage 2 before scenario schedules: the stationary load, no time-varying schedule
    "env.scenario": AddedField("nominal", ("dual",), "1eb8ad0 (per-scenario stage 2)"),
    "env.scenario_length": AddedField(1200, ("dual",), "1eb8ad0 (per-scenario stage 2)"),
    # before server speeds: servers at the nominal speed
    "env.server_speed": AddedField(1.0, ("dual",), "f5c0148 (binding shares per slot)"),
    # before critic nominations: the actor nominated
    "policy.nominate_by": AddedField("actor", ("dual",), "033a6d1 (policy.nominate_by)"),
    # before it: gap.json held no long-run env outcome (env_chunks = 0 leaves it out)
    "eval.env_chunks": AddedField(0, ("dual",), "0fe34ae (eval.env_chunks)"),
    # before V critics: the Q(s, a) head
    "net.critic": AddedField("q", ("ppo",), "deed918 (decision-only update, net.critic)"),
    # before the switch: the diagnostics were always logged
    "ppo.diagnostics": AddedField(True, ("ppo",), "ca9d4c4 (ppo.diagnostics)"),
    # before seeds as a batch axis: one student per run
    "train.num_seeds": AddedField(1, ("distill",), "fef1781 (distill train.num_seeds)"),
    # before prompt buckets: full-width prompts
    "train.prompt_bucket": AddedField(0, ("distill",), "bf94be3 (distill prompt buckets)"),
    # before the hold: κ = exp(−c̄) was always used (never held)
    "sampler.auto_gap_max": AddedField(float("inf"), ("distill",),
                                       "26fd5f0 (--kappa=auto holds κ)"),
    # before the switch: the students were always evaluated before training
    "eval.before": AddedField(True, ("distill",), "d169540 (distill eval.before)"),
    # before eval points: only the before / after evaluations
    "eval.every": AddedField(0, ("distill",), "9da2d9b (distill eval.every)"),
    # before warm-started optimisers: a fresh optimiser state
    "optim.carry_from": AddedField("", ("distill",), "bf94be3 (distill optim.carry_from)"),
    # before the exact and baselined arms: the single-sample reverse-KL policy gradient
    "loss.rkl_estimator": AddedField("pg", ("distill",), "issue 44 (loss.rkl_estimator)"),
}

# A config's kind by a section only it has (prada_jax/configs/<kind>.py).
_KIND_MARKERS = {"ppo": "ppo", "dual": "dual", "student": "distill"}


def config_kind(tree: Any) -> str | None:
    """``ppo``, ``dual`` or ``distill``: which config file ``tree`` (a config or its nested
    dict) comes from, by the section only that one has; None for any other."""
    for section, kind in _KIND_MARKERS.items():
        if section in tree:
            return kind
    return None


def add_missing_fields(tree: dict, kind: str | None = None) -> dict:
    """A copy of the nested dict ``tree`` (a stored config.json) with every field of
    :data:`ADDED_FIELDS` registered for its kind (``kind``, default :func:`config_kind`) that
    it lacks set to the field's ``before`` value (only inside sections it has); the caller's
    dict is not changed."""
    kind = kind or config_kind(tree)
    out = json.loads(json.dumps(tree))
    for field, added in ADDED_FIELDS.items():
        if kind not in added.configs:
            continue
        *parents, leaf = field.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf not in node:
            node[leaf] = added.before
    return out


def is_removed(field: str) -> bool:
    """True if the dotted ``field`` is in ``REMOVED_FIELDS`` or lies in a removed section."""
    return any(field == f or field.startswith(f + ".") for f in REMOVED_FIELDS)


def drop_removed_fields(tree: dict, prefix: str = "") -> dict:
    """A copy of the nested dict ``tree`` (a stored config.json) without the fields and sections
    that :func:`is_removed` names; the caller's dict is not changed."""
    return {k: drop_removed_fields(v, f"{prefix}{k}.") if isinstance(v, dict) else v
            for k, v in tree.items() if not is_removed(prefix + k)}


class ConfigError(BadInput):
    """A config field with a bad value; the message starts with ``config.<field>``."""


def get_field(config: Any, field: str) -> Any:
    """Value of a dotted field (``"ppo.lr"``) of a ConfigDict / dict / attribute object.

    Raises ConfigError naming the field if it is missing.
    """
    node = config
    for part in field.split("."):
        try:
            node = node[part] if isinstance(node, dict) or hasattr(node, "keys") else \
                getattr(node, part)
        except (KeyError, AttributeError):
            raise ConfigError(f"config.{field} is missing") from None
    return node


def set_field(config: Any, field: str, value: Any) -> None:
    """Sets a dotted field (``"sampler.kappa"``) of a ConfigDict / dict; ConfigError naming the
    field if its parent is missing."""
    parent, _, leaf = field.rpartition(".")
    node = get_field(config, parent) if parent else config
    node[leaf] = value


def parse_variants(arg: str | None, known, where: str) -> list[str]:
    """The variants of a config file's ``get_config(arg)``: ``arg`` split at commas, blanks
    dropped (``"smoke, gsm8k"`` → ``["smoke", "gsm8k"]``; None or "" → ``[]``), in order.
    A name not in ``known`` raises ``ValueError`` naming ``where`` (the config file) and the
    choices, so every config file rejects a misspelled variant the same way."""
    out = []
    for variant in (arg or "").split(","):
        variant = variant.strip()
        if not variant:
            continue
        if variant not in known:
            raise ValueError(f"{where}: unknown variant {variant!r}; choose from {tuple(known)} "
                             "(comma-separated)")
        out.append(variant)
    return out


def apply_variants(config: Any, arg: str | None, variants: Mapping[str, Mapping[str, Any]],
                   where: str) -> Any:
    """Applies the variants named in ``arg`` (``parse_variants``; left to right) to ``config``:
    each variant is a table of dotted fields (``{"ppo.lr": 3e-3}``) set in order, so a later
    variant overrides an earlier one. Returns ``config``."""
    for variant in parse_variants(arg, variants, where):
        for field, value in variants[variant].items():
            set_field(config, field, value)
    return config


def check(condition: bool, field: str, message: str) -> None:
    """Raises ``ConfigError("config.<field> <message>")`` unless ``condition``."""
    if not condition:
        raise ConfigError(f"config.{field} {message}")


def _number(config: Any, field: str) -> float:
    value = get_field(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"config.{field} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"config.{field} must be finite, got {value!r}")
    return value


def check_positive(config: Any, *fields: str) -> None:
    """Each field is a finite number > 0."""
    for f in fields:
        v = _number(config, f)
        check(v > 0, f, f"must be > 0, got {v!r}")


def check_nonnegative(config: Any, *fields: str) -> None:
    """Each field is a finite number >= 0."""
    for f in fields:
        v = _number(config, f)
        check(v >= 0, f, f"must be >= 0, got {v!r}")


def check_range(config: Any, field: str, low: float, high: float, *,
                low_open: bool = False, high_open: bool = False) -> None:
    """``low <= value <= high`` (strict where ``*_open``)."""
    v = _number(config, field)
    ok_low = v > low if low_open else v >= low
    ok_high = v < high if high_open else v <= high
    lo_br = "(" if low_open else "["
    hi_br = ")" if high_open else "]"
    check(ok_low and ok_high, field, f"must lie in {lo_br}{low}, {high}{hi_br}, got {v!r}")


def check_int(config: Any, *fields: str, minimum: int | None = None) -> None:
    """Each field is an int (not bool), optionally ``>= minimum``."""
    for f in fields:
        v = get_field(config, f)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"config.{f} must be an integer, got {v!r}")
        if minimum is not None:
            check(v >= minimum, f, f"must be >= {minimum}, got {v}")


def check_choice(config: Any, field: str, choices: Iterable[Any]) -> None:
    """Field value is one of ``choices``."""
    choices = list(choices)
    v = get_field(config, field)
    check(v in choices, field, f"must be one of {choices}, got {v!r}")


def check_divides(config: Any, field: str, total: int, *, total_name: str) -> None:
    """The (int) field divides ``total`` exactly; ``total_name`` says how total is formed."""
    v = get_field(config, field)
    check_int(config, field, minimum=1)
    check(total % v == 0, field,
          f"({v}) must divide {total_name} ({total}) exactly")


def config_to_dict(config: Any) -> dict:
    """A plain nested dict of a ConfigDict (or dict)."""
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def config_to_json(config: Any) -> str:
    """Indented, key-sorted JSON of the config (non-JSON values via ``repr``)."""
    return json.dumps(config_to_dict(config), indent=2, sort_keys=True, default=repr)


def write_config_json(config: Any, workdir: os.PathLike | str,
                      filename: str = "config.json") -> Path:
    """Writes the resolved config to ``<workdir>/<filename>`` (atomically); returns the path."""
    # the text of config_to_json, plus a final newline
    return write_json(Path(workdir) / filename, config_to_dict(config), indent=2,
                      sort_keys=True, default=repr)


def read_config_json(workdir: os.PathLike | str, filename: str = "config.json"):
    """Reads ``<workdir>/config.json`` back as an ``ml_collections.ConfigDict``, without the
    :data:`REMOVED_FIELDS` an older file may hold and with the :data:`ADDED_FIELDS` it lacks
    (their ``before`` values: :func:`add_missing_fields`).

    Raises ConfigError (a BadInput) naming the file: missing, unreadable, malformed JSON at
    any depth, or a top level that is not an object.
    """
    data = read_json(Path(workdir) / filename, missing=f"is {workdir} a run directory?",
                     error=ConfigError)
    return ml_collections.ConfigDict(add_missing_fields(drop_removed_fields(data)))


def check_run_dir(workdir: os.PathLike | str, flag: str, *,
                  files: Sequence[str] = ("config.json",), checkpoints: bool = True,
                  kind: str = "run") -> Path:
    """Checks an input run directory without writing anything; returns its path.

    ``files`` must exist and hold a JSON object each (read with ``prada_jax.jsonio``, so any
    malformed JSON is one line); with ``checkpoints``, a ``checkpoints/`` folder with at least
    one entry must exist. Raises ConfigError (a BadInput) starting with ``<flag>=<workdir>``.
    """
    path = Path(workdir)
    if not path.is_dir():
        raise ConfigError(f"{flag}={workdir}: no such {kind} directory")
    for name in files:
        try:
            read_json(path / name, missing=f"not a {kind} directory?")
        except BadInput as e:
            raise ConfigError(f"{flag}={workdir}: {e}") from None
    if checkpoints:
        ck = path / "checkpoints"
        if not ck.is_dir() or not any(ck.iterdir()):
            raise ConfigError(f"{flag}={workdir}: no checkpoints/ with a saved step (not a "
                              f"finished {kind} directory?)")
    return path


def prepare_workdir(workdir: os.PathLike | str | None) -> Path:
    """Creates the run directory; raises ConfigError if the flag is empty or it is a file."""
    if not workdir:
        raise ConfigError("--workdir is required")
    path = Path(workdir).absolute()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--workdir={workdir} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_output_file(path: os.PathLike | str, flag: str) -> Path:
    """Checks, before any work, that a command can later write the file ``path`` given by
    ``flag`` (e.g. ``--out``): it is not a folder, and its nearest existing ancestor is a
    folder this process may write in (missing parents are created when the file is written).
    Returns the path; raises ConfigError naming ``flag`` (a check after an hour of
    benchmarks lost every result)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag}={path}: is a folder; give the path of a file")
    up = p.absolute().parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise ConfigError(f"{flag}={path}: {up} is not a folder")
    if not os.access(up, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"{flag}={path}: not writable")
    return p


def check_output_dir(path: os.PathLike | str, flag: str) -> Path:
    """Checks, before any work, that a command can later write into the folder ``path``
    given by ``flag`` (e.g. ``--out``): it is a folder or does not exist yet, and its nearest
    existing ancestor is a folder this process may write in. Returns the path; raises
    ConfigError naming ``flag`` (a file there was a traceback after the whole evaluation)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag}={path}: exists and is not a folder")
    up = p.absolute()
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise ConfigError(f"{flag}={path}: {up} is not a folder")
    if not os.access(up, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}={path}: not writable")
    return p


def require_flag(value: Any, flag: str, what: str) -> None:
    """``BadInput("<flag> is required (<what>)")`` when ``value`` is empty or None."""
    if not value:
        raise BadInput(f"{flag} is required ({what})")


def reject_extra_argv(argv: Sequence[str]) -> None:
    """absl leaves unparsed positional args in ``argv[1:]``: refuse them (ConfigError, exit 2)."""
    if len(argv) > 1:
        raise ConfigError(f"unexpected command-line arguments: {' '.join(argv[1:])} "
                         "(flags take the form --name=value; config fields "
                         "--config.<field>=<value>)")


# ----------------------------------------------------------------------------- float32 range

# Float fields whose documented values include ±inf (dotted name as typed after ``--config.``,
# -> what inf means). Every other float field of every config must be finite: the runs compute
# in float32, where inf turns the first update (or a delay, a price) non-finite and the run
# stops with exit 3 after writing files. A field absent here is refused at ``inf``; register a
# field here only when inf is documented in its config comment.
INFINITE_OK: dict[str, str] = {
    "sampler.auto_gap_max": "inf = never hold the configured kappa (prada_jax/configs/distill.py)",
}

#: Largest value a seed field (``seed``, ``seed0``, ``*_seed``) may hold, and largest seed
#: count (``seeds``, ``num_seeds``, ``*_seeds``). ``jax.random.key`` keeps only the low 32 bits
#: of a seed (``2**32`` gives the key of 0), and some paths hold seeds as int32, so every
#: seed a run derives must lie in ``[0, 2**31 - 1]``. The derived seeds are ``base + seed +
#: offset`` with a split base below ``2**22`` (``prada_jax.traces.splits``: 0, 1e6, 2e6) and an
#: offset below a seed count (``seed0 + s``, ``seed + i``, the learner's ``seed + 1``):
#: ``SEED_MAX + 2**22 + SEED_COUNT_MAX <= 2**31 - 1``.
SEED_COUNT_MAX = 2 ** 23
SEED_MAX = 2 ** 31 - 1 - 2 ** 24
_SEED_NAME = r"(^|_)seed0?$"
_SEED_COUNT_NAME = r"(^|_)seeds$"


def _float32(value: float) -> float:
    """``value`` rounded to float32 (IEEE round-to-nearest); ``±inf`` past its range."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:   # some Python builds raise instead of rounding to inf
        return math.copysign(math.inf, value)


def _leaves(tree: Any, path: str = ""):
    """``(dotted path, value)`` of every leaf of a nested dict / list; list items are named
    ``path[i]``."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, tree


def float32_problem(value: float, *, allow_inf: bool = False) -> str | None:
    """Why the float ``value`` cannot be used by a float32 computation, or None: NaN, ±inf
    (unless ``allow_inf``), a finite value beyond float32's range (``|x| > 3.4028235e38``: it
    becomes inf), or a non-zero value that rounds to 0 in float32 (``|x| < 7.0e-46``)."""
    if math.isnan(value):
        return "NaN is not a valid value"
    if math.isinf(value):
        return None if allow_inf else "must be finite"
    f32 = _float32(value)
    if math.isinf(f32):
        return "does not fit float32 (|value| <= 3.4028235e+38); the run computes in float32"
    if value != 0.0 and f32 == 0.0:
        return ("rounds to 0 in float32 (smallest non-zero |value| 1.4e-45); the run computes "
                "in float32")
    return None


def seed_problem(name: str, value: Any) -> str | None:
    """Why the int ``value`` of a field or flag called ``name`` (its last dotted part decides)
    is not a usable seed or seed count, or None: a seed (``seed``, ``seed0``, ``*_seed``) must
    lie in ``[0, SEED_MAX]``, a seed count (``seeds``, ``*_seeds``) in ``[0, SEED_COUNT_MAX]``,
    so every seed derived from them fits ``jax.random.key``'s range (see ``SEED_MAX``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    leaf = name.rsplit(".", 1)[-1].lstrip("-")
    if re.search(_SEED_NAME, leaf) and not 0 <= value <= SEED_MAX:
        return (f"must lie in [0, {SEED_MAX}] (every derived seed, base + seed + offset, "
                "must fit the PRNG's 31-bit range)")
    if re.search(_SEED_COUNT_NAME, leaf) and not 0 <= value <= SEED_COUNT_MAX:
        return f"must lie in [0, {SEED_COUNT_MAX}] (seed + count must fit the PRNG's range)"
    return None


def check_float32(config: Any, name: str = "config") -> None:
    """Refuses a float field that the float32 computation cannot hold: NaN, ±inf (except the
    fields in :data:`INFINITE_OK`), a finite value beyond float32's range (``|x| >
    3.4028235e38``: it would become inf, and the first update non-finite, e.g.
    ``dual.step_size=1e300``), or a non-zero value that rounds to 0 in float32 (``|x| <
    1.4e-45``); and a seed field or seed count outside the PRNG's range (:func:`seed_problem`).
    Walks every leaf, so a field added to any config is covered without a list to update.
    ``name`` is how the user reaches the config (``--config``), so the message names the field
    as typed: ``--config.dual.step_size``.

    Raises:
      ConfigError: naming the first such field and its value.
    """
    for field, v in _leaves(config_to_dict(config) if not isinstance(config, dict)
                            else config):
        shown = f"{name}.{field}" if name else field
        if isinstance(v, float):
            why = float32_problem(v, allow_inf=field in INFINITE_OK)
        else:
            why = seed_problem(field, v)
        if why:
            raise ConfigError(f"{shown}={v!r}: {why}")
