"""Bucketed prompt lengths vs pool-wide padding: update-time ratio of the distillation step.

    python -m benchmarks.distill_bucket [--pairs=15] [--bucket=16] [--modes=offline,onpolicy]
        [--batch=64] [--json=F]

Builds a small SYNTHETIC cache in a temporary folder (``tiny_cache``: solved arithmetic episodes,
a random tiny PyTorch teacher, its top-4 logits) and, per mode, two runs of the default student
of ``prada_jax/configs/distill.py`` that differ only in ``train.prompt_bucket`` (0: every prompt
padded to the pool's longest prefix; ``--bucket``: cut to the next multiple above the batch's
longest). After warm-up updates (compiling every width), it times
``prada_jax.distill.stepping.step`` in alternated pairs (padded, bucketed: the same
update index, so the same pairs are drawn) and reports the median of the per-pair ratios
padded / bucketed (> 1: bucketing is faster) with the medians of each. Speed only: the data are
synthetic; offline = forward KL on exported logits, onpolicy = ReOPD (student generation +
teacher scoring + step).
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
from prada_jax.configs.distill import get_config
from prada_jax.distill import stepping, trainer
from prada_jax.distill.task.teacher import tiny_cache
from prada_jax.errors import BadInput


def _run(cache: Path, workdir: Path, mode: str, bucket: int, batch: int, steps: int):
    c = get_config("onpolicy" if mode == "onpolicy" else None)
    c.data.cache = str(cache)
    c.train.batch_size = batch
    c.train.steps = steps
    c.train.prompt_bucket = bucket
    c.eval.n_problems = 0
    c.log.progress = False
    return stepping.open_run(trainer.build_setup(c), workdir)


def measure(cache: Path, tmp: Path, mode: str, bucket: int, pairs: int, batch: int,
            warmup: int = 6) -> dict:
    steps = warmup + pairs
    a = _run(cache, tmp / f"{mode}_pad", mode, 0, batch, steps)
    b = _run(cache, tmp / f"{mode}_bucket", mode, bucket, batch, steps)
    try:
        for s in range(warmup):     # compiles (every bucket width the draws reach)
            a = stepping.step(a, s)
            b = stepping.step(b, s)
        ta, tb, widths = [], [], []
        for s in range(warmup, steps):
            t0 = time.perf_counter()
            a = stepping.step(a, s)
            t1 = time.perf_counter()
            b = stepping.step(b, s)
            t2 = time.perf_counter()
            ta.append(t1 - t0)
            tb.append(t2 - t1)
        widths = [b.rec.samplers[0].P]
    finally:
        trainer.close_files(a.files)
        trainer.close_files(b.files)
    ratios = [x / y for x, y in zip(ta, tb)]
    return {"mode": mode, "bucket": bucket, "pairs": pairs, "batch": batch,
            "pool_prompt_width": widths[0],
            "padded_update_s_median": statistics.median(ta),
            "bucketed_update_s_median": statistics.median(tb),
            "ratio_padded_over_bucketed_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios)}


def run(pairs: int = 15, bucket: int = 16, modes=("offline", "onpolicy"), batch: int = 64,
        n_problems: int = 48) -> dict:
    out = {"synthetic": True, "device": jax.devices()[0].device_kind,
           "load_avg_1min_start": os.getloadavg()[0], "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = tiny_cache(tmp / "cache", n_problems)
        for mode in modes:
            out["results"].append(measure(cache, tmp, mode, bucket, pairs, batch))
    out["load_avg_1min_end"] = os.getloadavg()[0]
    return out


def _define(fv) -> None:
    flags.DEFINE_integer("pairs", 15, "timed (padded, bucketed) update pairs per mode",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("bucket", 16, "train.prompt_bucket of the bucketed run [tokens]",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_list("modes", ["offline", "onpolicy"], "offline and/or onpolicy",
                      flag_values=fv)
    flags.DEFINE_integer("batch", 64, "(trajectory, turn) pairs per update", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags (``--pairs=15``); None = the command line."""
    cli.hub_offline()
    a = cli.parse_local(_define, argv, "benchmarks.distill_bucket", __doc__)
    bad = [m for m in a.modes if m not in ("offline", "onpolicy")]
    if bad:
        raise BadInput(f"--modes: unknown mode {bad[0]!r} (offline, onpolicy)")
    res = run(a.pairs, a.bucket, tuple(a.modes), a.batch)
    print_and_save_json(res, a.json)
    return 0


if __name__ == "__main__":
    cli.run_local(main)
