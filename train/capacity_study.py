"""The capacity study's run (``studies.capacity``): trains the policy samples its size names
(``train.policy_samples``, under ``out/policies/seed_<k>/``) unless given, then measures them
(``evals.capacity.study.run_study``).

The study command reads its sizes, part names, pair folders and report from this module too
(``SIZES``, ``PARTS``, ``pair_folders``, ``report_only``: the evaluation's own, imported here
from ``evals.capacity.study``).
"""
from __future__ import annotations

from pathlib import Path

from evals.capacity import study
from evals.capacity.study import PARTS, SIZES, pair_folders, report_only  # noqa: F401
from train import policy_samples


def run_study(out: Path, pairs, size: str = "study", log=None, policy_dirs=None) -> dict:
    """Runs (or resumes) the capacity study under ``out`` (``evals.capacity.study.run_study``);
    ``policy_dirs``: refit policy folders to use as the samples 0, 1, ... instead of training
    the size's samples under ``out/policies``. Two pairs that would share a folder are refused
    (``BadInput`` naming both) before anything is trained."""
    log = log or study.log_stderr
    pair_folders(out, pairs)   # a clash stops here, before any training
    if policy_dirs is None:
        sizes = SIZES[size]
        policy_dirs = [policy_samples.train_sample(Path(out) / "policies", k,
                                                   sizes.policy_size, log=log)
                       for k in sizes.samples]
    return study.run_study(out, pairs, size, log, policy_dirs=policy_dirs)
