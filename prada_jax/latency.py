"""Compute delay (over named hardware pairs) and wireless delay as pure jnp functions
(docs/latency.md).

Every function is elementwise over its array arguments (any broadcastable shapes) and jit-able.

Two clocks, chosen by a hardware pair (``PAIRS``; docs/latency.md): ``paper`` (the default)
is the FLOP-only model below with the paper's constants; every other pair names an edge and
a server ``HardwareProfile`` (``PROFILES``, each figure with its source) and prices phases by
a roofline: prefill ``max(FLOPs/(peak·η), bytes/(BW·η_mem))`` (``prefill_s``), a decode step
of b sequences ``max(Σ FLOPs/(peak·η), (W + Σ KV)/(BW·η_mem))`` (``decode_step_s``), its sum
over a step's tokens in closed form (``decode_s``).

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
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import struct

from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json


@struct.dataclass
class ModelSpec:
    """Architecture numbers that set a model's FLOPs (all float32 leaves so they can be vmapped).

    Attributes:
      params: non-embedding parameter count P (parameters).
      layers: transformer layers L.
      d_model: hidden width d.
      n_heads: attention (query) heads (documentation; FLOPs use d).
      n_kv_heads: key/value heads (sets the KV cache size, not FLOPs).
      head_dim: width of one attention head (sets the KV cache size).
      weight_params: parameters whose weights a decode step reads from memory: the
        non-embedding ``params`` plus the output projection (lm_head; the tied embedding matrix
        where input and output embeddings are tied). The embedding lookup reads one row per
        token and is not counted. Only the roofline clock reads this field.
      head_flops: 1 (default): the roofline clock counts the output projection's FLOPs too
        (``2·weight_params`` per decoded token, and one lm_head product per prefill pass: only
        the last position's logits are computed); 0: only ``2·params`` (the clock of results
        before issue 41, kept by the ``legacy`` server preset). The ``paper`` clock never
        reads it (PRADA Eqs. (14)-(16) count ``2·P``).
    """

    params: float
    layers: float
    d_model: float
    n_heads: float
    n_kv_heads: float
    head_dim: float = 128.0
    weight_params: float = 0.0
    head_flops: float = 1.0


def token_flop_params(spec: ModelSpec):
    """Parameters whose products one decoded token costs under the roofline clock:
    ``params + head_flops·(weight_params − params)`` (with the default ``head_flops`` = 1, the
    non-embedding parameters plus lm_head: 7.075e9 for the 7B, +8 % over ``params``)."""
    return spec.params + spec.head_flops * (spec.weight_params - spec.params)


def qwen25_1p5b() -> ModelSpec:
    """Qwen2.5 1.5B (the edge SLM): d 1536, 28 layers, 12/2 heads, head dim 128, P = 1.31e9
    non-embedding; vocabulary 151936 with tied embeddings, so a decode step reads
    1.31e9 + 151936·1536 = 1.543e9 weights (3.09 GB in bf16). Source: the Qwen2.5 technical
    report (arXiv 2412.15115, Table 1) and the model's config.json."""
    return ModelSpec(params=1.31e9, layers=28.0, d_model=1536.0, n_heads=12.0, n_kv_heads=2.0,
                     head_dim=128.0, weight_params=1.31e9 + 151936.0 * 1536.0)


def qwen25_7b() -> ModelSpec:
    """Qwen2.5 7B (the server LLM, and the online PRM of the RSD baseline): d 3584, 28 layers,
    28/4 heads, head dim 128, P = 6.53e9 non-embedding; vocabulary 152064, untied lm_head, so a
    decode step reads 6.53e9 + 152064·3584 = 7.075e9 weights (14.15 GB in bf16). Same sources."""
    return ModelSpec(params=6.53e9, layers=28.0, d_model=3584.0, n_heads=28.0, n_kv_heads=4.0,
                     head_dim=128.0, weight_params=6.53e9 + 152064.0 * 3584.0)


def qwen25_math_prm_7b() -> ModelSpec:
    """Qwen2.5-Math-PRM-7B (the online PRM of the RSD baseline, the size the PRADA paper's PRM
    has): the Qwen2.5-7B backbone (d 3584, 28 layers, 28/4 heads, head dim 128, P = 6.53e9)
    with a two-layer value head on the hidden states instead of the 152064-row lm_head: a
    scoring pass reads 6.53e9 + 3584·3584 + 3584·2 ≈ 6.543e9 weights. Source: the model card and
    config.json of Qwen/Qwen2.5-Math-PRM-7B (Qwen2ForProcessRewardModel: score head
    Linear(3584, 3584) → ReLU → Linear(3584, 2))."""
    head = 3584.0 * 3584.0 + 3584.0 * 2.0
    return ModelSpec(params=6.53e9, layers=28.0, d_model=3584.0, n_heads=28.0, n_kv_heads=4.0,
                     head_dim=128.0, weight_params=6.53e9 + head)


def qwen25_prm_1p5b() -> ModelSpec:
    """A 1.5B PRM option: the Qwen2.5-1.5B backbone (d 1536, 28 layers, 12/2 heads, P = 1.31e9)
    with the same kind of value head (1536·1536 + 1536·2 weights) instead of the lm_head.
    ASSUMED shape (a PRM of that size, e.g. Skywork-o1-Open-PRM-Qwen-2.5-1.5B, has this
    backbone)."""
    head = 1536.0 * 1536.0 + 1536.0 * 2.0
    return ModelSpec(params=1.31e9, layers=28.0, d_model=1536.0, n_heads=12.0, n_kv_heads=2.0,
                     head_dim=128.0, weight_params=1.31e9 + head)


PRESETS = {"qwen2.5-1.5b": qwen25_1p5b, "qwen2.5-7b": qwen25_7b,
           "qwen2.5-math-prm-7b": qwen25_math_prm_7b, "qwen2.5-prm-1.5b": qwen25_prm_1p5b}


@struct.dataclass
class HardwareProfile:
    """One device at one precision, as the roofline clock sees it (all float32 leaves, so
    swapping profiles of the same pair kind does not recompile a jitted env).

    Attributes:
      peak_flops: peak dense FLOP/s at the precision the matrix multiplies run in [FLOP/s].
      mem_bw: peak memory bandwidth [bytes/s].
      mem_bytes: memory the model's weights and KV cache share [bytes].
      eta: compute utilisation η (achieved / peak FLOP/s) [1].
      eta_mem: memory utilisation η_mem (achieved / peak bandwidth) [1].
      weight_bytes: bytes per stored weight (2 for bf16; 4.5 bits = 0.5625 for group-wise INT4
        with one fp16 scale per 32 weights, as llama.cpp's Q4_0) [bytes].
      kv_bytes: bytes per stored KV-cache element [bytes].
    """

    peak_flops: float
    mem_bw: float
    mem_bytes: float
    eta: float
    eta_mem: float
    weight_bytes: float
    kv_bytes: float


#: Utilisation factors shared by every profile. ASSUMED, not measured on these devices: η = 0.5
#: is a typical model-FLOP utilisation of a compute-bound prefill; η_mem = 0.8 a typical share
#: of the peak bandwidth a memory-bound decode step reaches. The one published measurement we
#: check against (``orin_nano_super_int4``: Qwen2.5-7B INT4 at 21.75 tokens/s) sits at 0.85 of
#: its bandwidth roofline (tests/prada_jax/test_latency_roofline.py).
ASSUMED_ETA = 0.5
ASSUMED_ETA_MEM = 0.8
INT4_WEIGHT_BYTES = 4.5 / 8.0   # 4-bit weights + one fp16 scale per 32 (18 bytes per 32)


def a100_80gb_bf16() -> HardwareProfile:
    """NVIDIA A100 80GB SXM at bf16. NVIDIA A100 datasheet (2021): 312 TFLOP/s bf16 dense Tensor
    Core, 2,039 GB/s HBM2e, 80 GB. η, η_mem assumed (``ASSUMED_ETA``, ``ASSUMED_ETA_MEM``)."""
    return HardwareProfile(peak_flops=312e12, mem_bw=2.039e12, mem_bytes=80e9, eta=ASSUMED_ETA,
                           eta_mem=ASSUMED_ETA_MEM, weight_bytes=2.0, kv_bytes=2.0)


def h100_sxm_bf16() -> HardwareProfile:
    """NVIDIA H100 SXM at bf16. NVIDIA H100 datasheet: 989 TFLOP/s bf16 dense Tensor Core,
    3.35 TB/s HBM3, 80 GB. η, η_mem assumed."""
    return HardwareProfile(peak_flops=989e12, mem_bw=3.35e12, mem_bytes=80e9, eta=ASSUMED_ETA,
                           eta_mem=ASSUMED_ETA_MEM, weight_bytes=2.0, kv_bytes=2.0)


def orin_agx_64gb_bf16() -> HardwareProfile:
    """NVIDIA Jetson AGX Orin 64GB module at bf16. Jetson AGX Orin series technical brief /
    module datasheet: 204.8 GB/s LPDDR5, 64 GB (shared with the CPU), GPU 170 INT8 TOPS with
    2:4 sparsity. Dense fp16/bf16 Tensor-Core rate DERIVED from it: Ampere Tensor Cores run
    fp16 at half the INT8 rate and sparsity doubles the quoted figure, so 170/2/2 = 42.5 TFLOP/s
    (the 275 TOPS headline adds the two DLAs, which do not run an LLM here). η, η_mem assumed."""
    return HardwareProfile(peak_flops=42.5e12, mem_bw=204.8e9, mem_bytes=64e9, eta=ASSUMED_ETA,
                           eta_mem=ASSUMED_ETA_MEM, weight_bytes=2.0, kv_bytes=2.0)


def orin_agx_64gb_int4() -> HardwareProfile:
    """Jetson AGX Orin 64GB with INT4 weights (weight-only quantisation, W4A16): the same device
    as ``orin_agx_64gb_bf16``; weights stored at ``INT4_WEIGHT_BYTES`` (4.5 bits: llama.cpp
    Q4_0 layout) and dequantised to fp16 for the matrix multiplies, so the FLOP rate is the
    fp16 one (42.5 TFLOP/s, derived as there); the KV cache stays fp16. η, η_mem assumed."""
    return orin_agx_64gb_bf16().replace(weight_bytes=INT4_WEIGHT_BYTES)


def orin_nano_super_int4() -> HardwareProfile:
    """NVIDIA Jetson Orin Nano 8GB "Super" (JetPack 6.1 clocks) with INT4 weights. Jetson Orin
    Nano Super developer kit datasheet (Dec 2024): 102 GB/s LPDDR5, 8 GB, 67 INT8 TOPS with
    sparsity; fp16 dense DERIVED as 67/4 = 16.75 TFLOP/s. Used to check η_mem against a published
    measurement (NVIDIA's Orin Nano Super blog: Qwen2.5-7B INT4 at about 21.75 tokens/s).
    η, η_mem assumed."""
    return HardwareProfile(peak_flops=16.75e12, mem_bw=102e9, mem_bytes=8e9, eta=ASSUMED_ETA,
                           eta_mem=ASSUMED_ETA_MEM, weight_bytes=INT4_WEIGHT_BYTES, kv_bytes=2.0)


def snapdragon_8g3_int4() -> HardwareProfile:
    """A phone-class NPU at INT4: Qualcomm Snapdragon 8 Gen 3 class. Qualcomm's product brief:
    LPDDR5X up to 4800 MHz on a 64-bit bus = 76.8 GB/s. The Hexagon NPU's 45 INT8 TOPS is the
    widely reported figure (Qualcomm quotes relative gains only): ASSUMED, and taken as the
    rate of the W4A8 matrix multiplies. Memory 16 GB: a flagship phone's RAM (the SoC supports
    up to 24 GB), ASSUMED; weights at ``INT4_WEIGHT_BYTES``, KV cache fp16. η, η_mem assumed."""
    return HardwareProfile(peak_flops=45e12, mem_bw=76.8e9, mem_bytes=16e9, eta=ASSUMED_ETA,
                           eta_mem=ASSUMED_ETA_MEM, weight_bytes=INT4_WEIGHT_BYTES, kv_bytes=2.0)


#: Named hardware profiles (name → constructor).
PROFILES = {"a100_80gb_bf16": a100_80gb_bf16, "h100_sxm_bf16": h100_sxm_bf16,
            "orin_agx_64gb_bf16": orin_agx_64gb_bf16, "orin_agx_64gb_int4": orin_agx_64gb_int4,
            "orin_nano_super_int4": orin_nano_super_int4,
            "snapdragon_8g3_int4": snapdragon_8g3_int4}

#: The paper's FLOP-only clock (PRADA Eqs. (14)-(16), the constants of ``LatencyParams``): the
#: default, so earlier results reproduce bit for bit.
PAPER = "paper"

#: Named (edge, server) pairs; ``paper`` is the FLOP-only clock with a fixed-slot server, the
#: others the roofline clock with a batching server (``envs.edge``).
PAIRS = {PAPER: None,
         "a100_orin_bf16": ("orin_agx_64gb_bf16", "a100_80gb_bf16"),
         "a100_orin_int4": ("orin_agx_64gb_int4", "a100_80gb_bf16"),
         "a100_phone_int4": ("snapdragon_8g3_int4", "a100_80gb_bf16"),
         "h100_orin_int4": ("orin_agx_64gb_int4", "h100_sxm_bf16")}

#: The library's default pair (``envs.edge.make_params``) and what a config or a stored run
#: without a pair means (runs from before pairs existed ran the paper clock).
DEFAULT_PAIR = PAPER
#: The pair the launchers' configs (``prada_jax/configs/ppo.py``, ``dual.py``), ``train.main``
#: and the evaluation commands without a policy use unless told otherwise (``env.hardware`` /
#: ``--hardware``): an NVIDIA A100 80GB bf16 server with a Jetson AGX Orin 64GB INT4 edge
#: (issue 32; the choice and its reasons: studies/load_curve/README.md).
CONFIG_PAIR = "a100_orin_int4"


@struct.dataclass
class LatencyParams:
    """Every constant of the latency model, with its unit. Defaults: ``default_latency_params``.

    Attributes:
      slm: edge small model (drafts every step).
      llm: server large model (runs nominated steps).
      prm: process reward model, charged only to the online-PRM (RSD) baseline. Default
        ``qwen25_math_prm_7b`` (its FLOPs equal the 7B LLM's under ``paper``, which counts
        ``2·P``); ``qwen25_prm_1p5b`` is the smaller option.
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
      edge_hw, server_hw: ``HardwareProfile`` of the edge device and the server (None under the
        ``paper`` clock, which reads ``edge_peak_flops`` … ``server_eta`` instead).
      clock: ``"paper"`` (the FLOP-only form) or ``"roofline"``. Static: the two compile
        different env steps, while swapping one roofline pair for another (array leaves) does
        not recompile. The pair's name lives with the caller's config (``env.hardware``).
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
    edge_hw: Any = None
    server_hw: Any = None
    clock: str = struct.field(pytree_node=False, default=PAPER)

    @property
    def roofline(self) -> bool:
        """True for every pair but ``paper`` (a static, Python-level switch)."""
        return self.clock != PAPER


def default_latency_params(**overrides) -> LatencyParams:
    """The default (assumed) constants; keyword overrides replace fields by name."""
    p = LatencyParams(slm=qwen25_1p5b(), llm=qwen25_7b(), prm=qwen25_math_prm_7b())
    bad = set(overrides) - set(LatencyParams.__dataclass_fields__)
    if bad:
        raise ValueError(f"unknown latency field(s) {sorted(bad)}; known: "
                         f"{sorted(LatencyParams.__dataclass_fields__)}")
    return p.replace(**overrides)


def validate_latency_params(p: LatencyParams, prefix: str = "latency",
                            hardware: str = "") -> None:
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
    if p.roofline:
        if p.edge_hw is None or p.server_hw is None:
            raise BadInput(f"{prefix}: the roofline clock needs edge_hw and server_hw")
        where = f"hardware {hardware}" if hardware else f"{prefix} hardware"
        _validate_profile(p.edge_hw, f"{where}: edge")
        _validate_profile(p.server_hw, f"{where}: server")
        for m, hw, side in (("slm", p.edge_hw, "edge"), ("llm", p.server_hw, "server"),
                            ("prm", p.server_hw, "server")):
            spec = getattr(p, m)
            for f in ("weight_params", "n_kv_heads", "head_dim"):
                v = float(getattr(spec, f))
                if not (v > 0 and math.isfinite(v)):
                    raise ValueError(f"{prefix}.{m}.{f} must be a finite number > 0, got {v}")
            w = float(model_weight_bytes(spec, hw))
            if w >= float(hw.mem_bytes):
                raise BadInput(f"{where}: {side}.mem_bytes ({float(hw.mem_bytes):.4g} B) does not "
                               f"hold the {m} weights ({w:.4g} B)")
            _check_float32_terms(spec, hw, m, side, where)


_PROFILE_FIELDS = tuple(HardwareProfile.__dataclass_fields__)


def _profile_from(spec, where: str) -> HardwareProfile:
    """A profile from a name in ``PROFILES`` or a dict of every ``HardwareProfile`` field."""
    if isinstance(spec, str):
        if spec not in PROFILES:
            raise BadInput(f"{where}: unknown hardware profile {spec!r}; known: "
                           f"{', '.join(sorted(PROFILES))}")
        return PROFILES[spec]()
    if not isinstance(spec, dict):
        raise BadInput(f"{where}: a profile name or an object of {list(_PROFILE_FIELDS)}, "
                       f"got {type(spec).__name__}")
    missing = [f for f in _PROFILE_FIELDS if f not in spec]
    extra = sorted(set(spec) - set(_PROFILE_FIELDS))
    if missing or extra:
        raise BadInput(f"{where}: missing field(s) {missing}, unknown field(s) {extra}")
    vals = {}
    for f in _PROFILE_FIELDS:
        v = spec[f]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadInput(f"{where}.{f} must be a number, got {v!r}"[:300])
        try:
            vals[f] = float(v)
        except OverflowError:   # a JSON integer beyond any float
            raise BadInput(f"{where}.{f} does not fit float32 (at most {_F32.max:.8g}); the "
                           "clock computes in float32") from None
        why = _float32_problem(vals[f])
        if why:
            raise BadInput(f"{where}.{f} = {vals[f]:.6g}: {why}")
    return HardwareProfile(**vals)


def pair_profiles(hardware: str) -> tuple[HardwareProfile, HardwareProfile] | None:
    """``(edge, server)`` profiles of the pair ``hardware``: a name in ``PAIRS`` (None for
    ``paper``) or the path of a JSON file ``{"edge": <profile>, "server": <profile>}``, each
    profile a ``PROFILES`` name or an object with every ``HardwareProfile`` field.

    Raises ``BadInput`` naming the pair, the file or the field. Values are not range-checked
    here (``validate_latency_params`` does that).
    """
    if not isinstance(hardware, str) or not hardware:
        raise BadInput(f"hardware: a pair name or a .json file, got {hardware!r}")
    if hardware in PAIRS:
        names = PAIRS[hardware]
        return None if names is None else tuple(PROFILES[n]() for n in names)
    if not hardware.endswith(".json"):
        raise BadInput(f"hardware: unknown hardware pair {hardware!r}; known: "
                       f"{', '.join(PAIRS)} (or a .json file of an edge and a server profile)")
    path = Path(hardware)
    if path.is_file() and path.stat().st_size > MAX_HARDWARE_FILE_BYTES:
        raise BadInput(f"hardware file {hardware}: {path.stat().st_size} bytes; a hardware "
                       f"file is at most {MAX_HARDWARE_FILE_BYTES} bytes (two profiles)")
    try:
        # a key given twice is refused: json keeps the last one silently
        obj = read_json(path, expect=None, unique_keys=True)
    except BadInput as e:
        raise BadInput(f"hardware file {hardware}: cannot read it as JSON ({e})") from None
    if not isinstance(obj, dict) or set(obj) != {"edge", "server"}:
        raise BadInput(f"hardware file {hardware}: must be an object with exactly the keys "
                       f"'edge' and 'server'")
    return (_profile_from(obj["edge"], f"hardware file {hardware}: edge"),
            _profile_from(obj["server"], f"hardware file {hardware}: server"))


def pair_latency_params(hardware: str = DEFAULT_PAIR, **overrides) -> LatencyParams:
    """Latency constants of the pair ``hardware`` (see ``pair_profiles``): the default
    constants (wireless model, model specs) with the pair's edge and server profiles; keyword
    overrides replace ``LatencyParams`` fields by name. ``paper`` is exactly
    ``default_latency_params(**overrides)``. Under a roofline pair an override of
    ``server_peak_flops`` (the ``server_speed`` factor of ``envs.scenarios``) scales the server
    profile's ``peak_flops`` by the same factor over the default (memory bandwidth unchanged)."""
    profiles = pair_profiles(hardware)
    p = default_latency_params(**overrides)
    if profiles is None:
        return p
    edge_hw, server_hw = profiles
    speed = float(p.server_peak_flops) / float(LatencyParams.server_peak_flops)
    if speed != 1.0:
        server_hw = server_hw.replace(peak_flops=server_hw.peak_flops * speed)
    return p.replace(edge_hw=edge_hw, server_hw=server_hw, clock="roofline")


def check_pair(hardware: str, where: str) -> None:
    """Host-side check of a pair given by a flag or config field ``where`` (e.g.
    ``--hardware``): unknown name, unreadable file, a profile field out of range or weights
    beyond a device's memory raise ``BadInput`` whose message starts with ``where=hardware``."""
    try:
        validate_latency_params(pair_latency_params(hardware), prefix=where,
                                hardware=f"{where}={hardware}")
    except ValueError as e:
        msg = str(e)
        raise BadInput(msg if msg.startswith(f"hardware {where}=") else
                       f"{where}={hardware}: {msg}") from None


def model_weight_bytes(spec: ModelSpec, hw: HardwareProfile):
    """Bytes of weights one forward pass reads: ``weight_params · weight_bytes`` [bytes]."""
    return spec.weight_params * hw.weight_bytes


def kv_bytes_per_token(spec: ModelSpec, hw: HardwareProfile):
    """KV-cache bytes of one token of context: ``2 · L · kv_heads · head_dim · kv_bytes``."""
    return 2.0 * spec.layers * spec.n_kv_heads * spec.head_dim * hw.kv_bytes


def max_sequences(p: LatencyParams, max_context_tokens: float, with_prm: bool = False) -> int:
    """Most concurrent server sequences the server profile's memory holds (host-side):
    ``floor((mem_bytes − LLM weight bytes [− PRM weight bytes]) / KV bytes of one sequence at
    max_context_tokens)``; ``with_prm``: the online PRM's weights share the server's memory
    (the RSD row under the serving server). Unbounded (a very large int) under ``paper``."""
    if not p.roofline:
        return 2 ** 31 - 1
    hw = p.server_hw
    free = float(hw.mem_bytes) - float(model_weight_bytes(p.llm, hw))
    if with_prm:
        free -= float(model_weight_bytes(p.prm, hw))
    per_seq = float(kv_bytes_per_token(p.llm, hw)) * max(float(max_context_tokens), 1.0)
    return max(int(math.floor(free / per_seq)), 0)


#: The largest hardware pair file read (bytes): two profiles take well under 1 KiB; a larger
#: file is refused before it is read (a 2 GB file was read whole).
MAX_HARDWARE_FILE_BYTES = 1 << 20

_F32 = np.finfo(np.float32)


def _float32_problem(v: float) -> str | None:
    """Why a positive profile figure cannot be used by the float32 clock, or None: beyond
    float32's range (it becomes inf) or below its normal range (a subnormal, which XLA on CPU
    flushes to 0: 1e-45 priced every server job as never finishing)."""
    if not math.isfinite(v):
        return "must be finite"
    if abs(v) > float(_F32.max):
        return f"does not fit float32 (at most {float(_F32.max):.8g}); the clock computes in float32"
    if v != 0 and abs(v) < float(_F32.tiny):
        return (f"is below float32's normal range (smallest {float(_F32.tiny):.4g}); the clock "
                "computes in float32, which flushes it to 0")
    return None


def _check_float32_terms(spec: ModelSpec, hw: HardwareProfile, model: str, side: str,
                         where: str) -> None:
    """The terms the roofline clock builds from one profile and one model, computed in float32
    as the env does (a weight bytes, KV bytes per token, the FLOP and byte rates, one token's
    FLOP time and one pass's byte time), must each be finite and normal: figures that are
    each representable can still multiply or divide out of float32's range. ``BadInput``
    naming the profile's fields."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        rate = f32(hw.peak_flops) * f32(hw.eta)
        bw = f32(hw.mem_bw) * f32(hw.eta_mem)
        wbytes = f32(spec.weight_params) * f32(hw.weight_bytes)
        kv = (f32(2.0) * f32(spec.layers) * f32(spec.n_kv_heads) * f32(spec.head_dim)
              * f32(hw.kv_bytes))
        terms = {"peak_flops·eta": rate, "mem_bw·eta_mem": bw,
                 f"weight_bytes·({model} weights)": wbytes, f"kv_bytes·({model} KV per token)": kv,
                 f"({model} FLOPs per token)/(peak_flops·eta)": f32(2.0) * f32(spec.params) / rate,
                 f"({model} weight bytes)/(mem_bw·eta_mem)": wbytes / bw}
    for name, v in terms.items():
        v = float(v)
        if not math.isfinite(v) or v < float(_F32.tiny):
            raise BadInput(f"{where}: {side}.{name} {'overflows' if v > 1 else 'underflows'} "
                           "float32 (the clock computes in float32): figures out of scale")


def _validate_profile(hw, where: str) -> None:
    for f in ("peak_flops", "mem_bw", "mem_bytes", "eta", "eta_mem", "weight_bytes", "kv_bytes"):
        v = float(getattr(hw, f))
        if not (v > 0 and math.isfinite(v)):
            raise BadInput(f"{where}.{f} must be a finite number > 0, got {v}")
        why = _float32_problem(v)
        if why:
            raise BadInput(f"{where}.{f} = {v:.6g}: {why}")
    for f in ("eta", "eta_mem"):
        if float(getattr(hw, f)) > 1:
            raise BadInput(f"{where}.{f} must be <= 1, got {float(getattr(hw, f))}")


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


# ----------------------------------------------------------------------------- roofline

def roofline_prefill_flops(spec: ModelSpec, n_new, n_cached=0.0):
    """FLOPs of one prefill pass under the roofline clock: ``prefill_flops`` plus one output
    projection (the last position's logits; ``2·head_flops·(weight_params − params)``) when
    ``n_new > 0``. Elementwise."""
    n = jnp.asarray(n_new, jnp.float32)
    head = 2.0 * spec.head_flops * (spec.weight_params - spec.params)
    return prefill_flops(spec, n, n_cached) + jnp.where(n > 0, head, 0.0)


def decode_step_flops(spec: ModelSpec, batch, ctx_sum):
    """FLOPs of one decode step of ``batch`` sequences whose contexts sum to ``ctx_sum``
    (roofline clock): ``2·token_flop_params·b + 4·L·d·Σc``."""
    return (2.0 * token_flop_params(spec) * jnp.asarray(batch, jnp.float32)
            + 4.0 * spec.layers * spec.d_model * jnp.asarray(ctx_sum, jnp.float32))


def prefill_s(spec: ModelSpec, hw: HardwareProfile, n_new, n_cached=0.0):
    """Roofline seconds of one forward pass over ``n_new`` tokens after ``n_cached`` cached:
    ``max(prefill_flops / (peak·η), (W + KV(n_cached)) / (BW·η_mem))``, W the weight bytes
    and KV(c) the bytes of c cached tokens' keys and values (both read once per pass).

    The FLOP term is the compute-bound prefill ``(2·P·n + 2·L·d·(n² + 2nc))/(peak·η)``
    (docs/latency.md, "Roofline per phase");
    the memory term only binds for a few new tokens (below about ``peak·η / (2·BW·η_mem)``
    ≈ 96 tokens on an A100), where a pass cannot be cheaper than reading the weights once.
    ``n_new = 0`` costs 0 (no pass). Elementwise.
    """
    n = jnp.asarray(n_new, jnp.float32)
    c = jnp.asarray(n_cached, jnp.float32)
    t_flop = roofline_prefill_flops(spec, n, c) / (hw.peak_flops * hw.eta)
    t_mem = (model_weight_bytes(spec, hw) + kv_bytes_per_token(spec, hw) * c) / (
        hw.mem_bw * hw.eta_mem)
    return jnp.where(n > 0, jnp.maximum(t_flop, t_mem), 0.0)


def decode_step_s(spec: ModelSpec, hw: HardwareProfile, batch, ctx_sum):
    """Roofline seconds of one decode step of ``batch`` sequences whose contexts sum to
    ``ctx_sum`` tokens: ``max(Σ_i FLOPs_i / (peak·η), (W + Σ_i KV_i) / (BW·η_mem))`` with
    ``FLOPs_i = 2·P + 4·L·d·c_i`` and ``KV_i = kv_bytes_per_token · c_i``. Both terms are linear
    in the contexts, so only their sum matters. Elementwise; ``batch`` ≥ 1 expected."""
    b = jnp.asarray(batch, jnp.float32)
    csum = jnp.asarray(ctx_sum, jnp.float32)
    t_flop = decode_step_flops(spec, b, csum) / (hw.peak_flops * hw.eta)
    t_mem = (model_weight_bytes(spec, hw) + kv_bytes_per_token(spec, hw) * csum) / (
        hw.mem_bw * hw.eta_mem)
    return jnp.maximum(t_flop, t_mem)


def _sum_linear(a, b, lo, n):
    """``Σ_{j=lo}^{lo+n−1} (a + b·j)`` = ``n·a + b·(n·lo + n(n−1)/2)``."""
    return n * a + b * (n * lo + 0.5 * n * (n - 1.0))


def decode_s(spec: ModelSpec, hw: HardwareProfile, n_tokens, start_position, batch=1.0):
    """Roofline seconds for one sequence to decode ``n_tokens`` tokens, the first with
    ``start_position`` tokens in context, while ``batch`` sequences (this one included) run
    in every step at the same context: ``Σ_j decode_step_s(batch, batch·j)`` over
    ``j = c … c+m−1``, summed in closed form (each term is a max of two lines in j, so the
    sum splits at their crossing). Elementwise."""
    m = jnp.asarray(n_tokens, jnp.float32)
    c = jnp.asarray(start_position, jnp.float32)
    b = jnp.asarray(batch, jnp.float32)
    pf = hw.peak_flops * hw.eta
    bwm = hw.mem_bw * hw.eta_mem
    a1 = 2.0 * token_flop_params(spec) * b / pf                                       # FLOP line
    b1 = 4.0 * spec.layers * spec.d_model * b / pf
    a2 = model_weight_bytes(spec, hw) / bwm                                          # byte line
    b2 = kv_bytes_per_token(spec, hw) * b / bwm
    db = b1 - b2
    safe = jnp.where(db == 0, 1.0, db)
    jstar = (a2 - a1) / safe                       # the lines cross at j*
    # db > 0: the FLOP line wins for j >= j*; db < 0: for j <= j*; db = 0: everywhere or nowhere.
    k_up = jnp.clip(c + m - jnp.ceil(jstar), 0.0, m)            # FLOP-bound tokens at the top
    k_dn = jnp.clip(jnp.floor(jstar) - c + 1.0, 0.0, m)         # FLOP-bound tokens at the bottom
    k_eq = jnp.where(a1 >= a2, m, 0.0)
    k = jnp.where(db > 0, k_up, jnp.where(db < 0, k_dn, k_eq))
    lo_flop = jnp.where(db > 0, c + m - k, c)      # FLOP-bound range [lo_flop, lo_flop + k)
    lo_mem = jnp.where(db > 0, c, c + k)           # byte-bound range [lo_mem, lo_mem + m − k)
    return _sum_linear(a1, b1, lo_flop, k) + _sum_linear(a2, b2, lo_mem, m - k)


# ----------------------------------------------------------------------------- per phase

def draft_delay_s(p: LatencyParams, n_new, n_cached, draft_tokens):
    """Edge SLM delay (s) to prefill what is new since its KV cache and draft one step.

    ``paper``: FLOPs / (edge peak · η). Roofline: ``prefill_s`` of the new tokens plus
    ``decode_s`` of the draft at batch 1 (the edge serves its own user), on ``p.edge_hw``.

    Args:
      n_new: tokens to prefill (not yet in the SLM's KV cache), any shape.
      n_cached: tokens already in the SLM's KV cache.
      draft_tokens: tokens of the drafted step (decoded after the full context).
    """
    ctx = jnp.asarray(n_cached, jnp.float32) + jnp.asarray(n_new, jnp.float32)
    if p.roofline:
        return (prefill_s(p.slm, p.edge_hw, n_new, n_cached)
                + decode_s(p.slm, p.edge_hw, draft_tokens, ctx, 1.0))
    flops = prefill_flops(p.slm, n_new, n_cached) + decode_flops(p.slm, draft_tokens, ctx)
    return compute_delay_s(flops, p.edge_peak_flops, p.edge_eta)


def server_prefill_s(p: LatencyParams, n_new, n_cached):
    """Server LLM prefill (s) of the uploaded context (roofline clock only)."""
    return prefill_s(p.llm, p.server_hw, n_new, n_cached)


def server_delay_s(p: LatencyParams, n_new, n_cached, step_tokens, batch=1):
    """Server LLM delay (s): prefill the uploaded (uncached) context, then decode one step.

    ``paper``: FLOPs / (server peak · η) (``batch`` ignored). Roofline: ``prefill_s`` plus
    ``decode_s`` with ``batch`` sequences sharing every decode step (the env passes a full
    batch, M_t, so this is the job's service time on a full server).
    """
    ctx = jnp.asarray(n_cached, jnp.float32) + jnp.asarray(n_new, jnp.float32)
    if p.roofline:
        return (server_prefill_s(p, n_new, n_cached)
                + decode_s(p.llm, p.server_hw, step_tokens, ctx, batch))
    flops = prefill_flops(p.llm, n_new, n_cached) + decode_flops(p.llm, step_tokens, ctx)
    return compute_delay_s(flops, p.server_peak_flops, p.server_eta)


def prm_delay_s(p: LatencyParams, n_tokens):
    """Online PRM cost (s) of the RSD baseline: one forward pass over ``n_tokens`` (prefix + draft)
    on server hardware with no KV reuse (a value-head PRM scores the whole sequence).
    Roofline: ``prefill_s`` on ``p.server_hw`` (charged whole, not batched)."""
    if p.roofline:
        return prefill_s(p.prm, p.server_hw, n_tokens, 0.0)
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


# ----------------------------------------------------------------------------- server load

def decode_seq_flops(spec: ModelSpec, n_tokens, start_position):
    """FLOPs for one sequence to decode ``n_tokens`` from context ``start_position`` under the
    roofline clock: ``2·P_tok·m + 4·L·d·(m·c + m(m−1)/2)`` (``P_tok = token_flop_params``)."""
    m = jnp.asarray(n_tokens, jnp.float32)
    c = jnp.asarray(start_position, jnp.float32)
    return (2.0 * token_flop_params(spec) * m
            + 4.0 * spec.layers * spec.d_model * (m * c + 0.5 * m * (m - 1.0)))


def job_load_s(spec: ModelSpec, hw: HardwareProfile, prefill_flops_, n_tokens, ctx, batch,
               extra_weight_bytes=0.0):
    """Server-seconds one job costs a saturated serving server of ``batch`` = M sequences
    (roofline clock; the unit of the offered load ρ under ``envs.serving``):

    ``decode_s(n_tokens, ctx, M) / M`` (its share of the full-batch decode iterations) +
    the stall its prefill adds to one iteration of the full batch,
    ``max((F_step + F_prefill)/(peak·η), (B_step + extra)/(BW·η_mem)) − t_step`` with F_step,
    B_step, t_step the FLOPs, bytes and roofline time of a decode step of M sequences at the
    job's mean context ``ctx + n_tokens/2`` (``extra_weight_bytes``: another model's weights
    the prefill reads, the PRM's). Summed over a saturated server's jobs this is its busy time,
    so users/s at ρ = 1 is ``1 / E[job_load_s]`` (tests/envs/test_serving.py checks it against
    the env). A prefill piggybacks on a memory-bound batch up to the compute roofline; on a
    compute-bound batch it costs its FLOPs. ``spec`` is the model of the running batch (the
    LLM). Elementwise."""
    pk = hw.peak_flops * hw.eta
    bwm = hw.mem_bw * hw.eta_mem
    m = jnp.maximum(jnp.asarray(batch, jnp.float32), 1.0)
    n = jnp.asarray(n_tokens, jnp.float32)
    f_pf = jnp.asarray(prefill_flops_, jnp.float32)
    cbar = jnp.asarray(ctx, jnp.float32) + 0.5 * n
    f_step = decode_step_flops(spec, m, m * cbar)
    b_step = model_weight_bytes(spec, hw) + kv_bytes_per_token(spec, hw) * m * cbar
    t_step = jnp.maximum(f_step / pk, b_step / bwm)
    t_mix = jnp.maximum((f_step + f_pf) / pk, (b_step + extra_weight_bytes) / bwm)
    stall = jnp.where(f_pf > 0, t_mix - t_step, 0.0)
    return decode_s(spec, hw, n, ctx, m) / m + stall
