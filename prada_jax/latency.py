"""FLOP-based compute delay and wireless communication delay as pure jnp functions (docs/design.md §3).

Every function is elementwise over its array arguments (any broadcastable shapes) and jit-able.

Compute model (per model ``M`` with non-embedding parameters ``P``, ``L`` layers, width ``d``):

* prefill of ``n`` new tokens after ``c`` cached tokens:
  ``2·P·n + 2·L·d·(n² + 2·n·c)`` FLOPs. With ``c = 0`` this is the paper's
  ``2·P·n + 2·L·d·n²`` (PRADA Eqs. (14)–(16));
  the ``4·L·d·n·c`` term is the new tokens attending to the cached ones.
* decoding one token at position ``j`` (``j`` tokens already in context): ``2·P + 4·L·d·j``;
  decoding ``m`` tokens starting at position ``c`` sums that over ``j = c … c+m-1``:
  ``2·P·m + 4·L·d·(m·c + m·(m-1)/2)``.
* delay = FLOPs / (peak FLOP/s · η).

Wireless model (uplink and downlink share one per-request bandwidth ``b``):

* mean SNR (linear) from a fixed transmit power spectral density, a log-distance path loss and
  the receiver noise PSD: ``SNR_dB = tx_psd − PL(distance) − (noise_psd + noise_figure)``, with
  ``PL(d_km) = pl_ref_db + pl_exp_db · log10(d_km)`` (3GPP urban macro form). Because the PSD
  is fixed, the SNR does not depend on how much bandwidth a request gets.
* per-slot SNR = mean SNR × Rayleigh power gain ``|h|² ~ Exp(1)``; an upload whose SNR is below
  ``γ_th`` fails (outage).
* rate ``b·log2(1+SNR)`` bit/s; delay = bits / rate.
* bandwidth a request asks for: enough to upload its context within ``uplink_target_s``,
  clipped to ``[min_request_hz, max]``. This makes bandwidth a per-request, channel- and
  context-dependent resource, so the bandwidth multiplier µ prices something the server-unit
  multiplier λ_s does not.

All figures below are *assumptions* (the paper's device FLOP/s, bandwidth and SNR figures are
not public); the model presets are the Qwen2.5 architectures.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ModelSpec:
    """Architecture numbers that set a model's FLOPs (all float32 leaves so they can be vmapped).

    Attributes:
      params: non-embedding parameter count P (parameters).
      layers: transformer layers L.
      d_model: hidden width d.
      n_heads: attention (query) heads (documentation; FLOPs use d).
      n_kv_heads: key/value heads (documentation; sets the KV cache size, not FLOPs).
    """

    params: float
    layers: float
    d_model: float
    n_heads: float
    n_kv_heads: float


def qwen25_1p5b() -> ModelSpec:
    """Qwen2.5 1.5B (the edge SLM): d 1536, 28 layers, 12/2 heads, P = 1.31e9."""
    return ModelSpec(params=1.31e9, layers=28.0, d_model=1536.0, n_heads=12.0, n_kv_heads=2.0)


def qwen25_7b() -> ModelSpec:
    """Qwen2.5 7B (the server LLM, and the online PRM of the RSD baseline): d 3584, 28 layers,
    28/4 heads, P = 6.53e9."""
    return ModelSpec(params=6.53e9, layers=28.0, d_model=3584.0, n_heads=28.0, n_kv_heads=4.0)


PRESETS = {"qwen2.5-1.5b": qwen25_1p5b, "qwen2.5-7b": qwen25_7b}


@struct.dataclass
class LatencyParams:
    """Every constant of the latency model, with its unit. Defaults: ``default_latency_params``.

    Attributes:
      slm: edge small model (drafts every step).
      llm: server large model (runs nominated steps).
      prm: process reward model, charged only to the online-PRM (RSD) baseline.
      edge_peak_flops: edge device peak, FLOP/s. Default 4e12 (a phone/laptop NPU class, assumed).
      edge_eta: edge utilisation η, dimensionless. Default 0.3.
      server_peak_flops: server peak, FLOP/s. Default 3.12e14 (A100 bf16 dense, assumed).
      server_eta: server utilisation η, dimensionless. Default 0.3.
      bits_per_token: uplink/downlink payload per token, bits. Default 16 (token ids).
      tx_psd_dbm_hz: transmit power spectral density, dBm/Hz. Default −50 (23 dBm over 20 MHz).
      noise_psd_dbm_hz: thermal noise PSD, dBm/Hz. Default −174.
      noise_figure_db: receiver noise figure, dB. Default 9.
      distance_m: edge–server (base station) distance, m. Default 200.
      pl_ref_db: path loss at 1 km, dB. Default 128.1 (3GPP UMa).
      pl_exp_db: path-loss slope, dB per decade of km. Default 37.6.
      snr_threshold_db: outage threshold γ_th, dB. Default 0. ``-inf`` disables outages.
      uplink_target_s: upload time a request sizes its bandwidth for, s. Default 1e-3.
      min_request_hz: smallest bandwidth a request asks for, Hz. Default 1e4.
    """

    slm: ModelSpec
    llm: ModelSpec
    prm: ModelSpec
    edge_peak_flops: float = 4e12
    edge_eta: float = 0.3
    server_peak_flops: float = 3.12e14
    server_eta: float = 0.3
    bits_per_token: float = 16.0
    tx_psd_dbm_hz: float = -50.0
    noise_psd_dbm_hz: float = -174.0
    noise_figure_db: float = 9.0
    distance_m: float = 200.0
    pl_ref_db: float = 128.1
    pl_exp_db: float = 37.6
    snr_threshold_db: float = 0.0
    uplink_target_s: float = 1e-3
    min_request_hz: float = 1e4


def default_latency_params(**overrides) -> LatencyParams:
    """The default (assumed) constants; keyword overrides replace fields by name."""
    p = LatencyParams(slm=qwen25_1p5b(), llm=qwen25_7b(), prm=qwen25_7b())
    bad = set(overrides) - set(LatencyParams.__dataclass_fields__)
    if bad:
        raise ValueError(f"unknown latency field(s) {sorted(bad)}; known: "
                         f"{sorted(LatencyParams.__dataclass_fields__)}")
    return p.replace(**overrides)


def validate_latency_params(p: LatencyParams, prefix: str = "latency") -> None:
    """Raises ``ValueError`` naming the first field that is out of range (host-side check)."""
    for name in ("edge_peak_flops", "edge_eta", "server_peak_flops", "server_eta",
                 "bits_per_token", "distance_m", "uplink_target_s", "min_request_hz"):
        v = float(getattr(p, name))
        if not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{prefix}.{name} must be a finite number > 0, got {v}")
    for name in ("edge_eta", "server_eta"):
        if float(getattr(p, name)) > 1:
            raise ValueError(f"{prefix}.{name} must be <= 1, got {float(getattr(p, name))}")
    for m in ("slm", "llm", "prm"):
        spec = getattr(p, m)
        for f in ("params", "layers", "d_model"):
            v = float(getattr(spec, f))
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"{prefix}.{m}.{f} must be a finite number > 0, got {v}")
    if math.isnan(float(p.snr_threshold_db)) or float(p.snr_threshold_db) == math.inf:
        raise ValueError(f"{prefix}.snr_threshold_db must be a number or -inf, "
                         f"got {float(p.snr_threshold_db)}")


# ----------------------------------------------------------------------------- compute

def prefill_flops(spec: ModelSpec, n_new, n_cached=0.0):
    """FLOPs to prefill ``n_new`` tokens after ``n_cached`` tokens already in the KV cache.

    ``2·P·n + 2·L·d·(n² + 2·n·c)``; with ``c = 0`` the paper's ``2·P·n + 2·L·d·n²``. Elementwise.
    """
    n = jnp.asarray(n_new, jnp.float32)
    c = jnp.asarray(n_cached, jnp.float32)
    return 2.0 * spec.params * n + 2.0 * spec.layers * spec.d_model * (n * n + 2.0 * n * c)


def decode_token_flops(spec: ModelSpec, position):
    """FLOPs to decode one token with ``position`` tokens already in context: ``2·P + 4·L·d·j``."""
    j = jnp.asarray(position, jnp.float32)
    return 2.0 * spec.params + 4.0 * spec.layers * spec.d_model * j


def decode_flops(spec: ModelSpec, n_tokens, start_position):
    """FLOPs to decode ``n_tokens`` tokens, the first at position ``start_position``.

    Closed form of ``Σ_{j=c}^{c+m-1} (2·P + 4·L·d·j) = 2·P·m + 4·L·d·(m·c + m·(m−1)/2)``.
    """
    m = jnp.asarray(n_tokens, jnp.float32)
    c = jnp.asarray(start_position, jnp.float32)
    return 2.0 * spec.params * m + 4.0 * spec.layers * spec.d_model * (m * c + 0.5 * m * (m - 1.0))


def compute_delay_s(flops, peak_flops, eta):
    """Seconds to execute ``flops`` on a device of ``peak_flops`` FLOP/s at utilisation ``eta``."""
    return jnp.asarray(flops, jnp.float32) / (peak_flops * eta)


def draft_delay_s(p: LatencyParams, n_new, n_cached, draft_tokens):
    """Edge SLM delay (s) to prefill what is new since its KV cache and draft one step.

    Args:
      n_new: tokens to prefill (not yet in the SLM's KV cache), any shape.
      n_cached: tokens already in the SLM's KV cache.
      draft_tokens: tokens of the drafted step (decoded after the full context).
    """
    ctx = jnp.asarray(n_cached, jnp.float32) + jnp.asarray(n_new, jnp.float32)
    flops = prefill_flops(p.slm, n_new, n_cached) + decode_flops(p.slm, draft_tokens, ctx)
    return compute_delay_s(flops, p.edge_peak_flops, p.edge_eta)


def server_delay_s(p: LatencyParams, n_new, n_cached, step_tokens):
    """Server LLM delay (s): prefill the uploaded (uncached) context, then decode one step."""
    ctx = jnp.asarray(n_cached, jnp.float32) + jnp.asarray(n_new, jnp.float32)
    flops = prefill_flops(p.llm, n_new, n_cached) + decode_flops(p.llm, step_tokens, ctx)
    return compute_delay_s(flops, p.server_peak_flops, p.server_eta)


def prm_delay_s(p: LatencyParams, n_tokens):
    """Online PRM cost (s) of the RSD baseline: one forward pass over ``n_tokens`` (prefix + draft)
    on server hardware with no KV reuse (a value-head PRM scores the whole sequence)."""
    return compute_delay_s(prefill_flops(p.prm, n_tokens, 0.0), p.server_peak_flops, p.server_eta)


# ----------------------------------------------------------------------------- wireless

def db_to_linear(db):
    return jnp.power(10.0, jnp.asarray(db, jnp.float32) / 10.0)


def path_loss_db(p: LatencyParams):
    """Log-distance path loss (dB): ``pl_ref_db + pl_exp_db · log10(distance_km)``."""
    return p.pl_ref_db + p.pl_exp_db * jnp.log10(jnp.asarray(p.distance_m, jnp.float32) / 1000.0)


def mean_snr_db(p: LatencyParams):
    """Mean received SNR (dB) before fading: tx PSD − path loss − (noise PSD + noise figure)."""
    return p.tx_psd_dbm_hz - path_loss_db(p) - (p.noise_psd_dbm_hz + p.noise_figure_db)


def snr_linear(p: LatencyParams, fading_gain):
    """Per-slot linear SNR = mean SNR × Rayleigh power gain ``fading_gain`` (|h|² ~ Exp(1))."""
    return db_to_linear(mean_snr_db(p)) * jnp.asarray(fading_gain, jnp.float32)


def in_outage(p: LatencyParams, snr):
    """True where the linear ``snr`` is below the threshold γ_th (``snr_threshold_db``)."""
    return snr < db_to_linear(p.snr_threshold_db)


def spectral_efficiency(snr):
    """Shannon spectral efficiency ``log2(1 + SNR)`` in bit/s/Hz."""
    return jnp.log2(1.0 + jnp.asarray(snr, jnp.float32))


def request_bandwidth_hz(p: LatencyParams, upload_bits, snr, max_hz):
    """Bandwidth (Hz) a request asks for: upload within ``uplink_target_s``, clipped to
    ``[min_request_hz, max_hz]``."""
    need = upload_bits / (spectral_efficiency(snr) * p.uplink_target_s)
    return jnp.clip(need, p.min_request_hz, max_hz)


def transfer_delay_s(bits, bandwidth_hz, snr):
    """Seconds to send ``bits`` at rate ``bandwidth_hz · log2(1 + snr)``."""
    return jnp.asarray(bits, jnp.float32) / (bandwidth_hz * spectral_efficiency(snr))
