"""Plain-Python reference of the ``serving`` server (``envs.servers.serving``) with its prefix
cache, job by job in float64: the continuous-batching slot (rules in ``envs.serving``), the
online PRM's scoring jobs of the RSD baseline, and the LRU prefix cache (rules in
``envs.prefix_cache``)."""
from __future__ import annotations

import math

from envs.latency_numpy import (kv_token_bytes, roofline_decode, roofline_prefill_flops,
                                 roofline_step)
from envs.sched_numpy import LOCAL
from envs.servers.paper_numpy import PaperNumPy


class ServingNumPy(PaperNumPy):
    """Continuous batching with chunked prefill, the LLM alone resident, the PRM on the server."""

    name = "serving"
    caches_by_default = True
    scores_on_server = True

    def kv_budget(self) -> float:
        """KV budget [LLM-KV tokens]: the config's, else the server's memory less the LLM's and
        the PRM's weights over one LLM token's KV bytes."""
        env = self.env
        if env.cfg.get("kv_budget_tokens") is not None:
            return float(env.cfg["kv_budget_tokens"])
        c, hw = env.c, env.c.server_hw
        free = hw["mem_bytes"] - (c.llm.weights + c.prm.weights) * hw["weight_bytes"]
        return float(max(math.floor(free / kv_token_bytes(c.llm, hw)), 0))

    def busy(self, users):
        busy_units = sum(1 for u in users if self._holds(u))
        busy_bw = sum(self._up_demand(u) for u in users)
        return busy_units, busy_bw

    def request(self, u, fading: float):
        env = self.env
        c, cfg, tau = env.c, env.cfg, env.cfg["tau_s"]
        _, bw_t, m_t, gain_t = env._cond(env.t)
        n = u.node
        ctx = env.ctx[n]
        cached = min(u.srv_kv, ctx) if env.kv_cache else 0
        up = ctx - cached            # prefilled; the upload carries all ctx tokens
        if cfg.get("llm_only", False):
            dec, _, _, _, dtok = env._path(n)
        else:
            dec = dtok = env.tok[n][1]
        snr = env.snr_bar * max(fading * gain_t, 1e-12)
        se = math.log2(1.0 + snr)
        need = lambda bits: min(max(bits / (se * c.uplink_target_s),  # noqa: E731
                                    c.min_request_hz), bw_t)
        bw = need(ctx * c.bits_per_token)
        t_up = ctx * c.bits_per_token / (bw * se)
        bw_dn = need(dtok * c.bits_per_token)
        t_dn = dtok * c.bits_per_token / (bw_dn * se) if cfg.get("downlink", True) else 0.0
        hw = c.server_hw
        pk = hw["peak_flops"] * hw["eta"]
        pf_flops = roofline_prefill_flops(c.llm, up, cached)
        m = max(m_t, 1)
        hold = pf_flops / pk + roofline_decode(c.llm, hw, dec, ctx, m)
        load = self._load(pf_flops, dec, ctx, m) * m
        return dict(snr=snr, outage=snr < env.snr_th, bw=bw * min(t_up, tau) / tau,
                    up_hz=bw, dn_hz=bw_dn, up=t_up, dn=t_dn, srv=hold, pf_flops=pf_flops,
                    pf_tok=float(up), dec=float(dec), delay=t_up + hold + t_dn, load=load,
                    cached=cached, ctx=ctx)

    def offered_load(self, users, dec, res, outage) -> float:
        """Offered load [s]: new nominations that asked for the server."""
        load = 0.0
        for i in dec:
            if users[i].phase == "nominated" and (dec[i] != LOCAL or outage[i]):
                load += res[i]["load"]
        return load

    def start_job(self, u, r: dict, n: int) -> None:
        env = self.env
        u.job = dict(up=r["up"], up_hz=r["up_hz"], pf=r["pf_tok"], pf_flops=r["pf_flops"],
                     dec=r["dec"], ctx=float(env.ctx[n]), dn=r["dn"], dn_hz=r["dn_hz"], seq=True,
                     prm=False, ticket=env.t)

    def run_slot(self, users, tau: float, bw_t: float):
        in_use = sum(1 for u in users if self._holds(u))
        bw_use = min(sum(self._up_demand(u) for u in users), bw_t)
        return in_use, bw_use, self._serve_serving(users, tau, bw_t)

    def charge_job(self, u, i: int, tau: float, finished_now: dict) -> None:
        env = self.env
        u.comm += u.job["comm"]
        u.proc += tau - u.job["comm"]
        if any(u.job[k] > 0 for k in ("up", "pf", "dec", "dn")):
            return
        if u.phase == "score":
            u.phase, u.scored = "decide", True
            return
        if env.cfg.get("llm_only", False):   # the resident sequence ended the solution
            _, steps, corr, fbs, _ = env._path(u.node)
            first_fb = int(env._next(u.node, 1)[2])
            u.steps += steps - 1
            u.offloads += steps - 1
            u.fallbacks += fbs - first_fb
            finished_now[i] = (corr, env.t + 1)
            u.phase = "empty"
            return
        env._advance(u, i, finished_now)

    def cut_at_fallback(self, u) -> None:
        """A move through a trace fallback (serving server): the server's prefixes of ``u``
        shrink to the problem's prompt (the only part of the old path its new context
        shares)."""
        env = self.env
        prompt = env.ctx[env.root[env.problem[u.node]]]
        u.srv_kv = min(u.srv_kv, prompt)
        u.prm_kv = min(u.prm_kv, prompt)

    def end_slot(self, users, noise, t: int, had_job, offered_load: float):
        """RSD: every user whose draft is done is scored by the PRM on the server before its
        decision; then the prefix cache's end of slot ``t``."""
        env = self.env
        for i, u in enumerate(users):
            if (env.sched == "rsd" and not env.cfg.get("llm_only", False)
                    and u.phase == "decide" and not getattr(u, "scored", False)):
                offered_load += self._begin_score(u, float(noise["fading"][i]), t)
            u.scored = False
        return self._cache_end(users, had_job, t), dict(offered_job_s=offered_load)

    def _cache_end(self, users, had_job, t: int) -> dict:
        """The prefix cache at the end of slot ``t`` (rules in ``envs.prefix_cache``), user by
        user: mark the prefixes of users with a server job this slot as used at ``t``, drop
        finished users' and disabled caches, then evict the least recently used prefix (ties
        by user slot) while the running sequences and the cached prefixes exceed the budget."""
        env = self.env
        ratio = 1.0
        if env.c.server_hw is not None:
            ratio = kv_token_bytes(env.c.prm, env.c.server_hw) / kv_token_bytes(
                env.c.llm, env.c.server_hw)
        pinned, own = 0.0, {}
        for i, u in enumerate(users):
            if u.phase == "empty":
                u.srv_kv = u.prm_kv = 0
                continue
            if had_job[i] or u.phase in ("service", "score"):
                u.used = t
            if not env.kv_cache:
                u.srv_kv = 0
            if not env.prm_cache:
                u.prm_kv = 0
            holds = self._holds(u)
            if holds:
                pinned += u.job["ctx"]
            size = (0 if holds else u.srv_kv) + u.prm_kv * ratio
            if size > 0:
                own[i] = size
        total = pinned + sum(own.values())
        evicted = 0.0
        while total > env.kv_budget and own:
            i = min(own, key=lambda k: (users[k].used, k))
            u = users[i]
            if not self._holds(u):
                evicted += u.srv_kv
                u.srv_kv = 0
            evicted += u.prm_kv
            u.prm_kv = 0
            total -= own.pop(i)
        return dict(evicted_tokens=evicted, kv_in_use_tokens=total, kv_pinned_tokens=pinned)

    @staticmethod
    def _holds(u) -> bool:
        if u.phase not in ("service", "score"):
            return False
        j = u.job
        return j["seq"] and (j["up"] > 0 or j["pf"] > 0 or j["dec"] > 0)

    def _up_demand(self, u) -> float:
        env = self.env
        if u.phase not in ("service", "score") or u.job["up"] <= 0:
            return 0.0
        tau = env.cfg["tau_s"]
        return u.job["up_hz"] * min(u.job["up"], tau) / tau

    def _begin_score(self, u, fading: float, t: int) -> float:
        """The online PRM's scoring job of an RSD user whose draft is done; returns its
        offered load [s]."""
        env = self.env
        c, cfg = env.c, env.cfg
        _, bw_t, m_t, gain_t = env._cond(t)
        total = env.ctx[u.node] + env.tok[u.node][0]
        cached = min(u.prm_kv, total) if env.prm_cache else 0
        new = total - cached
        env._hits[0] += cached
        env._hits[1] += total
        snr = env.snr_bar * max(fading * gain_t, 1e-12)
        se = math.log2(1.0 + snr)
        bw = min(max(total * c.bits_per_token / (se * c.uplink_target_s), c.min_request_hz),
                 bw_t)
        pf_flops = roofline_prefill_flops(c.prm, new, cached)
        u.job = dict(up=total * c.bits_per_token / (bw * se), up_hz=bw, pf=float(new),
                     pf_flops=pf_flops, dec=0.0, ctx=float(total), dn=0.0, dn_hz=0.0, seq=False,
                     prm=True, ticket=t + 1)
        u.phase, u.left, u.prm_kv = "score", 1, total
        m = max(m_t, 1)
        return self._load(pf_flops, 0, total, m, c.prm.weights * c.server_hw["weight_bytes"]) * m

    def _load(self, pf_flops: float, dec: int, ctx: int, m: int, extra: float = 0.0) -> float:
        """Server-seconds of a job on a saturated server of m sequences: its share of the
        full-batch decode steps + the stall its prefill adds to one full-batch step."""
        env = self.env
        c = env.c
        hw = c.server_hw
        share = sum(roofline_step(c.llm, hw, [j] * m) for j in range(ctx, ctx + dec)) / m
        if pf_flops <= 0:
            return share
        cbar = ctx + dec / 2.0
        pk = hw["peak_flops"] * hw["eta"]
        bwm = hw["mem_bw"] * hw["eta_mem"]
        f = m * (2.0 * c.llm.token_params() + 4.0 * c.llm.layers * c.llm.d * cbar)
        byts = c.llm.weights * hw["weight_bytes"] + kv_token_bytes(c.llm, hw) * m * cbar
        return share + max((f + pf_flops) / pk, (byts + extra) / bwm) - max(f / pk, byts / bwm)

    def _serve_serving(self, users, tau: float, bw_t: float) -> dict:
        """One slot of the serving server, written job by job in float64."""
        idx = [i for i, u in enumerate(users) if u.phase in ("service", "score")]
        jobs = {i: users[i].job for i in idx}
        dem, up_new, comm_up = self._uplink(jobs, tau, bw_t)
        decoding = [i for i, j in jobs.items() if j["up"] <= 0 and j["pf"] <= 0 and j["dec"] > 0]
        backlog = [i for i, j in jobs.items() if up_new[i] <= 0 and j["pf"] > 0]
        b, n_a, n_b, t_a, t_b, time_a, prefilled, clears = self._iterations(jobs, decoding,
                                                                             backlog, tau)
        got_total = self._prefill(jobs, backlog, prefilled, clears)
        dec_total, comm_dn, dem_dn = self._decode_download(
            jobs, decoding, backlog, (n_a, n_b, t_a, t_b, time_a), tau, bw_t)
        for i, j in jobs.items():
            j["up"] = up_new[i]
            j["comm"] = comm_up[i] + comm_dn[i]
        busy = tau if b else time_a
        return dict(server_batch=b, prefill_tokens=got_total, decode_tokens=dec_total,
                    server_busy_s=busy, uplink_demand=dem / (bw_t * tau),
                    downlink_demand=dem_dn / (bw_t * tau))

    @staticmethod
    def _uplink(jobs: dict, tau: float, bw_t: float):
        """Uplink by processor sharing: (demand [Hz·s], upload s left, transfer s) per job."""
        dem = sum(j["up_hz"] * min(j["up"], tau) for j in jobs.values() if j["up"] > 0)
        phi = 1.0 if dem <= bw_t * tau else bw_t * tau / dem
        up_new, comm_up = {}, {}
        for i, j in jobs.items():
            need = min(j["up"], tau) if j["up"] > 0 else 0.0
            left = j["up"] - phi * need
            up_new[i] = left if left > 1e-9 else 0.0
            comm_up[i] = 0.0 if j["up"] <= 0 else (need if up_new[i] == 0.0 else tau)
        return dem, up_new, comm_up

    def _iterations(self, jobs: dict, decoding, backlog, tau: float):
        """The slot's chunk iterations, then pure decodes: (b, n_a, n_b, t_a, t_b, time_a,
        prefilled tokens, whether the backlog clears)."""
        env = self.env
        c = env.c
        hw = c.server_hw
        pk = hw["peak_flops"] * hw["eta"]
        bwm = hw["mem_bw"] * hw["eta_mem"]
        b = len(decoding)
        ctx_sum = sum(jobs[i]["ctx"] for i in decoding)
        total = sum(jobs[i]["pf"] for i in backlog)
        total_flops = sum(jobs[i]["pf_flops"] for i in backlog)
        f_dec = sum(2.0 * c.llm.token_params() + 4.0 * c.llm.layers * c.llm.d * jobs[i]["ctx"]
                    for i in decoding)
        kv = kv_token_bytes(c.llm, hw) * ctx_sum
        w_llm = c.llm.weights * hw["weight_bytes"]
        w_prm = c.prm.weights * hw["weight_bytes"]
        t_b = max(f_dec / pk, (w_llm + kv) / bwm) if b else 0.0
        n_a = time_a = prefilled = 0.0
        t_a = 0.0
        clears = True
        if total > 0:
            chunk = min(max(env.budget - b, 1.0), total)
            llm_p = any(not jobs[i]["prm"] for i in backlog)
            prm_p = any(jobs[i]["prm"] for i in backlog)
            byts = (w_llm if (b or llm_p) else 0.0) + (w_prm if prm_p else 0.0) + kv
            t_a = max((f_dec + chunk * total_flops / total) / pk, byts / bwm)
            need_it = total / chunk
            if need_it * t_a <= tau:
                n_a, time_a, prefilled = need_it, need_it * t_a, total
            else:
                clears = False
                n_a, time_a = tau / t_a, tau
                prefilled = n_a * chunk
        n_b = (tau - time_a) / t_b if b else 0.0
        return b, n_a, n_b, t_a, t_b, time_a, prefilled, clears

    @staticmethod
    def _prefill(jobs: dict, backlog, prefilled: float, clears: bool) -> float:
        """Prefill progress, first come first served; returns the tokens prefilled."""
        got_total = 0.0
        rest = prefilled
        for i in sorted(backlog, key=lambda k: (jobs[k]["ticket"], k)):
            j = jobs[i]
            got = j["pf"] if clears else min(j["pf"], max(rest, 0.0))
            rest -= j["pf"]
            got_total += got
            left = j["pf"] - got
            left = left if left > 1e-9 * max(j["pf"], 1.0) else 0.0
            j["pf_flops"] = j["pf_flops"] * left / j["pf"]
            j["pf"] = left
        return got_total

    @staticmethod
    def _decode_download(jobs: dict, decoding, backlog, its, tau: float, bw_t: float):
        """Decoding (one token per iteration) and the downlink by processor sharing: jobs past
        decoding have all of τ, jobs whose last token came this slot what is left after it.
        ``its``: (n_a, n_b, t_a, t_b, time_a). Returns (tokens decoded, transfer s per job,
        downlink demand [Hz·s])."""
        n_a, n_b, t_a, t_b, time_a = its
        n_it = n_a + n_b
        dec_total = 0.0
        comm_dn = {i: 0.0 for i in jobs}
        dn_need, avail = {}, {}
        for i, j in jobs.items():
            was_down = j["up"] <= 0 and j["dec"] <= 0 and j["dn"] > 0 and i not in backlog \
                and j["pf"] <= 0
            if i in decoding:
                n_tok = min(j["dec"], n_it)
                dec_total += n_tok
                j["dec"] -= n_tok
                j["ctx"] += n_tok
                t_last = n_tok * t_a if n_tok <= n_a else time_a + (n_tok - n_a) * t_b
                if j["dec"] <= 0 and j["dn"] > 0:
                    avail[i] = max(tau - t_last, 0.0)
            elif was_down:
                avail[i] = tau
        for i, a in avail.items():
            dn_need[i] = min(jobs[i]["dn"], a)
        dem_dn = sum(jobs[i]["dn_hz"] * dn_need[i] for i in dn_need)
        phi_dn = 1.0 if dem_dn <= bw_t * tau else bw_t * tau / dem_dn
        for i, need in dn_need.items():
            j = jobs[i]
            left = j["dn"] - phi_dn * need
            j["dn"] = left if left > 1e-9 else 0.0
            if need > 0:
                comm_dn[i] = need if j["dn"] == 0.0 else avail[i]
        return dec_total, comm_dn, dem_dn
