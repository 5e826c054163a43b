"""What a whole load curve costs against one of its points (issue 32: at most 3×).

    python -m benchmarks.load_curve [--loads 8] [--seeds 8] [--slots 600] [--warmup 100]
                                    [--drain 200] [--num_users 16] [--repeats 3] [--json FILE]

``evals.curve`` runs every (row, load) point of a curve in one vmapped, jitted call. Here the
same four rows (server LLM alone, All-SLM, RSD, PRADA) are timed at ONE load (4 points) and at
``--loads`` loads (4·L points): the first call of a freshly jitted function (compile + run,
what a user pays for one curve; median of ``--repeats`` fresh functions) and the median of
``--repeats`` further calls of the last one (run only).
Printed: both times and the ratios curve / point; the issue's target is the first ratio ≤ 3.

Speed only: SYNTHETIC gsm8k traces (test split), and the PRADA row's screening "policy" is the
fixed rule of ``evals.testing.oracle_apply`` (a trained network of the default size adds one
small MLP per user and slot), so the numbers say nothing about quality.
"""
from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.common import save_json
from envs import edge
from evals import curve
from evals import evaluate as ev
from evals.testing import oracle_apply
from prada_jax import cli, config_utils
from prada_jax.traces.loader import load_trace_set


def _time_curve(e: ev.Evaluator, rows, loads, repeats: int) -> dict:
    firsts = []
    for _ in range(repeats):   # a fresh jitted function each time: compile + run
        fn = curve.make_curve_fn(e.evaluate_fn)
        t0 = time.perf_counter()
        curve.run_curve(e, rows, loads, curve_fn=fn)
        firsts.append(time.perf_counter() - t0)
    first = statistics.median(firsts)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        curve.run_curve(e, rows, loads, curve_fn=fn)
        runs.append(time.perf_counter() - t0)
    return {"points": len(rows) * len(loads), "first_call_s": first, "first_calls_s": firsts,
            "run_median_s": statistics.median(runs), "runs_s": runs,
            "compiles": fn._cache_size()}


def run(loads: int = 8, seeds: int = 8, slots: int = 600, warmup: int = 100, drain: int = 200,
        num_users: int = 16, repeats: int = 3, problems: int = 200) -> dict:
    """Returns ``{"point": {...}, "curve": {...}, "ratio_first_call", "ratio_run"}``."""
    traces, _ = load_trace_set("gsm8k", problems=problems, seed=0, split="test")
    params = edge.make_params(traces, num_users=num_users)
    grid = list(np.geomspace(0.25, 8.0, loads)) if loads > 1 else [1.0]
    rows = curve.curve_rows((0.01, 0.0))
    out = {}
    # A separate evaluator (and so a separate compilation) for each of the two calls.
    for name, xs in (("point", [1.0]), ("curve", grid)):
        e = ev.Evaluator(params, seeds, slots, warmup, oracle_apply, jnp.zeros(()),
                         drain_slots=drain + (0 if name == "point" else 1))
        out[name] = _time_curve(e, rows, xs, repeats)
    out["ratio_first_call"] = out["curve"]["first_call_s"] / out["point"]["first_call_s"]
    out["ratio_run"] = out["curve"]["run_median_s"] / out["point"]["run_median_s"]
    out["settings"] = dict(loads=loads, seeds=seeds, slots=slots, warmup=warmup, drain=drain,
                           num_users=num_users, repeats=repeats, problems=problems,
                           backend=jax.default_backend(), traces="SYNTHETIC gsm8k test split")
    return out


def _define_flags():
    flags.DEFINE_integer("loads", 8, "load points of the curve.", lower_bound=1)
    flags.DEFINE_integer("seeds", 8, "seeds per point.", lower_bound=1)
    flags.DEFINE_integer("slots", 600, "window end (slots).", lower_bound=2)
    flags.DEFINE_integer("warmup", 100, "window start (slots).", lower_bound=0)
    flags.DEFINE_integer("drain", 200, "drain slots after the window.", lower_bound=1)
    flags.DEFINE_integer("num_users", 16, "U user slots.", lower_bound=1)
    flags.DEFINE_integer("repeats", 3, "timed calls after the first.", lower_bound=1)
    flags.DEFINE_string("json", None, "also write the result here.")


def main(argv):
    config_utils.reject_extra_argv(argv)
    F = flags.FLAGS
    r = run(F.loads, F.seeds, F.slots, F.warmup, F.drain, F.num_users, F.repeats)
    for name in ("point", "curve"):
        d = r[name]
        print(f"{name}: {d['points']} points x {F.seeds} seeds: first call (compile + run) "
              f"{d['first_call_s']:.1f} s, run {d['run_median_s']:.2f} s (medians of "
              f"{F.repeats}), compilations per function {d['compiles']}")
    print(f"curve / point: first call {r['ratio_first_call']:.2f}x (target <= 3), run only "
          f"{r['ratio_run']:.2f}x [{r['settings']['backend']}; SYNTHETIC traces, speed only]")
    save_json(F.json, r)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
