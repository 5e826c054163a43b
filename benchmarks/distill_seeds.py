"""Seeds as a batch axis: students·updates/s of N vmapped students vs N sequential runs.

    python -m benchmarks.distill_seeds [--num_seeds=8] [--updates=20] [--batch=64] [--json=F]

Builds a small SYNTHETIC cache in a temporary folder (generated arithmetic episodes, a random
tiny PyTorch teacher, its exported top-4 logits), then, in the same process, times
``prada_jax.distill.stepping.step`` (host batch drawing + teacher-logit gather + the
jitted step, offline forward KL, default student of ``prada_jax/configs/distill.py``):

* vmapped: one run with ``config.train.num_seeds = N``; students·updates/s = N / median
  update time;
* sequential: N runs with ``num_seeds = 1`` (seeds 0..N-1), one after the other;
  students·updates/s = 1 / median update time over all their updates.

Updates that compile (the first two of a run) are not timed (``HostState.update_times``).
Speed only: the data are synthetic.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
from absl import flags

from benchmarks.common import print_and_save_json
from prada_jax import cli
from prada_jax.distill import stepping, trainer
from prada_jax.distill.task.teacher import tiny_cache
from prada_jax.configs.distill import get_config


def make_cache(root: Path, n_problems: int = 48) -> Path:
    """A synthetic cache (pool/, logits/, teacher/) under ``root``."""
    return tiny_cache(root, n_problems)


def _times(cache: Path, workdir: Path, seed: int, num_seeds: int, updates: int,
           batch: int) -> list[float]:
    c = get_config()
    c.data.cache = str(cache)
    c.seed = seed
    c.train.num_seeds = num_seeds
    c.train.batch_size = batch
    c.train.steps = updates + 1
    c.eval.n_problems = 0
    c.log.progress = False
    run = stepping.open_run(trainer.build_setup(c), workdir)
    try:
        for step in range(updates + 1):   # update 0 compiles: not timed
            run = stepping.step(run, step)
    finally:
        trainer.close_files(run.files)
    return list(run.host.update_times)


def run(num_seeds: int = 8, updates: int = 20, batch: int = 64) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = make_cache(tmp / "cache")
        t0 = time.perf_counter()
        vm = _times(cache, tmp / "vmapped", 0, num_seeds, updates, batch)
        t_vm = time.perf_counter() - t0
        seq, t0 = [], time.perf_counter()
        for s in range(num_seeds):
            seq += _times(cache, tmp / f"seq{s}", s, 1, updates, batch)
        t_seq = time.perf_counter() - t0
    vm_med, seq_med = statistics.median(vm), statistics.median(seq)
    out = {"num_seeds": num_seeds, "updates_timed": updates, "batch": batch,
           "device": jax.devices()[0].device_kind, "load_avg_1min": os.getloadavg()[0],
           "vmapped_update_s_median": vm_med, "sequential_update_s_median": seq_med,
           "vmapped_students_updates_per_s": num_seeds / vm_med,
           "sequential_students_updates_per_s": 1.0 / seq_med,
           "speedup": (num_seeds / vm_med) * seq_med,
           "wall_s_vmapped_incl_build_compile": t_vm,
           "wall_s_sequential_incl_build_compile": t_seq, "synthetic": True}
    return out


def _define(fv) -> None:
    flags.DEFINE_integer("num_seeds", 8, "students (N)", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("updates", 20, "timed updates per run (after one compiling update)",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("batch", 64, "(trajectory, turn) pairs per update and student",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags (``--num_seeds=8``); None = the command line."""
    cli.hub_offline()
    a = cli.parse_local(_define, argv, "benchmarks.distill_seeds", __doc__)
    res = run(a.num_seeds, a.updates, a.batch)
    print_and_save_json(res, a.json)
    return 0


if __name__ == "__main__":
    cli.run_local(main)
