"""The declared GPU cost model (issue 44, item 7) against a hand computation on round-number
hardware and models, and its break-even latency against the ratio it inverts."""
import math

import pytest

from prada_jax import latency
from prada_jax.distill import gpucost

# peak·η = 5e11 FLOP/s, BW·η_mem = 5e8 B/s; student W = 2e6·2 B = 4e6 B, teacher 2e8 B;
# KV = 2·L·kv_heads·head_dim·kv_bytes = 2·2·1·5·1 = 20 B per token
HW = latency.HardwareProfile(peak_flops=1e12, mem_bw=1e9, mem_bytes=1e12, eta=0.5,
                             eta_mem=0.5, weight_bytes=2.0, kv_bytes=1.0)
S = latency.ModelSpec(params=1e6, layers=2.0, d_model=10.0, n_heads=1.0, n_kv_heads=1.0,
                      head_dim=5.0, weight_params=2e6)
T = latency.ModelSpec(params=1e8, layers=2.0, d_model=10.0, n_heads=1.0, n_kv_heads=1.0,
                      head_dim=5.0, weight_params=1e8)
KW = dict(turns=3, tokens_per_turn=4, episodes=2, question_tokens=10, reply_tokens=2)


def test_opd_update_priced_by_hand():
    c = gpucost.scenario("opd", **KW)
    # K = 3 turns of m = 4, E = 2, q = 10, r = 2: mean prefix 10 + (3-1)/2·6 = 16
    assert (c.supervised_turns, c.gen_rounds, c.decode_steps, c.parallel) == (6, 3, 12, 2)
    assert (c.decode_context, c.student_prefill_tokens, c.teacher_prefill_tokens) == (18, 28, 52)
    assert (c.teacher_seq_len, c.tool_rounds, c.train_tokens) == (26, 2, 120)
    got = gpucost.price(c, HW, S, T, tool_latency_s=0.5)
    # decode: each step is memory-bound: (4e6 + 20·(2·18)) B / 5e8 B/s, 12 steps
    assert got["decode_s"] == pytest.approx(12 * (4e6 + 720) / 5e8, rel=1e-6)
    # student prefill: 3 passes, each bound by reading the weights once (4e6 / 5e8)
    assert got["student_prefill_s"] == pytest.approx(3 * 8e-3, rel=1e-6)
    # teacher: one pass over 52 tokens, weight-bound (2e8 / 5e8 = 0.4 s > 52·2e8·... / 5e11)
    assert got["teacher_s"] == pytest.approx(0.4, rel=1e-6)
    assert got["step_s"] == pytest.approx(6 * 1e6 * 120 / 5e11, rel=1e-6)
    assert got["tool_s"] == pytest.approx(2 * 0.5)
    total = 12 * (4e6 + 720) / 5e8 + 0.024 + 0.4 + 1.44e-3 + 1.0
    assert got["total_s"] == pytest.approx(total, rel=1e-6)
    assert got["per_turn_s"] == pytest.approx(total / 6, rel=1e-6)


def test_reopd_update_ratio_and_break_even_by_hand():
    r = gpucost.scenario("reopd", kappa=0.6, **KW)
    tbar = (0.6 + 2 * 0.36) / (1 + 0.6 + 0.36)
    prefix = 10 + tbar * 6
    assert r.supervised_turns == 6 and r.gen_rounds == 1 and r.decode_steps == 4
    assert r.parallel == 6 and r.tool_rounds == 0
    assert r.decode_context == pytest.approx(prefix + 2)
    b_total = (4 * (4e6 + 20 * 6 * (prefix + 2)) / 5e8   # 4 weight-bound decode steps, batch 6
               + 8e-3                                    # one weight-bound prefill pass
               + 0.4                                     # teacher pass, weight-bound
               + 6e6 * 6 * (prefix + 4) / 5e11)          # step
    got = gpucost.price(r, HW, S, T, tool_latency_s=0.5)   # no tool rounds: latency irrelevant
    assert got["total_s"] == pytest.approx(b_total, rel=1e-6)
    a0 = (12 * (4e6 + 720) / 5e8 + 0.024 + 0.4 + 1.44e-3) / 6     # OPD per turn without tool
    o = gpucost.scenario("opd", **KW)
    for L in (0.0, 0.5, 2.0):
        assert gpucost.ratio(o, r, HW, S, T, L) == pytest.approx(
            (a0 + 2 * L / 6) / (b_total / 6), rel=1e-6)
    be4 = gpucost.break_even_latency(o, r, HW, S, T, 4.0)
    assert be4 == pytest.approx((4 * b_total / 6 - a0) / (2 / 6), rel=1e-6)
    assert gpucost.ratio(o, r, HW, S, T, be4) == pytest.approx(4.0, rel=1e-6)
    # already above parity without latency here (OPD's 3 weight-bound rounds): 0.0
    assert gpucost.break_even_latency(o, r, HW, S, T, 1.0) == 0.0


def test_one_turn_opd_has_no_tool_round_and_no_break_even_above_its_ratio():
    o = gpucost.scenario("opd", turns=1, tokens_per_turn=4, episodes=2)
    r = gpucost.scenario("reopd", turns=1, tokens_per_turn=4, episodes=2)
    assert o.tool_rounds == 0
    # one turn: the two methods do the same work (the prefix is the question) -> ratio 1
    assert gpucost.ratio(o, r, HW, S, T, 1.0) == pytest.approx(1.0, rel=1e-6)
    assert gpucost.break_even_latency(o, r, HW, S, T, 4.0) is None


def test_latency_bound_long_turns_favour_reopd_on_an_h100():
    """The mechanism the CPU clock cannot show: with Qwen2.5 1.5B / 7B on an H100, long turns
    and slow tools make OPD's sequential rounds expensive per supervised turn."""
    rows = gpucost.sweep("h100_sxm_bf16", latency.qwen25_1p5b(), latency.qwen25_7b(),
                         turns=[6], tokens_per_turn=[500], latencies_s=[0.0, 2.0],
                         episodes=[8])
    assert rows[1]["ratio"] > rows[0]["ratio"] > 1.0
    assert all(math.isfinite(x["ratio"]) for x in rows)


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="Counts.tool_rounds"):
        gpucost.Counts(**{**gpucost.scenario("opd", **KW).as_dict(), "tool_rounds": -1})
    with pytest.raises(ValueError, match="tool_latency_s"):
        gpucost.price(gpucost.scenario("opd", **KW), HW, S, T, float("nan"))
    with pytest.raises(ValueError, match="GPU profile"):
        gpucost.profile("orin_agx_64gb_bf16")
    with pytest.raises(ValueError, match="method"):
        gpucost.scenario("sft", **KW)
