"""Resumable, teacher-pinned runs of ``studies.reopd_kg`` (issue 35), SYNTHETIC.

Every finished (part, mode, lr or κ, seed) training run is written as its own small JSON under
``<out>/runs/<part>/<name>_seed<s>.json`` as soon as it finishes; a restart with the same
arguments skips every run whose record exists. Each record carries the study's fingerprint:

* ``cache``: sha256 of the teacher T's weights and config, the pool (tensors and meta) and the
  logits index (:data:`CACHE_FILES`). T cannot be rebuilt bit-identically (torch on a shared
  CPU), so results against different T's must never be pooled;
* ``config``: every size of the study except the verdict seed list (each verdict seed is its
  own run, so a longer ``--seeds`` range extends a study);
* ``cold``: sha256 of the cold-start student's weights every pilot and compare run starts from.

The study's fingerprint is stored once in ``<out>/fingerprint.json``; a restart against another
cache or config is refused before anything is written (:class:`prada_jax.errors.BadInput`
naming the file and field: exit 2), and so is a run record whose fingerprint differs from the
study's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from prada_jax import config_utils as cu
from prada_jax.distill.student import stored_results
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from prada_jax.safetensors_folder import file_sha256 as sha256_file

CACHE_FILES = ("teacher/model.safetensors", "teacher/config.json", "pool/pool.safetensors",
               "pool/pool.json", "logits/index.json")
NOT_CONFIG = ("seeds",)   # Sizes fields outside the config fingerprint (one run per seed)
# record fields that depend on the machine, not on the result (left out when comparing runs)
TIMING_FIELDS = ("train_s", "eval_s", "started_utc", "finished_utc", "load_avg_1min",
                 "trainer_reused", "adopted_from")
FLAG_OF = {"pilot_seeds": "--pilot_seeds", "updates": "--updates", "kappas": "--kappas",
           "latencies_ms": "--latencies_ms"}


def cache_fingerprint(cache: Path) -> dict:
    """sha256 of each of :data:`CACHE_FILES` under ``cache`` (a missing file: BadInput)."""
    out = {}
    for rel in CACHE_FILES:
        p = Path(cache) / rel
        if not p.is_file():
            raise BadInput(f"--cache: {p} not found (a kg cache has {', '.join(CACHE_FILES)})")
        out[rel] = sha256_file(p)
    return out


def config_fingerprint(sizes) -> dict:
    """The study's config as plain JSON values (tuples as lists), without :data:`NOT_CONFIG`."""
    d = dataclasses.asdict(sizes)
    return json.loads(json.dumps({k: v for k, v in d.items() if k not in NOT_CONFIG},
                                 sort_keys=True))


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def study_fingerprint(cache: Path, sizes) -> dict:
    fp = {"cache": cache_fingerprint(cache), "config": config_fingerprint(sizes)}
    fp["cache_sha"], fp["config_sha"] = digest(fp["cache"]), digest(fp["config"])
    return fp


def check_study(out: Path, fp: dict) -> None:
    """Refuses (BadInput, one line naming the file and field) a study folder whose stored
    fingerprint differs from ``fp``; nothing is written here."""
    path = Path(out) / "fingerprint.json"
    if not path.exists():
        return
    try:
        old = read_json(path)
    except BadInput as e:
        raise BadInput(f"--out: {e}; move it away or use another --out") from None
    for sec in ("cache", "config"):
        if not isinstance(old.get(sec, {}), dict):
            raise BadInput(f"--out: {path} field {sec} is not an object; move it away or use "
                           "another --out")
    for rel, sha in fp["cache"].items():
        if old.get("cache", {}).get(rel) != sha:
            raise BadInput(f"--cache: {rel} differs from the study's ({path} field cache.{rel}:"
                           " another teacher/pool/logits; results against different caches are "
                           "never pooled)")
    oc = old.get("config", {})
    for k in sorted(set(fp["config"]) | set(oc)):
        if fp["config"].get(k) != oc.get(k):
            raise BadInput(f"{FLAG_OF.get(k, 'config')}: {k} = {fp['config'].get(k)} differs "
                           f"from the study's {oc.get(k)} ({path} field config.{k})")


def write_study(out: Path, fp: dict) -> None:
    path = Path(out) / "fingerprint.json"
    if not path.exists():
        write_json(path, {**fp, "created_utc": _utc()}, indent=1, newline=False)


def _utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def record_path(out: Path, part: str, name: str, seed: int) -> Path:
    return Path(out) / "runs" / part / f"{name}_seed{seed}.json"


def load_record(path: Path, fp: dict) -> dict | None:
    """The finished run's record at ``path`` (None if absent or torn); a record made under
    another fingerprint is refused."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("fingerprint", {}), dict):
        return None   # not a record this study wrote: torn, run again
    got = rec.get("fingerprint", {})
    for k in ("cache_sha", "config_sha", "cold_sha"):
        if k in fp and got.get(k) != fp[k]:
            raise BadInput(f"--out: {path} was made under another {k.split('_')[0]} "
                           f"(field fingerprint.{k}); never pooled with this study's runs")
    return rec


def save_record(path: Path, rec: dict) -> None:
    """Writes the record atomically (a kill leaves the old state or the whole file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    write_json(tmp, rec, indent=1, newline=False)
    os.replace(tmp, path)


def comparable(rec: dict) -> dict:
    """``rec`` without :data:`TIMING_FIELDS` (what must equal between two runs of a unit)."""
    return {k: v for k, v in rec.items() if k not in TIMING_FIELDS}


def adopt(old_workdir: Path, new_workdir: Path, config, old_init: Path) -> bool:
    """Copies a finished trainer workdir made by an earlier study into ``new_workdir`` if it was
    made by ``config`` exactly, up to the path of the (byte-identical) initial student: every
    config field equal except ``student.init``, whose folder's weights have the same sha256 as
    ``config.student.init``'s. The copy's ``config.json`` then names the new init and its
    ``run.json`` says where it came from. Returns False (nothing copied) otherwise."""
    old_workdir, new_workdir = Path(old_workdir), Path(new_workdir)
    if new_workdir.exists() or stored_results(old_workdir) is None:
        return False
    old = json.loads((old_workdir / "config.json").read_text())
    new = json.loads(cu.config_to_json(config))
    if old["student"]["init"] != str(old_init):
        return False
    if sha256_file(Path(old_init) / "model.safetensors") != sha256_file(
            Path(new["student"]["init"]) / "model.safetensors"):
        return False
    o2 = json.loads(json.dumps(old))
    o2["student"]["init"] = new["student"]["init"]
    o2.pop("log", None)
    n2 = {k: v for k, v in new.items() if k != "log"}
    o2["train"].pop("steps", None)
    n2 = json.loads(json.dumps(n2))
    n2["train"].pop("steps", None)
    if o2 != n2 or old["train"]["steps"] != new["train"]["steps"]:
        return False
    shutil.copytree(old_workdir, new_workdir)
    old["student"]["init"] = new["student"]["init"]
    (new_workdir / "config.json").write_text(json.dumps(old, indent=2, sort_keys=True))
    rj = new_workdir / "run.json"
    prov = json.loads(rj.read_text()) if rj.exists() else {"provenance": []}
    prov.setdefault("provenance", []).append(
        {"time": _utc(), "event": "adopted", "changed": {"student.init": [
            str(old_init), new["student"]["init"]]}, "from": str(old_workdir)})
    rj.write_text(json.dumps(prov, indent=2))
    return True
