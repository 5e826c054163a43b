"""Stage-2 verdict: ``python -m studies.stage2_verdict --out=DIR [--scenarios=...] [--seeds=N] [--quick]``.

For each scenario (``envs.scenarios`` presets) this learns the multipliers with the stage-2
library (``prada_jax.dual.trainer``: a constant pair by the ``prada_jax/configs/dual.py`` default
learner — online subgradient, exported as the average of its iterates over the second half of
the run, plain capacity constraint ρ = 1 — and a load-conditioned map, always by Adam), searches the
best constant pair on a grid (``evals.grid``), and evaluates, on the same seeds (paired), the
rows

    PRADA (learned, constant), PRADA (learned, conditioned), Best constant (grid, validation),
    Best constant (hindsight grid on the evaluated seeds), PRADA (λ=µ=0), FIFO-greedy,
    Policy (no limits), Draft then LLM (recompute)

Protocol: rows are evaluated on the test split of the policy's own trace set with test-range
seeds; the multipliers are learned, and the grid's reference pair chosen, on the validation
split with validation seeds (the hindsight row searches the evaluated seeds: optimistic,
labelled; skipped at the demo size). Each scenario states its power (``power``: headroom =
Policy (no limits) − λ=µ=0, the minimum detectable effect of learned − λ=µ=0 at the seed count
by a two-sided paired t at 5 % with 80 % power, and a note when headroom < 0.02 or MDE >
headroom / 2, issue 23's pre-registered gate); presets
with env scalars of their own (``envs.scenarios.PRESET_ENV``) run at those; ``--budget`` adds
an occupancy cap (``budget``).

(docs/design.md §6, §8). Every PRADA row runs the scheduler the dual run trained (read from its env
params). Output in ``DIR``:

    stage2.json   {"scenarios": {NAME: {"rows": {ROW: {METRIC: {"mean", "ci95"}}},
                                        "paired": {PAIR: {METRIC: {"mean", "ci95"}}},
                                        "multipliers": ..., "grid": ...}}, "meta": ...}
    stage2.md     the same as Markdown tables (also printed)
    stage2.png    accuracy − β·latency per row and scenario, 95% CI
    ppo/          the screening policy, trained here unless --policy is given
    dual/<scenario>/{constant,conditioned}/   the train.dual runs (reused when rerun)

Stored multipliers: none are taken from outside; each scenario's are learned here, on that
scenario (``dual/<scenario>/...``), and a rerun reuses those runs only through
``prada_jax.dual.trainer``'s config-checked resume, so the scenario check of ``evals.run``
(``evals.suite.check_scenario``) has nothing to compare.

``ci95`` is the half-width of the two-sided 95% Student-t interval over seeds
(``prada_jax.stats.mean_ci``): the interval is mean ± ci95. Pairs ``learned_minus_zero``,
``learned_minus_fifo``, ``learned_minus_best_constant`` take "learned" = PRADA (learned,
constant); ``conditioned_minus_*`` the same for the conditioned map. A paired difference is the
mean over seeds of the per-seed difference (same arrivals, channels and problems per seed).
Metrics: ``accuracy``, ``latency_mean_s``, ``latency_p95_s``, ``objective`` (accuracy −
β·mean latency, β in PRM units per s), ``server_util`` (busy units / M), ``queue_len``
(requests per slot), plus ``blocked_rate`` (blocked arrivals / arrivals) and the shares of
slots in which capacity / bandwidth binds (``evals.evaluate``).

Sizes: the default is the measurement size (see ``SIZES``); ``--quick`` finishes in a few
minutes on 2 CPU cores and its numbers mean nothing. All traces are SYNTHETIC (the gsm8k
preset); numbers say so. Exit codes (``prada_jax.cli``): 2 bad input (one line naming the
flag or file, nothing written), 3 non-finite training, 1 a bug.
"""
from __future__ import annotations

from studies.stage2_verdict.report import (  # noqa: F401  (the public names, one import path)
    BUDGET_TOLERANCE, MDE_ALPHA, MDE_POWER, METRICS, MIN_HEADROOM, PAIRS, ROW_BEST, ROW_COND,
    ROW_CONST, ROW_FIFO, ROW_FILTER, ROW_HINDSIGHT, ROW_LLM, ROW_NOLIM, ROW_ZERO, ROWS,
    budget_report, paired_differences, power_report, scenario_report, schedule_report,
    summarize_rows, to_markdown, write_outputs)
from studies.stage2_verdict.runner import (  # noqa: F401
    _ENV_KEYS, GRID_BATCH, SIZES, TIGHTEN_DEFAULT, Runner, baseline_specs, check_budget,
    choose_margin, conditioned_mult_fn, evaluate_scenario, learn_multipliers, margin_tag,
    Settings, parse_dual_overrides, run, train_policy)
