"""``paired.variance_components`` / ``planned_mde`` against a simulation with known variance
components and against the two-way bootstrap's own SE."""
import math

import numpy as np
import pytest

from prada_jax.distill import paired as pr


def _sim(rng, S, P, vs, vp, ve):
    return (rng.normal(0, math.sqrt(vs), (S, 1)) + rng.normal(0, math.sqrt(vp), (1, P))
            + rng.normal(0, math.sqrt(ve), (S, P)))


def test_components_recover_known_variances():
    rng = np.random.default_rng(0)
    est = [pr.variance_components(_sim(rng, 60, 400, 0.004, 0.09, 0.02)) for _ in range(20)]
    for key, true in (("seed", 0.004), ("problem", 0.09), ("interaction", 0.02)):
        mean = np.mean([e[key] for e in est])
        assert mean == pytest.approx(true, rel=0.12), (key, mean)


def test_components_by_plain_loops():
    rng = np.random.default_rng(1)
    d = (rng.random((4, 7)) < 0.3).astype(float) - (rng.random((4, 7)) < 0.2)
    S, P = d.shape
    m = sum(map(sum, d.tolist())) / (S * P)
    r = [sum(row) / P for row in d.tolist()]
    c = [sum(d[s][p] for s in range(S)) / S for p in range(P)]
    ss_res = sum((d[s][p] - r[s] - c[p] + m) ** 2 for s in range(S) for p in range(P))
    ms_res = ss_res / ((S - 1) * (P - 1))
    ms_s = P * sum((x - m) ** 2 for x in r) / (S - 1)
    ms_p = S * sum((x - m) ** 2 for x in c) / (P - 1)
    out = pr.variance_components(d)
    assert out["interaction"] == pytest.approx(ms_res)
    assert out["seed"] == pytest.approx(max(0.0, (ms_s - ms_res) / P))
    assert out["problem"] == pytest.approx(max(0.0, (ms_p - ms_res) / S))


@pytest.mark.parametrize("vs,vp,ve", [(1e-4, 0.006, 0.1), (5e-4, 0.08, 0.05)])
def test_planned_mde_matches_the_bootstrap_and_solves_for_problems(vs, vp, ve):
    """The two-way bootstrap's MDE equals the components' with the interaction counted three
    times (the pigeonhole over-count); counted once it is visibly smaller where the interaction
    dominates."""
    rng = np.random.default_rng(2)
    d = _sim(rng, 20, 512, vs, vp, ve)
    comp = pr.variance_components(d)
    boot = pr.two_way_bootstrap(d, [256, 256], n_boot=4000, seed=3)
    k = pr.BOOTSTRAP_INTERACTION
    assert pr.planned_mde(comp, 20, 512, k) == pytest.approx(boot["mde"], rel=0.08)
    if 2 * ve / 20 > vp:   # interaction-dominated: once-counted is below the bootstrap
        assert pr.planned_mde(comp, 20, 512) < 0.85 * boot["mde"]
    for f in (1.0, k):
        n = pr.problems_for_mde(comp, 0.02, 20, f)
        assert pr.planned_mde(comp, 20, n, f) == pytest.approx(0.02, rel=1e-9)
    assert comp["seed"] > 20 * (0.001 / 2.8) ** 2     # the seed term alone exceeds 0.001:
    assert pr.problems_for_mde(comp, 0.001, 20) == math.inf
    assert pr.planned_mde(comp, math.inf, math.inf) == 0.0
    with pytest.raises(ValueError, match="2 seeds"):
        pr.variance_components(d[:1])
