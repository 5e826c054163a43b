"""The sleep check's comparison (studies.reopd_regime.sleepcheck.compare) against a plain loop."""
from __future__ import annotations

import math

import pytest

from studies.reopd_regime import sleepcheck


def _upd(rounds, calls, rollout):
    return {"tool_rounds": rounds, "tool_calls": calls, "rollout_s": rollout}


def test_compare_matches_a_plain_loop():
    L = 0.3
    base = [_upd(5, 30, 0.10), _upd(4, 22, 0.12), _upd(6, 31, 0.09)]
    # the slept run: one sleep per round plus a little noise on the rollout itself
    noise = [0.01, -0.02, 0.0]
    slept = [_upd(b["tool_rounds"], b["tool_calls"], b["rollout_s"] + L * b["tool_rounds"] + e)
             for b, e in zip(base, noise)]
    got = sleepcheck.compare(base, slept, L, skip=0)
    delta = sum(s["rollout_s"] - b["rollout_s"] for b, s in zip(base, slept))
    model = sum(L * b["tool_rounds"] for b in base)
    assert got["updates"] == 3
    assert math.isclose(got["delta_s_total"], delta)
    assert math.isclose(got["model_s_total"], model)
    assert math.isclose(got["ratio_total"], delta / model)
    assert math.isclose(got["per_call_s_total"], L * (30 + 22 + 31))
    per = sorted((s["rollout_s"] - b["rollout_s"]) / (L * b["tool_rounds"])
                 for b, s in zip(base, slept))
    assert math.isclose(got["ratio_median"], per[1])


def test_compare_refuses_runs_that_played_different_episodes():
    with pytest.raises(ValueError, match="update 1"):
        sleepcheck.compare([_upd(5, 30, 0.1), _upd(4, 20, 0.1)],
                           [_upd(5, 30, 1.6), _upd(5, 20, 1.4)], 0.3)


def test_compare_leaves_the_compiling_first_update_out_of_the_totals():
    base = [_upd(5, 30, 11.0), _upd(4, 22, 0.1)]
    slept = [_upd(5, 30, 1.6), _upd(4, 22, 1.3)]
    got = sleepcheck.compare(base, slept, 0.3)
    assert got["updates"] == 1 and len(got["rows"]) == 2
    assert math.isclose(got["delta_s_total"], 1.2) and math.isclose(got["model_s_total"], 1.2)
