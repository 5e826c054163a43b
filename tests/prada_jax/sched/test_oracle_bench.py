"""benchmarks.sched_vs_milp runs at toy size and its threshold decision is feasible."""
from benchmarks import sched_vs_milp


def test_sched_vs_milp_small():
    r = sched_vs_milp.run(n=40, free_units=6, repeats=2, milp_repeats=1)
    assert r["threshold_feasible"]
    assert r["milp_s"] > 0 and r["threshold_s"] > 0
    assert r["threshold_value"] <= r["oracle_value"] + 1e-6
