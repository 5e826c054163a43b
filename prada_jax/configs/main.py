"""Config of ``python -m train.main`` (``make demo``): the sizes of every part of the pipeline.

    python -m train.main --workdir=DIR [--full | --smoke] [--config.eval.seeds=8 ...]
    python -m train.main --workdir=DIR --config=prada_jax/configs/main.py:full [--config.x=...]

Variants: (none) / ``demo``: gsm8k only, sized for about 5 CPU minutes: the screening policy on
the serving server (the PPO config's default with 150 instead of 300 updates, compile-dominated
on CPU; docs/evals.md gives timings) and its critic refit; ``make demo`` then prints the
headline, PRADA's frontier, with ``studies.frontier`` at its ``demo`` size (a command above
the launchers: it is not a part here). The capacity part (issue 42's capacity at one retention,
``studies/capacity`` at a ``capacity_size``, this policy as the one sample) runs in ``smoke``
(the tests) or when ``capacity_size`` is given. The old scenario (the legacy 4-sequence server:
multipliers, load curve, two-point table; docs/history.md) runs in ``full`` and ``smoke``.
``full``: the three benchmarks, PPO at the ppo.py default size, longer evaluations, the M / B /
λ sweep and the PRM miscalibration stress test. ``smoke``: tiny sizes for the tests.

A field at 0 (or an empty string / tuple) means "none" or "the default" as its comment says. The
whole config is compared on rerun, part by part (``train.parts``), to decide whether a part
must be redone. All numbers these sizes produce come from synthetic traces.
"""
from __future__ import annotations

import ml_collections

from prada_jax import config_utils, latency
from prada_jax.presets import BENCHMARKS as PRESETS  # the one preset list


def _loads(k_first: int, k_last: int) -> tuple[float, ...]:
    """The pre-registered load grid λ/M = 2^(k/2), k = k_first..k_last (studies/load_curve)."""
    return tuple(round(2.0 ** (k / 2), 6) for k in range(k_first, k_last + 1))


def _evaluation(seeds: int, slots: int, warmup_slots: int, drain_slots: int
                ) -> ml_collections.ConfigDict:
    """One evaluation's sizes: empty start, the cohort arriving in [warmup_slots, slots), a
    drain of drain_slots after it (the timeout of a measured user: drain_slots·τ)."""
    return ml_collections.ConfigDict({"seeds": seeds, "slots": slots,
                                      "warmup_slots": warmup_slots, "drain_slots": drain_slots})


def _sweep() -> ml_collections.ConfigDict:
    """``config.sweep``: accuracy / latency / delay components against M, B and λ."""
    sweep = _evaluation(5, 2000, 200, 400)
    sweep.num_users = 0             # U of the sweep's env; 0 = the policy's
    # Axes swept, by the env field each varies (evals.sweep.AXES); () = no sweep part. The
    # demo skips it (≈ 90 of its ≈ 380 CPU seconds under the roofline clock); with these grids
    # ``python -m evals.sweep`` reproduces the demo's former sweep (docs/evals.md).
    sweep.axes = ()
    sweep.num_servers = (1, 2, 3, 4, 6, 8)                         # M grid [server jobs]
    sweep.bandwidth_hz = (0.25e6, 0.5e6, 1e6, 2e6, 5e6, 10e6, 20e6)  # B grid [Hz]
    sweep.arrival_rate_hz = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0)   # λ grid [users / s]
    return sweep


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "demo"                 # demo | smoke | full (printed; set by the variant)
    c.benchmarks = ("gsm8k",)       # presets trained and evaluated, one pipeline each
    c.summary_presets = PRESETS     # presets of the trace summary table
    c.summary_problems = 0          # problems per preset of the summary; 0 = published count
    c.train_problems = 0            # problems of the generated set (generator seed 0) whose
                                    # splits are train / validation / test; 0 = the PPO
                                    # variant's count
    c.split = "test"                # what every table reports
    c.choice_split = "validation"   # what the critic refit and dual learner choose on
    c.hardware = latency.CONFIG_PAIR  # (edge, server) pair of the clock for every part
                                    # (prada_jax.latency.PAIRS or a .json file); --hardware
    c.legacy_parts = False          # run the old scenario: dual, curve, table, sweep

    c.ppo = ml_collections.ConfigDict()
    c.ppo.variant = ""              # prada_jax/configs/ppo.py variant
    c.ppo.total_env_steps = 16 * 64 * 150  # env slots of the PPO run; 0 = the variant's
    c.ppo.server_model = "serving"  # env.server_model of the PPO run

    # Critic refit for the final actor (train.critic; docs/ppo.md, "Critic
    # calibration"); fit_states 0: the PPO critic as trained.
    c.critic_refit = ml_collections.ConfigDict(
        {"fit_states": 20000, "eval_states": 2000, "steps": 2000, "seed": 0})

    c.dual = ml_collections.ConfigDict()
    c.dual.variant = ""             # prada_jax/configs/dual.py variant
    c.dual.server_model = "legacy"  # env.server_model of the multiplier learner

    c.capacity_size = ""            # studies.capacity size of the capacity part; "" = none

    c.eval = _evaluation(5, 2000, 200, 400)   # the two-point benchmark table
    # The load curve (evals.curve): 8 seeds (a crossover needs >= 8), U = 32 so the U cap
    # blocks little below ρ = 1.
    c.curve = _evaluation(8, 1600, 200, 400)
    c.curve.min_seeds = 8           # --seeds below it is raised to it for the curve
    c.curve.num_users = 32
    c.curve.loads_per_server_hz = _loads(-8, 2)  # λ/M [arrivals / s per server sequence slot]
    c.table_num_users = 32          # U of the two table points; 0 = the policy's
    c.sweep = _sweep()

    c.calibration = ml_collections.ConfigDict()
    c.calibration.problems = 0      # problems per preset; 0 = published count
    c.calibration.stress_miscalibration = 0.0  # PRM miscalibration m of the stress test; 0 = none
    return config_utils.apply_variants(c, arg, _VARIANT_FIELDS, "prada_jax/configs/main.py")


_SMOKE = {
    "mode": "smoke", "summary_problems": 40, "train_problems": 60, "legacy_parts": True,
    "ppo.variant": "smoke", "ppo.total_env_steps": 0, "ppo.server_model": "legacy",
    "critic_refit.fit_states": 200, "critic_refit.eval_states": 100, "critic_refit.steps": 50,
    "dual.variant": "smoke", "capacity_size": "quick",
    **{f"{section}.{k}": v for section in ("eval", "curve", "sweep")
       for k, v in (("seeds", 2), ("slots", 120), ("warmup_slots", 20), ("drain_slots", 40))},
    "curve.min_seeds": 2, "curve.num_users": 16, "curve.loads_per_server_hz": (0.5, 2.0, 8.0),
    "table_num_users": 0,
    "sweep.axes": ("num_servers", "bandwidth_hz", "arrival_rate_hz"),
    "sweep.num_servers": (1, 4), "sweep.bandwidth_hz": (1e6, 20e6),
    "sweep.arrival_rate_hz": (2.0, 8.0),
    "calibration.problems": 40,
}
_FULL = {
    "mode": "full", "benchmarks": PRESETS, "legacy_parts": True,
    "ppo.total_env_steps": 0, "ppo.server_model": "legacy",
    "critic_refit.fit_states": 40000, "critic_refit.eval_states": 6000,
    "critic_refit.steps": 4000, "capacity_size": "",
    "eval.slots": 4000, "eval.warmup_slots": 400,
    "curve.slots": 2000, "curve.loads_per_server_hz": _loads(-10, 6),
    "sweep.slots": 4000, "sweep.warmup_slots": 400, "sweep.num_users": 64,
    "sweep.axes": ("num_servers", "bandwidth_hz", "arrival_rate_hz"),
    "sweep.num_servers": (1, 2, 3, 4, 5, 6, 8, 12),
    "sweep.arrival_rate_hz": (1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0),
    "calibration.stress_miscalibration": 1.0,
}
_VARIANT_FIELDS = {"demo": {}, "smoke": _SMOKE, "full": _FULL}
VARIANTS = tuple(_VARIANT_FIELDS)
