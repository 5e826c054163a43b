"""Float64 reference of the latency model (``prada_jax.latency``), written independently for the
NumPy reference env (``envs.edge_numpy``): model shapes (``Arch``), the latency constants read
from a ``LatencyParams`` (``consts_from_jax``), FLOP counts, and the roofline clock written token
by token (the JAX clock sums the same maxima in closed form).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Arch:
    p: float
    layers: float
    d: float
    kv_heads: float = 0.0
    head_dim: float = 128.0
    weights: float = 0.0       # weights read per forward pass (non-embedding + lm_head)
    head: float = 1.0          # 1: lm_head products count in the roofline FLOPs; 0: legacy

    def token_params(self) -> float:
        """Parameters one decoded token multiplies by under the roofline clock."""
        return self.p + self.head * (self.weights - self.p)


@dataclass
class LatencyConsts:
    slm: Arch = field(default_factory=lambda: Arch(1.31e9, 28, 1536, 2, 128,
                                                   1.31e9 + 151936 * 1536))
    llm: Arch = field(default_factory=lambda: Arch(6.53e9, 28, 3584, 4, 128,
                                                   6.53e9 + 152064 * 3584))
    prm: Arch = field(default_factory=lambda: Arch(6.53e9, 28, 3584, 4, 128,
                                                   6.53e9 + 152064 * 3584))
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
    # Roofline clock (``prada_jax.latency`` pairs other than "paper"): each profile a dict with
    # peak_flops, mem_bw, mem_bytes, eta, eta_mem, weight_bytes, kv_bytes.
    clock: str = "paper"
    edge_hw: dict | None = None
    server_hw: dict | None = None


_HW_FIELDS = ("peak_flops", "mem_bw", "mem_bytes", "eta", "eta_mem", "weight_bytes", "kv_bytes")


def consts_from_jax(lp) -> LatencyConsts:
    """Reads a ``prada_jax.latency.LatencyParams`` into plain floats."""
    arch = lambda m: Arch(float(m.params), float(m.layers), float(m.d_model),  # noqa: E731
                          float(m.n_kv_heads), float(m.head_dim), float(m.weight_params),
                          float(m.head_flops))
    hw = lambda h: None if h is None else {f: float(getattr(h, f)) for f in _HW_FIELDS}  # noqa
    names = [f for f in LatencyConsts.__dataclass_fields__
             if f not in ("slm", "llm", "prm", "clock", "edge_hw", "server_hw")]
    return LatencyConsts(slm=arch(lp.slm), llm=arch(lp.llm), prm=arch(lp.prm),
                         clock=str(lp.clock), edge_hw=hw(lp.edge_hw),
                         server_hw=hw(lp.server_hw),
                         **{f: float(getattr(lp, f)) for f in names})


# Roofline, written token by token (the JAX clock sums the same maxima in closed form).

def kv_token_bytes(a: Arch, hw: dict) -> float:
    return 2.0 * a.layers * a.kv_heads * a.head_dim * hw["kv_bytes"]


def roofline_step(a: Arch, hw: dict, contexts) -> float:
    """Seconds of one decode step of a batch whose sequences hold ``contexts`` tokens."""
    flops = sum(2.0 * a.token_params() + 4.0 * a.layers * a.d * c for c in contexts)
    byts = a.weights * hw["weight_bytes"] + sum(kv_token_bytes(a, hw) * c for c in contexts)
    return max(flops / (hw["peak_flops"] * hw["eta"]), byts / (hw["mem_bw"] * hw["eta_mem"]))


def roofline_decode(a: Arch, hw: dict, m: int, start: int, batch: int = 1) -> float:
    """Seconds to decode ``m`` tokens from context ``start`` with ``batch`` equal sequences."""
    return sum(roofline_step(a, hw, [j] * batch) for j in range(int(start), int(start) + int(m)))


def roofline_prefill(a: Arch, hw: dict, new: float, cached: float) -> float:
    if new <= 0:
        return 0.0
    t_flop = roofline_prefill_flops(a, new, cached) / (hw["peak_flops"] * hw["eta"])
    t_mem = (a.weights * hw["weight_bytes"] + kv_token_bytes(a, hw) * cached) / (
        hw["mem_bw"] * hw["eta_mem"])
    return max(t_flop, t_mem)


def roofline_prefill_flops(a: Arch, new: float, cached: float) -> float:
    """Prefill FLOPs under the roofline clock: ``flops_prefill`` + the last position's logits."""
    if new <= 0:
        return 0.0
    return flops_prefill(a, new, cached) + 2.0 * a.head * (a.weights - a.p)


def flops_prefill(a: Arch, new: float, cached: float) -> float:
    # every new token at position j costs 2P + 4·L·d·j; summed over j = c..c+n-1 this is
    # 2Pn + 4Ld(nc + n(n-1)/2); the 2Ld·n (causal diagonal) term makes it 2Pn + 2Ld(n² + 2nc).
    per_token_attn = 4.0 * a.layers * a.d
    series = new * cached + new * (new - 1) / 2.0
    return 2.0 * a.p * new + per_token_attn * series + 2.0 * a.layers * a.d * new


def flops_decode(a: Arch, m: float, start: float) -> float:
    return m * 2.0 * a.p + 4.0 * a.layers * a.d * (m * (2.0 * start + m - 1.0) / 2.0)


def mean_snr(c: LatencyConsts) -> float:
    pl = c.pl_ref_db + c.pl_exp_db * math.log10(c.distance_m / 1000.0)
    return 10.0 ** ((c.tx_psd_dbm_hz - pl - c.noise_psd_dbm_hz - c.noise_figure_db) / 10.0)
