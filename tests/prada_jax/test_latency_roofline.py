"""The roofline clock of ``prada_jax.latency`` against closed forms written here in NumPy
(float64), and one profile against a published measured decode rate."""
import json

import jax
import numpy as np
import pytest

from prada_jax import latency as lat
from prada_jax.errors import BadInput


def _arch(spec):
    return dict(P=float(spec.params), L=float(spec.layers), d=float(spec.d_model),
                kv=2.0 * float(spec.layers) * float(spec.n_kv_heads) * float(spec.head_dim),
                Wn=float(spec.weight_params))


def _hw(h):
    return {f: float(getattr(h, f)) for f in lat.HardwareProfile.__dataclass_fields__}


def _step_ref(a, h, contexts):
    """One decode step of a batch with the given contexts, written as a loop over sequences."""
    # lm_head counts: every decoded token multiplies all Wn weights (issue 41)
    flops = sum(2 * a["Wn"] + 4 * a["L"] * a["d"] * c for c in contexts)
    byts = a["Wn"] * h["weight_bytes"] + sum(a["kv"] * h["kv_bytes"] * c for c in contexts)
    return max(flops / (h["peak_flops"] * h["eta"]), byts / (h["mem_bw"] * h["eta_mem"]))


PAIRS = [p for p in lat.PAIRS if p != lat.PAPER]


@pytest.mark.parametrize("pair", PAIRS)
def test_prefill_against_closed_form(pair):
    p = lat.pair_latency_params(pair)
    for spec, hw in ((p.slm, p.edge_hw), (p.llm, p.server_hw)):
        a, h = _arch(spec), _hw(hw)
        n = np.array([1, 7, 64, 512, 2000], float)
        c = np.array([0, 300, 0, 100, 1500], float)
        # one lm_head product per pass: only the last position's logits
        t_flop = (2 * a["P"] * n + 2 * a["L"] * a["d"] * (n ** 2 + 2 * n * c)
                  + 2 * (a["Wn"] - a["P"])) / (
            h["peak_flops"] * h["eta"])
        t_mem = (a["Wn"] * h["weight_bytes"] + a["kv"] * h["kv_bytes"] * c) / (
            h["mem_bw"] * h["eta_mem"])
        got = np.asarray(jax.jit(lambda n, c: lat.prefill_s(spec, hw, n, c))(n, c))
        np.testing.assert_allclose(got, np.maximum(t_flop, t_mem), rtol=2e-5)
        # A long prefill is compute-bound (DESIGN §3), a one-token pass reads the weights.
        assert t_flop[-1] > t_mem[-1] and t_mem[0] > t_flop[0]
    assert float(lat.prefill_s(p.llm, p.server_hw, 0.0, 100.0)) == 0.0


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("batch", [1, 8, 32, 200])
def test_decode_step_and_sum_against_token_loop(pair, batch):
    p = lat.pair_latency_params(pair)
    rng = np.random.default_rng(batch)
    for spec, hw in ((p.slm, p.edge_hw), (p.llm, p.server_hw)):
        a, h = _arch(spec), _hw(hw)
        ctx = rng.integers(0, 3000, batch).astype(float)
        got = float(lat.decode_step_s(spec, hw, batch, ctx.sum()))
        np.testing.assert_allclose(got, _step_ref(a, h, ctx), rtol=2e-5)
        for m, c0 in ((1, 0), (37, 120), (400, 900)):
            want = sum(_step_ref(a, h, [j] * batch) for j in range(c0, c0 + m))
            got = float(lat.decode_s(spec, hw, m, c0, batch))
            np.testing.assert_allclose(got, want, rtol=1e-4)


def test_decode_sum_splits_where_the_bound_changes():
    """A range of contexts that crosses from FLOP- to byte-bound (and back for the other
    slope sign): the closed form must split the sum at the crossing."""
    p = lat.pair_latency_params("a100_orin_bf16")
    spec = p.llm
    for hw in (p.server_hw, p.server_hw.replace(kv_bytes=40.0)):
        a, h = _arch(spec), _hw(hw)
        for b in (150, 400, 1000):
            per = [_step_ref(a, h, [j] * b) for j in range(0, 4000, 50)]
            flop = [(2 * a["Wn"] + 4 * a["L"] * a["d"] * j) * b / (h["peak_flops"] * h["eta"])
                    for j in range(0, 4000, 50)]
            want = sum(_step_ref(a, h, [j] * b) for j in range(0, 4000))
            np.testing.assert_allclose(float(lat.decode_s(spec, hw, 4000, 0, b)), want,
                                       rtol=1e-4)
        bound = [abs(x - y) < 1e-12 * x for x, y in zip(per, flop)]
        assert any(bound) and not all(bound)     # the bound changes inside the range


def test_memory_to_compute_crossover_batch():
    """Below b* = W/(BW·η_mem) / (FLOP/(peak·η) − KV/(BW·η_mem)) per sequence a step costs the
    weight read; above it the FLOPs (A100, 7B, context 500)."""
    p = lat.pair_latency_params("a100_orin_bf16")
    a, h = _arch(p.llm), _hw(p.server_hw)
    c = 500.0
    f = (2 * a["Wn"] + 4 * a["L"] * a["d"] * c) / (h["peak_flops"] * h["eta"])
    k = a["kv"] * h["kv_bytes"] * c / (h["mem_bw"] * h["eta_mem"])
    w = a["Wn"] * h["weight_bytes"] / (h["mem_bw"] * h["eta_mem"])
    b_star = w / (f - k)
    assert 50 < b_star < 500
    lo, hi = int(np.floor(b_star)), int(np.ceil(b_star)) + 1
    for b, bound in ((1, "mem"), (lo, "mem"), (hi, "flop"), (4 * hi, "flop")):
        t = float(lat.decode_step_s(p.llm, p.server_hw, b, b * c))
        np.testing.assert_allclose(t, (w + b * k) if bound == "mem" else b * f, rtol=2e-5)
    # Per-token cost falls with the batch while memory-bound: 32 sequences cost < 1.1× one.
    t1 = float(lat.decode_step_s(p.llm, p.server_hw, 1, c))
    t32 = float(lat.decode_step_s(p.llm, p.server_hw, 32, 32 * c))
    assert t32 < 1.1 * t1


def test_a100_7b_token_is_the_bandwidth_roofline():
    """DESIGN §3: 14.1 GB of bf16 weights at 2.039 TB/s ≈ 6.9 ms per token at full bandwidth
    (8.7 ms at the assumed η_mem = 0.8), against 0.14 ms from FLOPs alone (the paper clock)."""
    p = lat.pair_latency_params("a100_orin_bf16")
    t = float(lat.decode_step_s(p.llm, p.server_hw.replace(eta_mem=1.0), 1, 0.0))
    assert 6.8e-3 < t < 7.0e-3
    paper = lat.default_latency_params()
    t_paper = float(lat.compute_delay_s(lat.decode_token_flops(paper.llm, 0.0),
                                        paper.server_peak_flops, paper.server_eta))
    assert 0.13e-3 < t_paper < 0.15e-3


def test_orin_nano_super_against_published_decode_rate():
    """NVIDIA's Jetson Orin Nano Super blog reports Qwen2.5-7B at INT4 at about 21.75 tokens/s.
    The profile (102 GB/s, assumed η_mem = 0.8, 4.5-bit weights) predicts 1 / step at a short
    context (128 tokens). Band ±20 %: η_mem is one assumption shared by every profile, the
    quantisation layout (bits per weight incl. scales) of the measured run and its context are
    not stated, and the blog gives one number without spread."""
    spec = lat.qwen25_7b()
    hw = lat.orin_nano_super_int4()
    rate = 1.0 / float(lat.decode_step_s(spec, hw, 1, 128.0))
    assert abs(rate / 21.75 - 1.0) < 0.20, rate


@pytest.mark.parametrize("field", ["peak_flops", "mem_bw", "mem_bytes"])
def test_custom_pair_file_and_its_bad_fields(tmp_path, field):
    good = {f: float(getattr(lat.a100_80gb_bf16(), f))
            for f in lat.HardwareProfile.__dataclass_fields__}
    path = tmp_path / "pair.json"
    path.write_text(json.dumps({"edge": "orin_agx_64gb_int4", "server": good}))
    p = lat.pair_latency_params(str(path))
    lat.validate_latency_params(p, hardware=str(path))
    assert p.roofline and float(p.server_hw.peak_flops) == 312e12
    path.write_text(json.dumps({"edge": "orin_agx_64gb_int4", "server": dict(good, **{field: 0})}))
    p = lat.pair_latency_params(str(path))
    with pytest.raises(BadInput, match=f"server.{field} must be a finite number > 0"):
        lat.validate_latency_params(p, hardware=str(path))


def test_unknown_names_and_weights_beyond_memory():
    with pytest.raises(BadInput, match="unknown hardware pair 'nope'"):
        lat.pair_latency_params("nope")
    p = lat.pair_latency_params("a100_orin_bf16")
    small = p.replace(edge_hw=p.edge_hw.replace(mem_bytes=1e9))  # 3.1 GB of SLM weights
    with pytest.raises(BadInput, match="edge.mem_bytes"):
        lat.validate_latency_params(small, hardware="x")


def test_paper_pair_is_the_default_constants():
    a = lat.pair_latency_params("paper")
    b = lat.default_latency_params()
    assert not a.roofline and a.edge_hw is None
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x == y


@pytest.mark.parametrize("hardware", ["a100_orin_int4", "paper"])
def test_server_speed_scales_the_selected_pairs_server(hardware):
    """A scenario's ``server_speed`` (envs.scenarios.latency_overrides) scales the peak FLOP/s
    of the *selected* pair's server (not the paper profile's), and nothing else."""
    from envs import scenarios
    base = lat.pair_latency_params(hardware)
    over = scenarios.latency_overrides({"server_speed": 0.1})
    slow = lat.pair_latency_params(hardware, **over)
    if hardware == "paper":
        assert float(slow.server_peak_flops) == pytest.approx(0.1 * float(base.server_peak_flops))
        return
    peak = float(base.server_hw.peak_flops)
    assert float(slow.server_hw.peak_flops) == pytest.approx(0.1 * peak)
    assert peak == float(lat.PROFILES[lat.PAIRS[hardware][1]]().peak_flops)
    for f in ("mem_bw", "mem_bytes", "eta", "eta_mem"):
        assert float(getattr(slow.server_hw, f)) == float(getattr(base.server_hw, f)), f
    assert _hw(slow.edge_hw) == _hw(base.edge_hw)
