"""Latency model against a plain-Python transcription and closed-form spot values."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prada_jax import latency as lat

SLM = dict(P=1.31e9, L=28, d=1536)
LLM = dict(P=6.53e9, L=28, d=3584)


def _decode_loop(m, P, L, d, n, c):
    """Token by token: the token at position j costs 2P + 4·L·d·j."""
    return sum(2 * P + 4 * L * d * j for j in range(c, c + n))


def _prefill_scratch(m, n):
    """docs/design.md §3 as written: 2·P·n + 2·L·d·n²."""
    return 2 * m["P"] * n + 2 * m["L"] * m["d"] * n * n


@pytest.mark.parametrize("spec_fn,m", [(lat.qwen25_1p5b, SLM), (lat.qwen25_7b, LLM)],
                         ids=["slm1.5b", "llm7b"])
def test_flops_match_plain_python(spec_fn, m):
    spec = spec_fn()
    rng = np.random.default_rng(0)
    n = rng.integers(1, 400, size=20)
    c = rng.integers(0, 2000, size=20)
    got_dec = np.asarray(jax.jit(lat.decode_flops, static_argnums=())(spec, n, c))
    want_dec = [_decode_loop(m, m["P"], m["L"], m["d"], int(a), int(b)) for a, b in zip(n, c)]
    np.testing.assert_allclose(got_dec, want_dec, rtol=2e-6)
    # From scratch it is the formula of docs/design.md §3; with a cache it is the increment over
    # the cached part.
    np.testing.assert_allclose(np.asarray(lat.prefill_flops(spec, n, 0)),
                               [_prefill_scratch(m, int(a)) for a in n], rtol=2e-6)
    incr = [_prefill_scratch(m, int(a + b)) - _prefill_scratch(m, int(b)) for a, b in zip(n, c)]
    np.testing.assert_allclose(np.asarray(lat.prefill_flops(spec, n, c)), incr, rtol=2e-6)
    one = [2 * m["P"] + 4 * m["L"] * m["d"] * int(b) for b in c]
    np.testing.assert_allclose(np.asarray(lat.decode_token_flops(spec, c)), one, rtol=2e-6)


def test_spot_values_by_hand():
    p = lat.default_latency_params()
    # SLM: prefill 100 tokens = 2·1.31e9·100 + 2·28·1536·100² = 2.62e11 + 8.6016e8.
    np.testing.assert_allclose(float(lat.prefill_flops(p.slm, 100)), 2.6286016e11, rtol=1e-6)
    # Draft of 50 tokens right after a 100-token prompt (prefill 100, decode from position 100):
    # decode = 2·1.31e9·50 + 4·28·1536·(50·100 + 50·49/2) = 1.31e11 + 1.0709e9;
    # time on 4e12 FLOP/s at η = 0.3 = 1.2e12 FLOP/s effective.
    dec = 1.31e11 + 4 * 28 * 1536 * (5000 + 1225)
    want = (2.6286016e11 + dec) / 1.2e12
    np.testing.assert_allclose(float(lat.draft_delay_s(p, 100, 0, 50)), want, rtol=1e-6)
    # Server: 7B, 300 context tokens, 40-token step, 3.12e14·0.3 = 9.36e13 FLOP/s effective.
    srv = (2 * 6.53e9 * 300 + 2 * 28 * 3584 * 300**2
           + 2 * 6.53e9 * 40 + 4 * 28 * 3584 * (40 * 300 + 40 * 39 / 2)) / 9.36e13
    np.testing.assert_allclose(float(lat.server_delay_s(p, 300, 0, 40)), srv, rtol=1e-6)
    # PRM forward over 340 tokens on the server.
    prm = (2 * 6.53e9 * 340 + 2 * 28 * 3584 * 340**2) / 9.36e13
    np.testing.assert_allclose(float(lat.prm_delay_s(p, 340)), prm, rtol=1e-6)
    # Mean SNR: −50 − (128.1 + 37.6·log10(0.2)) + 174 − 9 dB = 13.1813 dB.
    snr_db = -50 - (128.1 + 37.6 * math.log10(0.2)) + 174 - 9
    np.testing.assert_allclose(float(lat.mean_snr_db(p)), snr_db, rtol=1e-6)
    np.testing.assert_allclose(snr_db, 13.18130, atol=1e-4)


def test_wireless_against_plain_python():
    p = lat.default_latency_params()
    rng = np.random.default_rng(1)
    fading = rng.exponential(size=50).astype(np.float32)
    bits = rng.integers(16, 16 * 3000, size=50).astype(np.float32)
    snr_bar = 10 ** ((-50 - (128.1 + 37.6 * math.log10(0.2)) + 174 - 9) / 10)
    snr = np.asarray(lat.snr_linear(p, fading))
    np.testing.assert_allclose(snr, snr_bar * fading.astype(np.float64), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(lat.in_outage(p, snr)), snr < 1.0)  # γ_th = 0 dB
    bw = np.asarray(lat.request_bandwidth_hz(p, bits, snr, 20e6))
    for b, s, got in zip(bits, snr, bw):
        need = b / (math.log(1 + s, 2) * 1e-3)
        np.testing.assert_allclose(got, min(max(need, 1e4), 20e6), rtol=1e-5)
    t = np.asarray(lat.transfer_delay_s(bits, bw, snr))
    np.testing.assert_allclose(t, bits / (bw * np.log2(1 + snr.astype(np.float64))), rtol=1e-5)
    # Unclipped requests upload in exactly the target time.
    free = (bw > 1e4) & (bw < 20e6)
    np.testing.assert_allclose(t[free], 1e-3, rtol=1e-5)


def test_no_outage_at_minus_inf_threshold():
    p = lat.default_latency_params(snr_threshold_db=-math.inf)
    assert not bool(jnp.any(lat.in_outage(p, jnp.array([0.0, 1e-12, 5.0]))))


def test_bad_latency_fields_named():
    with pytest.raises(ValueError, match="latency.edge_eta"):
        lat.validate_latency_params(lat.default_latency_params(edge_eta=0.0))
    with pytest.raises(ValueError, match="latency.server_eta"):
        lat.validate_latency_params(lat.default_latency_params(server_eta=1.5))
    with pytest.raises(ValueError, match="unknown latency field"):
        lat.default_latency_params(edge_flops=1.0)
    with pytest.raises(ValueError, match="latency.llm.params"):
        lat.validate_latency_params(lat.default_latency_params().replace(
            llm=lat.qwen25_7b().replace(params=-1.0)))
