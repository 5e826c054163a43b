"""Plain-Python reference of the ``legacy`` batching server (``envs.servers.legacy``), job by
job: the roofline's server time on a full batch, and each slot every job's τ goes to upload,
then prefill; all prefills of the slot run before the batch decodes; then decode, then
download."""
from __future__ import annotations

from envs.latency_numpy import roofline_decode, roofline_prefill, roofline_step
from envs.servers.paper_numpy import PaperNumPy


class LegacyNumPy(PaperNumPy):
    """The batching server of the results before issue 41."""

    name = "legacy"

    def _server_time(self, up, cached, ltok, ctx, m_t):
        # A full batch of M_t sequences (at least 1) shares every decode step.
        c = self.env.c
        pf = roofline_prefill(c.llm, c.server_hw, up, cached)
        return pf, pf + roofline_decode(c.llm, c.server_hw, ltok, ctx, max(m_t, 1))

    def run_slot(self, users, tau: float, bw_t: float):
        in_use, bw_use, stats = super().run_slot(users, tau, bw_t)
        self._serve(users, tau)
        return in_use, bw_use, stats

    def charge_job(self, u, i: int, tau: float, finished_now: dict) -> None:
        u.comm += u.job["comm"]
        u.proc += tau - u.job["comm"]
        u.left = 1 if any(u.job[k] > 0 for k in ("up", "pf", "dec", "dn")) else 0
        if u.left <= 0:
            u.bw = 0.0
            self.env._advance(u, i, finished_now)

    def _serve(self, users, tau: float):
        """One slot of the batching server (rules in ``envs.servers.legacy.serve_slot``), job
        by job: every job's τ goes to upload, then prefill; all prefills of the slot run before
        the batch decodes; then decode, then download."""
        c = self.env.c
        jobs = [u.job for u in users if u.phase == "service"]
        for j in jobs:
            j["u"] = min(j["up"], tau)
            j["p"] = min(j["pf"], tau - j["u"]) if j["up"] - j["u"] <= 0 else 0.0
        stall = sum(j["p"] for j in jobs)
        batch = [j["ctx"] for j in jobs if j["dec"] > 0]
        step = roofline_step(c.llm, c.server_hw, batch) if batch else 0.0
        for j in jobs:
            free = tau - j["u"] - j["p"]          # this job's own time after upload + prefill
            ready = j["up"] - j["u"] <= 0 and j["pf"] - j["p"] <= 0
            j["up"] -= j["u"]
            j["pf"] -= j["p"]
            d = 0.0
            if j["dec"] > 0:
                window = max(tau - j["u"] - stall, 0.0) if ready else 0.0
                n = min(j["dec"], window / step)
                j["dec"] -= n
                j["ctx"] += n
                free = window - n * step
            if ready and j["dec"] <= 0:
                d = min(j["dn"], max(free, 0.0))
                j["dn"] -= d
            j["comm"] = j["u"] + d
