"""Plain-Python reference of the ``paper`` clock's server (``envs.servers.paper``), and the
interface every server reference of ``envs.edge_numpy`` implements (``PaperNumPy`` is the base
class: a job holds one unit and its bandwidth for its whole slots).

A server reference is built with its env (``EdgeEnvNumPy``) and reads the env's tables and
users; the env's slot calls its methods and never names the model: ``busy``, ``request``,
``offered_load``, ``start_job``, ``run_slot``, ``charge_job``, ``cut_at_fallback``,
``end_slot``, ``kv_budget``; flags ``caches_by_default`` (the prefix cache is on unless the
config says) and ``scores_on_server`` (the RSD baseline's PRM is a server job, not charged to
the draft).
"""
from __future__ import annotations

import math

from envs.latency_numpy import flops_decode, flops_prefill


class PaperNumPy:
    """Fixed-slot jobs priced by FLOPs (rules in ``envs.servers.paper``)."""

    name = "paper"
    caches_by_default = False
    scores_on_server = False

    def __init__(self, env):
        self.env = env

    def kv_budget(self) -> float:
        """KV budget of the prefix cache [LLM-KV tokens]: unbounded."""
        return math.inf

    def busy(self, users):
        """(units, bandwidth [Hz]) the running jobs hold at the start of the slot."""
        busy_units = sum(1 for u in users if u.phase == "service")
        busy_bw = sum(u.bw for u in users if u.phase == "service")
        return busy_units, busy_bw

    def _server_time(self, up, cached, ltok, ctx, m_t):
        """(prefill s, server s) of a job on this server."""
        c = self.env.c
        fl = flops_prefill(c.llm, up, cached) + flops_decode(c.llm, ltok, ctx)
        return 0.0, fl / (c.server_peak_flops * c.server_eta)

    def request(self, u, fading: float) -> dict:
        """What offloading user ``u``'s step would cost this slot."""
        env = self.env
        c, cfg = env.c, env.cfg
        _, bw_t, m_t, gain_t = env._cond(env.t)
        ctx = env.ctx[u.node]
        ltok = env.tok[u.node][1]
        cached = min(u.srv_kv, ctx) if env.kv_cache else 0
        up = ctx - cached
        snr = env.snr_bar * max(fading * gain_t, 1e-12)
        se = math.log2(1.0 + snr)
        bw = up * c.bits_per_token / (se * c.uplink_target_s)
        bw = min(max(bw, c.min_request_hz), bw_t)
        t_up = up * c.bits_per_token / (bw * se)
        t_dn = ltok * c.bits_per_token / (bw * se) if cfg.get("downlink", True) else 0.0
        pf, t_srv = self._server_time(up, cached, ltok, ctx, m_t)
        return dict(snr=snr, outage=snr < env.snr_th, bw=bw, up=t_up, dn=t_dn, srv=t_srv,
                    pf=pf, delay=t_up + t_srv + t_dn, cached=cached, ctx=ctx)

    def offered_load(self, users, dec, res, outage) -> float:
        """Offered server seconds of the slot's new nominations (reported by the serving
        server only)."""
        return 0.0

    def start_job(self, u, r: dict, n: int) -> None:
        """User ``u``'s job on node ``n`` starts (remaining upload s, prefill s, tokens,
        context, download s)."""
        env = self.env
        u.job = dict(up=r["up"], pf=r["pf"], dec=float(env.tok[n][1]), ctx=float(env.ctx[n]),
                     dn=r["dn"])

    def run_slot(self, users, tau: float, bw_t: float):
        """Runs the slot's jobs; returns (units in use, bandwidth in use [Hz], stats)."""
        in_use = sum(1 for u in users if u.phase == "service")
        bw_use = sum(u.bw for u in users if u.phase == "service")
        return in_use, bw_use, {}

    def charge_job(self, u, i: int, tau: float, finished_now: dict) -> None:
        """Charges the slot of user ``i`` with a server job; a finished job advances it."""
        u.comm += tau * u.frac
        u.proc += tau - tau * u.frac
        u.left -= 1
        if u.left <= 0:
            u.bw = 0.0
            self.env._advance(u, i, finished_now)

    def cut_at_fallback(self, u) -> None:
        """A move through a trace fallback keeps the server's prefixes (the results' rule)."""

    def end_slot(self, users, noise, t: int, had_job, offered_load: float):
        """After the slot's arrivals: (cache stats, extra slot stats)."""
        return dict(evicted_tokens=0.0, kv_in_use_tokens=0.0, kv_pinned_tokens=0.0), {}
