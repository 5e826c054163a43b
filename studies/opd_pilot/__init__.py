"""Pilot: ReOPD (replayed prefix) vs online OPD rollout cost per supervised turn, SYNTHETIC.

    python -m studies.opd_pilot [--updates=8] [--latency_s=0.01] [--json=F]

Builds a small synthetic cache in a temporary folder (``tiny_cache``: solved arithmetic
episodes as the pool, a random untrained tiny PyTorch teacher, its top-4 logits), makes a warm
start by SFT on the pool (``--sft_updates`` updates, so the student writes well-formed calculator
calls and OPD episodes last several turns), then from that student runs, each for ``--updates``
updates after one compiling update:

* ReOPD (``config.mode = "onpolicy"``, ``--batch`` (trajectory, turn) pairs per update);
* online OPD (``config.mode = "opd"``, ``--episodes`` episodes per update) at tool latency 0
  and at ``--latency_s`` seconds per turn round with a call (per call before session 14);

the three runs' updates alternate (update s of each, then s + 1), so load changes on a shared
machine hit them alike; each run's first update compiles and is not timed.

Reports, per run, from ``results.json["cost"]``: supervised turns, tool calls, student tokens,
teacher tokens scored, and rollout / scoring / update seconds per supervised turn over the
timed updates; and the ratio OPD / ReOPD of rollout seconds per supervised turn. A pilot of the
machinery, not a verdict: the teacher is random, the task tiny, the CPU shared.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
from absl import flags

from prada_jax import cli
from prada_jax import config_utils as cu
from prada_jax.configs.distill import get_config
from prada_jax.distill import opd as opd_lib
from prada_jax.distill import stepping, trainer
from prada_jax.distill.task.teacher import tiny_cache
from prada_jax.distill.trainer import train_and_evaluate
from prada_jax.jsonio import read_json, write_json


def _config(cache: Path, variant: str, steps: int, **fields):
    c = get_config(variant)
    c.data.cache = str(cache)
    c.train.steps = steps
    c.eval.n_problems = 0
    c.log.progress = False
    c.log.every = 1
    c.log.ckpt_every = 10_000
    c.sampler.refresh_every = 0
    for k, v in fields.items():
        cu.set_field(c, k, v)
    return c


def _row(res: dict) -> dict:
    """Totals, seconds per supervised turn (sum over timed updates / their turns, and the
    median over timed updates of each update's seconds / turns, robust to a stalled update)
    and every timed update's (turns, tool calls, rollout s)."""
    cost = res["cost"]
    keep = ("rollout_s_per_turn", "scoring_s_per_turn", "update_s_per_turn",
            "rollout_s_median", "timed_updates")
    timed = [u for u in cost["per_update"] if u["timed"] and u["supervised_turns"]]
    med = {f"{f}_per_turn_median": statistics.median(u[f] / u["supervised_turns"]
                                                     for u in timed)
           for f in ("rollout_s", "scoring_s", "update_s")}
    return {**cost["totals"], **{k: cost[k] for k in keep}, **med,
            "timed_updates_turns_calls_rollout_s": [
                (u["supervised_turns"], u["tool_calls"], round(u["rollout_s"], 4))
                for u in timed]}


def run(updates: int = 8, latency_s: float = 0.01, sft_updates: int = 150, batch: int = 32,
        episodes: int = 8, n_problems: int = 64) -> dict:
    out = {"synthetic": True, "pilot": True, "device": jax.devices()[0].device_kind,
           "updates_timed": updates, "batch_pairs": batch, "opd_episodes": episodes,
           "tool_latency_s": latency_s, "sft_updates": sft_updates, "pool_problems": n_problems,
           "load_avg_1min_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache = tiny_cache(tmp / "cache", n_problems)
        t0 = time.perf_counter()
        warm = tmp / "warm"
        train_and_evaluate(_config(cache, "sft", sft_updates, **{"eval.n_problems": 64}), warm)
        out["warm"] = read_json(warm / "results.json")["after"]
        out["sft_wall_s"] = time.perf_counter() - t0
        init = {"student.init": str(warm / "student_hf")}
        runs = {"reopd": _config(cache, "onpolicy", updates + 1, **init,
                                 **{"train.batch_size": batch}),
                "opd_latency0": _config(cache, "opd", updates + 1, **init,
                                        **{"opd.episodes": episodes}),
                f"opd_latency{latency_s:g}": _config(cache, "opd", updates + 1, **init,
                                                     **{"opd.episodes": episodes,
                                                        "opd.tool_latency_s": latency_s})}
        built = {name: stepping.open_run(trainer.build_setup(c), tmp / name)
                 for name, c in runs.items()}
        try:
            for step in range(updates + 1):   # alternated: every run's update s, then s + 1
                for name in built:
                    built[name] = stepping.step(built[name], step)
        finally:
            for run_ in built.values():
                trainer.close_files(run_.files)
        for name, run_ in built.items():
            out[name] = _row({"cost": opd_lib.cost_summary(run_.host.costs)})
    for key in ("rollout_s_per_turn", "rollout_s_per_turn_median"):
        for name in runs:
            if name != "reopd":
                out[name][f"{key}_vs_reopd"] = out[name][key] / out["reopd"][key]
    out["load_avg_1min_end"] = os.getloadavg()[0]
    return out


#: The command's counts: (flag, default, help); each at least 1.
COUNTS = (("updates", 8, "timed updates per run (after one compiling update)"),
          ("sft_updates", 150, "SFT updates of the warm start"),
          ("batch", 32, "ReOPD (trajectory, turn) pairs per update"),
          ("episodes", 8, "OPD episodes per update"))


def _define(fv) -> None:
    for name, default, help_ in COUNTS:
        flags.DEFINE_integer(name, default, help_, lower_bound=1, flag_values=fv)
    flags.DEFINE_float("latency_s", 0.01, "simulated tool latency of the second OPD run [s]",
                       lower_bound=0.0, flag_values=fv)
    flags.DEFINE_string("json", "", "also write the result to this file", flag_values=fv)


def main(argv=None) -> int:
    """``argv``: absl flags (``--updates=8``); None = the command line."""
    a = cli.parse_local(_define, argv, "studies.opd_pilot", __doc__)
    cli.hub_offline()
    res = run(a.updates, a.latency_s, a.sft_updates, a.batch, a.episodes)
    print(json.dumps(res, indent=2))
    if a.json:
        write_json(a.json, res, newline=False)
    return 0

