"""Config-checked resume: the contract between a run directory and a new invocation.

On an existing workdir a trainer calls :func:`check_resume` **before writing anything**: it
reads the stored ``<workdir>/config.json`` and compares it with the new config field by field
(dotted names), and checks that ``<workdir>/checkpoints`` holds an intact step if it holds any
(a run whose every step is damaged is refused here, before ``config.json``, ``run.json`` or a
trainer's own files such as ``policy_meta.json`` are touched).

* A field that changes the computation (shapes, seeds, data paths, optimiser, env, losses:
  everything not declared observational) differs → ``ConfigMismatch`` (a ``BadInput``, exit
  2) whose one line lists every differing field as ``name: old → new``. Nothing is written.
* Fields that only extend or observe the run (total steps/updates, logging and checkpoint
  cadence, progress bar, keep count) may change. Each trainer declares its set
  (``OBSERVATIONAL`` in ``rl/trainer.py``, ``stage2/trainer.py``, ``distill/trainer.py``); an entry
  ending in ``.*`` covers a whole section (``log.*``).
* Fields deleted from the configs are listed once, in ``config_utils.REMOVED_FIELDS``; they
  are left out of the comparison, so a config.json written before the deletion resumes.

:func:`commit` then writes the new ``config.json`` and appends an entry to the ``provenance``
list of ``<workdir>/run.json``: ``{"time": ISO-8601 UTC, "event": "start" | "resume",
"changed": {field: [old, new]}}``. So the stored config is always the one in force and the
run's history of extensions is kept.
"""
from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Iterable

import jax

from prada_jax import config_utils
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json

__all__ = ["ConfigMismatch", "ResumeCheck", "check_resume", "commit", "read_run_meta",
           "flatten", "RUN_META_FILE"]

RUN_META_FILE = "run.json"
_ABSENT = "<absent>"


class ConfigMismatch(BadInput):
    """The new config changes a computational field of a stored run (exit 2)."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": v}`` for a nested dict / ConfigDict (lists/tuples are leaves, as lists)."""
    if hasattr(tree, "to_dict"):
        tree = tree.to_dict()
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not tree and prefix:
            out[prefix[:-1]] = {}
        return out
    if isinstance(tree, tuple):
        tree = list(tree)
    out[prefix[:-1]] = tree
    return out


def _normal(v: Any) -> Any:
    """JSON round trip, so a tuple and a list (or 1 and 1.0 as JSON) compare as stored."""
    return json.loads(json.dumps(v, default=repr))


def _observational(field: str, fields: Iterable[str]) -> bool:
    for f in fields:
        if f.endswith(".*") and field.startswith(f[:-1]):
            return True
        if field == f:
            return True
    return False


class ResumeCheck:
    """Result of :func:`check_resume`.

    fresh: no stored config (a new run).
    changed: ``{field: (old, new)}`` of the allowed (observational) differences.
    stored: the stored config as a plain dict (``{}`` when fresh).
    """

    def __init__(self, fresh: bool, changed: dict, stored: dict):
        self.fresh, self.changed, self.stored = fresh, changed, stored

    def __repr__(self) -> str:
        return f"ResumeCheck(fresh={self.fresh}, changed={self.changed})"


def _fmt(v: Any) -> str:
    s = json.dumps(v, default=repr) if v is not _ABSENT else _ABSENT
    return s if len(s) <= 60 else s[:57] + "..."


def check_resume(config: Any, workdir, observational: Iterable[str],
                 filename: str = "config.json",
                 checkpoints: str | None = "checkpoints") -> ResumeCheck:
    """Compares ``config`` with ``<workdir>/<filename>`` (less ``config_utils.REMOVED_FIELDS``;
    a stored config without a field of ``config_utils.ADDED_FIELDS`` is read with the value
    the run had before the field existed), then checks that ``<workdir>/<checkpoints>``
    (None: skip) is empty or holds an intact step
    (``checkpointing.check_resumable``); writes nothing. First, every float field of ``config``
    must be finite and fit float32, every seed field the PRNG's range
    (``config_utils.check_float32``: the rule the commands apply to their flags, here also for
    a config built in code, e.g. by ``studies.stage2_verdict`` or ``train.main``).

    Raises:
      ConfigError: a float or seed field ``check_float32`` refuses (named ``config.<field>``).
      ConfigMismatch: a non-observational field differs (lists all of them, old → new).
      BadInput: the stored config is unreadable (names the file).
      checkpointing.DamagedCheckpoint: the run has checkpoints but none intact (a resume that
        would be refused after the trainer rewrote config.json and run.json).
    """
    config_utils.check_float32(config, "config")
    path = Path(workdir) / filename
    check = _check_config(config, path, workdir, observational)
    if checkpoints is not None:
        from prada_jax import checkpointing  # lazy: keeps orbax out of distill's imports

        checkpointing.check_resumable(Path(workdir) / checkpoints)
    return check


def _check_config(config: Any, path: Path, workdir, observational: Iterable[str]
                  ) -> ResumeCheck:
    """The config half of :func:`check_resume` (``path``: the stored config file)."""
    if not path.is_file():
        return ResumeCheck(True, {}, {})
    try:
        stored = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:
        raise BadInput(f"{path}: not valid JSON ({type(e).__name__}); cannot check the resumed "
                       "config against it") from None
    if not isinstance(stored, dict):
        raise BadInput(f"{path}: top level must be an object")
    # fields removed from the configs (config_utils.REMOVED_FIELDS) are not compared
    old = {k: _normal(v) for k, v in flatten(stored).items() if not config_utils.is_removed(k)}
    new = {k: _normal(v) for k, v in flatten(config_utils.config_to_dict(config)).items()
           if not config_utils.is_removed(k)}
    # fields added since the stored run: it ran with their value before they existed
    # (the table read_config_json applies too; a field the new config lacks is not invented)
    for k, added in config_utils.ADDED_FIELDS.items():
        if k in new and k not in old:
            old[k] = _normal(added.before)
    observational = tuple(observational)
    diff = {k: (old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in sorted(set(old) | set(new))
            if old.get(k, _ABSENT) != new.get(k, _ABSENT)}
    refused = {k: v for k, v in diff.items() if not _observational(k, observational)}
    if refused:
        items = "; ".join(f"{k}: {_fmt(a)} → {_fmt(b)}" for k, (a, b) in refused.items())
        raise ConfigMismatch(
            f"--workdir={workdir} holds a run with another config; these fields change the "
            f"computation and cannot change on resume: {items} (use a new --workdir, or the "
            f"stored values)")
    return ResumeCheck(False, diff, stored)


def read_run_meta(workdir) -> dict:
    """``<workdir>/run.json`` (``{"provenance": [...]}``), ``{}`` if absent or unreadable."""
    path = Path(workdir) / RUN_META_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def commit(config: Any, workdir, check: ResumeCheck, filename: str = "config.json",
           **extra: Any) -> None:
    """After a passed :func:`check_resume`: writes ``config.json`` and appends a provenance
    entry (``extra`` keys are added to it) to ``run.json``. Process 0 only."""
    if jax.process_index() != 0:
        return
    workdir = Path(workdir)
    meta = read_run_meta(workdir)
    prov = meta.get("provenance")
    if not isinstance(prov, list):
        prov = []
    entry = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "event": "start" if check.fresh else "resume",
             "changed": {k: [a, b] for k, (a, b) in check.changed.items()}}
    entry.update(extra)
    prov.append(entry)
    meta["provenance"] = prov
    config_utils.write_config_json(config, workdir, filename)
    write_json(workdir / RUN_META_FILE, meta, indent=2, default=repr)
