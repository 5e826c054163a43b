"""NumPy/plain-Python reference of the multi-user edge env (``envs.edge``), written independently.

Same rules as the module docstring of ``envs.edge``, transcribed as loops over user slots with
one Python object per user and float64 arithmetic. It takes the same pre-drawn randomness
(``envs.edge.Noise`` converted to NumPy) so equivalence tests can compare per-user outcomes, and
it is the baseline of ``benchmarks.env_throughput``. Not for training.

The roofline clock (a ``LatencyConsts.clock`` of "roofline", read from a hardware pair by
``consts_from_jax``) is transcribed too: the decode time of a step is summed token by token
(``roofline_decode``; the JAX clock uses a closed form). The server models are references of
their own beside the JAX ones (``envs.servers.paper_numpy``, ``legacy_numpy``,
``serving_numpy``), chosen by name from ``SERVERS``; the latency model's reference is
``envs.latency_numpy`` and the schedulers' ``envs.sched_numpy``.
"""
from __future__ import annotations

import math

import numpy as np

from envs.latency_numpy import (Arch, LatencyConsts, consts_from_jax, flops_decode,
                                flops_prefill, kv_token_bytes, mean_snr, roofline_decode,
                                roofline_prefill, roofline_prefill_flops, roofline_step)
from envs.sched_numpy import IMMEDIATE, LOCAL, QUEUE, SCHED_NAMES, schedule
from envs.servers.legacy_numpy import LegacyNumPy
from envs.servers.paper_numpy import PaperNumPy
from envs.servers.serving_numpy import ServingNumPy

__all__ = ["Arch", "EdgeEnvNumPy", "LatencyConsts", "SCHED_NAMES", "SERVERS", "consts_from_jax",
           "flops_decode", "flops_prefill", "kv_token_bytes", "mean_snr", "roofline_decode",
           "roofline_prefill", "roofline_prefill_flops", "roofline_step", "schedule"]

#: The server references by model name (``envs.servers.registry.SERVERS``'s names).
SERVERS = {"paper": PaperNumPy, "legacy": LegacyNumPy, "serving": ServingNumPy}


class _User:
    __slots__ = ("phase", "node", "left", "wait", "gain", "draft_s", "bw", "frac", "slm_kv",
                 "srv_kv", "t0", "proc", "comm", "queue", "offloads", "outages", "steps",
                 "fallbacks", "job", "prm_kv", "scored", "used")

    def __init__(self):
        self.phase = "empty"


class EdgeEnvNumPy:
    """Reference env. ``cfg`` holds the ``envs.edge.make_params`` keywords (plain numbers);
    ``lat`` the latency constants; ``traces`` a ``TraceSet`` of NumPy arrays."""

    def __init__(self, traces, cfg: dict, lat: LatencyConsts | None = None):
        self.tr = {k: np.asarray(v) for k, v in traces.to_dict().items()}
        self.cfg = dict(cfg)
        self.c = lat or LatencyConsts()
        self.U = int(cfg["num_users"])
        self.sched = cfg["scheduler"] if isinstance(cfg["scheduler"], str) else \
            SCHED_NAMES[int(cfg["scheduler"])]
        self.users = [_User() for _ in range(self.U)]
        self.t = 0
        self.arrived = self.finished = self.blocked = 0
        self.roof = self.c.clock != "paper"
        model = cfg.get("server_model", "serving") if self.roof else "paper"
        if model not in SERVERS:
            raise ValueError(f"server_model must be one of {tuple(SERVERS)}, got {model!r}")
        self.server = SERVERS[model](self)
        self.budget = float(cfg.get("max_batched_tokens", 2048))
        # The prefix cache (envs.prefix_cache): on by default under the serving server only.
        self.kv_cache = self._flag("server_kv_cache")
        self.prm_cache = self._flag("prm_prefix_cache")
        self.kv_budget = self.server.kv_budget()
        self._paths = {}
        self.snr_bar = mean_snr(self.c)
        self.snr_th = 10.0 ** (self.c.snr_threshold_db / 10.0) if \
            self.c.snr_threshold_db != -math.inf else 0.0
        # Plain Python lists are faster than NumPy scalar indexing in the per-user loops.
        self.ctx = self.tr["ctx_tokens"].tolist()
        self.tok = self.tr["cand_tokens"].tolist()
        self.cprm = self.tr["cand_prm"].tolist()
        self.prm = self.tr["prm"].tolist()
        self.child = self.tr["child"].tolist()
        self.term = self.tr["terminal"].tolist()
        self.corr = self.tr["correct"].tolist()
        self.fb = self.tr["fallback"].tolist()
        self.root = self.tr["root"].tolist()
        self.problem = self.tr["problem"].tolist()


    def _flag(self, key: str) -> bool:
        v = self.cfg.get(key)
        return self.server.caches_by_default if v is None else bool(v)

    def _nslots(self, sec):
        return max(1, int(math.ceil(min(sec / self.cfg["tau_s"], 1e6))))

    def _begin_draft(self, u: _User, node: int, slm_kv: int):
        c = self.c
        ctx, dtok = self.ctx[node], self.tok[node][0]
        if self.cfg.get("llm_only", False):   # the server LLM alone: no draft, decide at once
            u.phase, u.node, u.draft_s, u.left, u.slm_kv = "decide", node, 0.0, 0, ctx + dtok
            return
        kv = min(slm_kv, ctx)
        if self.roof:
            sec = roofline_prefill(c.slm, c.edge_hw, ctx - kv, kv) + roofline_decode(
                c.slm, c.edge_hw, dtok, ctx, 1)
            if self.sched == "rsd" and not self.server.scores_on_server:
                sec += roofline_prefill(c.prm, c.server_hw, ctx + dtok, 0)
        else:
            fl = flops_prefill(c.slm, ctx - kv, kv) + flops_decode(c.slm, dtok, ctx)
            sec = fl / (c.edge_peak_flops * c.edge_eta)
            if self.sched == "rsd":
                sec += flops_prefill(c.prm, ctx + dtok, 0) / (c.server_peak_flops * c.server_eta)
        u.phase, u.node, u.draft_s, u.left, u.slm_kv = "draft", node, sec, self._nslots(sec), \
            ctx + dtok

    def _cond(self, t: int):
        """Scenario at slot t (``envs.scenarios``): (arrival rate [1/s], B_t [Hz], M_t, channel
        gain); ``cfg["scenario"]`` is a Scenario or absent (static)."""
        cfg, scn = self.cfg, self.cfg.get("scenario")
        if scn is None:
            return cfg["arrival_rate_hz"], cfg["bandwidth_hz"], int(cfg["num_servers"]), 1.0
        i = t % len(scn.arrival)
        m = int(math.floor(float(np.float32(cfg["num_servers"] * np.float32(scn.servers[i])))
                           + 0.5))
        return (cfg["arrival_rate_hz"] * float(scn.arrival[i]),
                cfg["bandwidth_hz"] * float(scn.bandwidth[i]), m,
                10.0 ** (float(scn.channel_db[i]) / 10.0))

    @staticmethod
    def _poisson(u: float, rate: float, max_count: int = 64) -> int:
        """Inverse-CDF Poisson count: the number of k in 0..max_count with CDF(k) < u."""
        if rate <= 0:
            return 0
        n, cdf, pmf = 0, 0.0, math.exp(-rate)
        for k in range(max_count + 1):
            cdf += pmf
            if cdf < u:
                n += 1
            pmf *= rate / (k + 1)
        return min(n, max_count)

    def _path(self, node: int):
        """(tokens, steps, correct, fallbacks, last step's tokens) of the LLM's branch from
        ``node`` to the end of the solution."""
        if node not in self._paths:
            tokens = steps = fbs = 0
            n = node
            while True:
                tokens += self.tok[n][1]
                steps += 1
                nxt, corr, used_fb = self._next(n, 1)
                fbs += int(used_fb)
                if nxt is None:
                    self._paths[node] = (tokens, steps, corr, fbs, self.tok[n][1])
                    break
                n = nxt
        return self._paths[node]

    def _request(self, u: _User, fading: float):
        return self.server.request(u, fading)

    def _advance(self, u: _User, i: int, finished_now: dict) -> None:
        """User ``i``'s step is over: it drafts its next step (the successor of its node by
        the server's candidate), or it finishes (recorded in ``finished_now``)."""
        nxt, corr, used_fb = self._next(u.node, 1)
        if nxt is None:
            finished_now[i] = (corr, self.t + 1)
            u.phase = "empty"
        else:
            if used_fb:
                self.server.cut_at_fallback(u)
            self._begin_draft(u, nxt, self.ctx[u.node])


    def _next(self, node, b):
        """(next node or None if the solution ends, correct, used fallback)."""
        if self.term[node][b]:
            return None, bool(self.corr[node][b]), False
        ch = self.child[node][b]
        return (ch, False, False) if ch >= 0 else (self.fb[node], False, True)

    # -- episode
    def _arrive(self, n: int, problems, slot: int):
        admitted = 0
        for i, u in enumerate(self.users):
            if admitted >= n:
                break
            if u.phase == "empty":
                u.wait, u.gain, u.bw, u.frac, u.srv_kv, u.t0 = 0, 0.0, 0.0, 0.0, 0, slot
                u.prm_kv, u.scored, u.job, u.used = 0, False, None, 0
                u.proc = u.comm = u.queue = 0.0
                u.offloads = u.outages = u.steps = u.fallbacks = 0
                self._begin_draft(u, self.root[int(problems[i])], 0)
                admitted += 1
        self.arrived += n
        self.blocked += n - admitted
        return n - admitted

    def reset(self, noise):
        self.users = [_User() for _ in range(self.U)]
        self.t = 0
        self.arrived = self.finished = self.blocked = 0
        self._arrive(int(self.cfg.get("initial_users", self.U)), noise["problem"], 0)
        return self.observe()

    def observe(self):
        f = self.tr["feat"].shape[1]
        obs = np.zeros((self.U, f + 2))
        for i, u in enumerate(self.users):
            if u.phase != "empty":
                obs[i, :f] = self.tr["feat"][u.node]
                obs[i, f] = self.tr["depth"][u.node]
                obs[i, f + 1] = self.ctx[u.node] * self.cfg.get("ctx_scale", 1e-3)
        return obs


    def step(self, screen, gain, noise):
        """One slot. ``screen``, ``gain``: per-user actions; ``noise``: dict of NumPy arrays.

        Returns (obs, reward [U], done [U], info dict of NumPy arrays / ints)."""
        tau, users = self.cfg["tau_s"], self.users
        busy_units, busy_bw = self.server.busy(users)
        queue_len = sum(1 for u in users if u.phase == "queue")
        self._hits = [0, 0]     # prefix tokens the server's cache served, context tokens
        decided, res, cands = self._candidates(screen, gain, noise)
        rate_t, bw_t, m_t, _ = self._cond(self.t)
        free_units = max(m_t - busy_units, 0)
        free_bw = max(bw_t - busy_bw, 0.0)
        scfg = dict(self.cfg, queue_len=queue_len, num_servers_t=m_t)
        dec = schedule(self.sched, cands, free_units, free_bw, scfg)
        outage = self._enforce(dec, res, free_units, free_bw)
        offered_load = self.server.offered_load(users, dec, res, outage)
        finished_now = {}
        reward, decision = self._resolve(dec, res, outage, finished_now)

        # Slot time by phase, then end-of-slot transitions.
        qlen = sum(1 for u in users if u.phase == "queue")
        had_job = [u.phase in ("service", "score") for u in users]
        in_use, bw_use, stats = self.server.run_slot(users, tau, bw_t)
        t_old = self.t
        self._charge(finished_now)
        done, info_user = self._finish(finished_now)
        self.t += 1
        n_arr = self._poisson(float(noise["u_arrival"]), rate_t * tau)
        blocked = self._arrive(n_arr, noise["problem"], self.t)
        cache, extra = self.server.end_slot(users, noise, t_old, had_job, offered_load)
        stats = dict(stats, **extra)
        info = dict(**stats, decision_mask=decided, decision=decision, outage=outage,
                    terminated=done, server_in_use=in_use, bandwidth_in_use_hz=bw_use,
                    queue_len=qlen, arrivals=n_arr, num_servers_t=m_t, bandwidth_t_hz=bw_t,
                    blocked=blocked, arrived=self.arrived, finished=self.finished,
                    blocked_total=self.blocked,
                    in_flight=sum(1 for u in users if u.phase != "empty"),
                    prefix_hit_tokens=self._hits[0], prefix_ctx_tokens=self._hits[1], **cache,
                    **info_user)
        return self.observe(), reward, done, info

    def _candidates(self, screen, gain, noise):
        """Users at a decision point take their action; every nomination and queued request
        becomes a candidate. Returns (decided [U] bool, requests [U], candidate dicts)."""
        decided = np.zeros(self.U, bool)
        res = [None] * self.U
        cands = []
        for i, u in enumerate(self.users):
            if u.phase == "decide":
                decided[i] = True
                u.gain = float(gain[i])
                if int(screen[i]) == 1 or self.sched == "rsd":
                    u.phase = "nominated"
                else:
                    u.phase = "resolve_local"
            if u.phase in ("nominated", "queue"):
                r = self._request(u, float(noise["fading"][i]))
                res[i] = r
                cands.append(dict(i=i, gain=u.gain, delay=r["delay"], bw=r["bw"], wait=u.wait,
                                  comm=r["up"] + r["dn"],
                                  draft_prm=self.cprm[u.node][0], u=float(noise["u_sched"][i])))
        return decided, res, cands

    def _enforce(self, dec, res, free_units, free_bw):
        """Env-side rules on the decisions ``dec`` (changed in place): expiry, outage, hard
        limits (truncation in user-slot order). Returns outage [U] bool."""
        cfg, users = self.cfg, self.users
        outage = np.zeros(self.U, bool)
        for i in dec:
            u = users[i]
            expired = u.wait >= cfg["max_wait_slots"]
            if dec[i] == QUEUE and expired:
                dec[i] = LOCAL
            if dec[i] == IMMEDIATE and res[i]["outage"]:
                # an outage keeps the draft; the LLM alone has none and waits a slot
                dec[i] = QUEUE if cfg.get("llm_only", False) else LOCAL
                outage[i] = True
        asked_units, asked_bw = 0, 0.0
        for i in sorted(dec):
            if dec[i] != IMMEDIATE:
                continue
            asked_units += 1
            asked_bw += res[i]["bw"]
            if asked_units > free_units or asked_bw > free_bw:
                dec[i] = LOCAL if users[i].wait >= cfg["max_wait_slots"] else QUEUE
        return outage

    def _resolve(self, dec, res, outage, finished_now):
        """Each decided user queues, keeps its draft or starts its server job; returns
        (reward [U], decision [U])."""
        cfg, tau = self.cfg, self.cfg["tau_s"]
        reward = np.zeros(self.U)
        decision = np.full(self.U, -1)
        true_reward = cfg.get("reward_mode", "coarse") == "true"
        for i, u in enumerate(self.users):
            if u.phase == "resolve_local":
                d = LOCAL
            elif i in dec:
                d = dec[i]
            else:
                continue
            decision[i] = d
            if d == QUEUE:
                u.phase = "queue"
                u.outages += int(outage[i])
                continue
            b = 1 if d == IMMEDIATE else 0
            n = u.node
            cost = u.draft_s
            penalty = 0.0
            if b:
                cost += res[i]["srv"]
                if true_reward:
                    penalty += res[i]["up"] + res[i]["dn"]
            if true_reward:
                penalty += u.wait * tau
            reward[i] = self.cprm[n][b] - self.prm[n] - cfg["beta"] * (cost + penalty)
            u.steps += 1
            u.outages += int(outage[i])
            nxt, corr, used_fb = self._next(n, b)
            u.fallbacks += int(used_fb)
            u.wait = 0
            if b == 0:
                if nxt is None:
                    finished_now[i] = (corr, self.t)
                    u.phase = "empty"
                else:
                    if used_fb:
                        self.server.cut_at_fallback(u)
                    self._begin_draft(u, nxt, u.slm_kv)
            else:
                self._offload(u, res[i], n)
        return reward, decision

    def _offload(self, u: _User, r: dict, n: int) -> None:
        """User ``u``'s step at node ``n`` goes to the server (request ``r``)."""
        u.phase = "service"
        u.left = self._nslots(r["delay"])
        u.bw = r["bw"]
        u.frac = (r["up"] + r["dn"]) / max(r["delay"], 1e-30)
        u.srv_kv = self.ctx[n] + self.tok[n][1]
        u.offloads += 1
        self._hits[0] += r["cached"]
        self._hits[1] += r["ctx"]
        self.server.start_job(u, r, n)

    def _charge(self, finished_now: dict) -> None:
        """The slot's time by phase; drafts that end become decision points, server jobs
        are charged (and finished) by the server."""
        tau = self.cfg["tau_s"]
        for i, u in enumerate(self.users):
            if u.phase in ("service", "score"):
                self.server.charge_job(u, i, tau, finished_now)
            elif u.phase == "draft":
                u.proc += tau
                u.left -= 1
                if u.left <= 0:
                    u.phase = "decide"
            elif u.phase == "queue":
                u.queue += tau
                u.wait += 1

    def _finish(self, finished_now: dict):
        """(done [U], the ``user_*`` info of the users that finished this slot)."""
        tau = self.cfg["tau_s"]
        done = np.zeros(self.U, bool)
        info_user = {k: np.zeros(self.U) for k in (
            "user_correct", "user_latency_s", "user_processing_s", "user_communication_s",
            "user_queueing_s", "user_offloads", "user_outages", "user_steps", "user_fallbacks")}
        for i, (corr, end) in finished_now.items():
            u = self.users[i]
            done[i] = True
            info_user["user_correct"][i] = corr
            info_user["user_latency_s"][i] = (end - u.t0) * tau
            info_user["user_processing_s"][i] = u.proc
            info_user["user_communication_s"][i] = u.comm
            info_user["user_queueing_s"][i] = u.queue
            info_user["user_offloads"][i] = u.offloads
            info_user["user_outages"][i] = u.outages
            info_user["user_steps"][i] = u.steps
            info_user["user_fallbacks"][i] = u.fallbacks
        self.finished += len(finished_now)
        return done, info_user
