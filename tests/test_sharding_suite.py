"""Pure helpers of the benchmark suite (``python -m benchmarks``): saturation point, peak-FLOP
lookup, the ratio table. No timing here (timings are not testable on a shared CPU)."""
import pytest

from benchmarks import __main__ as suite
from benchmarks import table
from benchmarks.env_scaling import saturation_point


def test_saturation_point_is_first_env_count_within_90_percent():
    envs = [1, 4, 16, 64, 256]
    rates = [1.0, 3.0, 9.5, 10.0, 9.8]
    # independent transcription: scan for the first rate >= 0.9 * max
    want = [e for e, r in zip(envs, rates) if r >= 0.9 * 10.0][0]
    assert saturation_point(envs, rates) == want == 16
    assert saturation_point([8], [5.0]) == 8


def test_peak_flops_lookup():
    assert suite.peak_flops("NVIDIA H200") == pytest.approx(989e12)
    assert suite.peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(989e12)
    assert suite.peak_flops("cpu") is None


def test_ratio_table_rows_and_markdown():
    res = {"_machine": {"backend": "cpu"},
           "env": {"jax": {"steps_per_s": 2e6}, "numpy": {"steps_per_s": 5e4},
                   "num_envs": 1024, "num_users": 16, "ratio": 40.0, "ratio_cpu": 35.0},
           "sched": {"candidates": 128, "slots": 30, "threshold_s_median": 1e-4,
                     "milp_knapsack_s_median": 0.1, "ratio_milp_over_threshold_median": 1000.0,
                     "ratio_milp_over_fill_median": 2000.0, "value_ratio_median": 1.0,
                     "batch": 256, "batched_fill_given_rank_slots_per_s": 4e4,
                     "batched_sequential_given_rank_slots_per_s": 1e4,
                     "batched_threshold_slots_per_s": 1e3, "fill_equals_sequential_all": True},
           "distill": {"student": "small", "dtype": "float32", "trained_tokens_per_s": 100.0,
                       "processed_tokens_per_s": 200.0, "mfu": None}}
    rows = table.ratio_rows(res)
    assert [r[0].split(":")[0].split(" (")[0] for r in rows] == [
        "edge env", "threshold scheduler vs knapsack MILP", "greedy fill, 256 slots vmapped",
        "distillation step"]
    assert rows[0][2].startswith("40x wall") and "1000x faster" in rows[1][2]
    md = table.format_table(rows, markdown=True).splitlines()
    assert "4.00x" in rows[2][2]   # passes over one-by-one, from the two rates
    assert md[0].startswith("| benchmark") and md[1] == "|---|---|---|" and len(md) == 6
    assert len(table.format_table(rows).splitlines()) == 6


def test_unknown_part_is_named():
    from prada_jax.errors import BadInput

    with pytest.raises(BadInput, match="--only"):
        suite.main(["--only", "nope"])
