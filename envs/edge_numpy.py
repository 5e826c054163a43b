"""NumPy/plain-Python reference of the multi-user edge env (``envs.edge``), written independently.

Same rules as the module docstring of ``envs.edge``, transcribed as loops over user slots with
one Python object per user and float64 arithmetic. It takes the same pre-drawn randomness
(``envs.edge.Noise`` converted to NumPy) so equivalence tests can compare per-user outcomes, and
it is the baseline of ``benchmarks.env_throughput``. Not for training.

The roofline clock (a ``LatencyConsts.clock`` of "roofline", read from a hardware pair by
``consts_from_jax``) is transcribed too: the decode time of a step is summed token by token
(``roofline_decode``; the JAX clock uses a closed form) and the batching server runs job by
job (``EdgeEnvNumPy._serve``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SCHED_NAMES = ("keep_local", "offload_all", "random", "fifo_greedy", "threshold", "rsd",
               "threshold_fifo")
LOCAL, QUEUE, IMMEDIATE = 0, 1, 2


# ----------------------------------------------------------------------------- latency (float64)

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


# ----------------------------------------------------------------------------- schedulers

def _fill(order, wants, bw, free_units, free_bw):
    admitted = set()
    for i in order:
        if wants[i] and free_units >= 1 and bw[i] <= free_bw:
            admitted.add(i)
            free_units -= 1
            free_bw -= bw[i]
    return admitted


def schedule(name, cands, free_units, free_bw, cfg):
    """Reference schedulers over a list of candidate dicts; returns {index: decision}."""
    out = {}
    idx = [c["i"] for c in cands]
    by = {c["i"]: c for c in cands}
    bw = {i: by[i]["bw"] for i in idx}
    exp = {i: by[i]["wait"] >= cfg["max_wait_slots"] for i in idx}

    def finish(admitted, wants_queue):
        for i in idx:
            if i in admitted:
                out[i] = IMMEDIATE
            elif wants_queue[i] and not exp[i]:
                out[i] = QUEUE
            else:
                out[i] = LOCAL
        return out

    if name == "keep_local":
        return {i: LOCAL for i in idx}
    oldest = sorted(idx, key=lambda i: (-by[i]["wait"], i))  # arrival order, ties by slot
    if name == "offload_all":
        return finish(_fill(oldest, {i: True for i in idx}, bw, free_units, free_bw),
                      {i: True for i in idx})
    if name == "random":
        choice = {i: min(int(3.0 * by[i]["u"]), 2) for i in idx}
        admitted = _fill(oldest, {i: choice[i] == IMMEDIATE for i in idx}, bw, free_units,
                         free_bw)
        return finish(admitted, {i: choice[i] != LOCAL for i in idx})
    if name == "fifo_greedy":
        order = sorted(idx, key=lambda i: (-by[i]["wait"], i))
        return finish(_fill(order, {i: True for i in idx}, bw, free_units, free_bw),
                      {i: True for i in idx})
    if name == "rsd":
        wants = {i: by[i]["draft_prm"] < cfg["rsd_threshold"] for i in idx}
        return finish(_fill(oldest, wants, bw, free_units, free_bw), wants)
    if name in ("threshold", "threshold_fifo"):
        # Admission-price rule with each cost charged once (prada_jax.sched.threshold).
        # Expected wait over the units available this slot (M_t, at least 1), not the nominal M.
        m_t = max(int(cfg.get("num_servers_t", cfg["num_servers"])), 1)
        c_wait = cfg["beta"] * cfg["tau_s"] * (1.0 + cfg["queue_len"] / m_t)
        red, wants, gi, qok = {}, {}, {}, {}
        for i in idx:
            c = by[i]
            w = c["gain"] if cfg.get("policy_reward_mode", "coarse") == "true" else \
                c["gain"] - cfg["beta"] * c["comm"]
            g = w - (cfg["lambda_s"] + cfg["mu"] * c["bw"])
            wants[i] = (not exp[i]) and g >= 0.0
            qok[i] = g - c_wait > 0.0
            red[i] = c_wait if qok[i] else g  # value lost if rejected
            gi[i] = g
        key = (lambda i: (-red[i], -gi[i], i)) if name == "threshold" else \
            (lambda i: (-by[i]["wait"], i))     # the ablation: first come first served
        order = sorted([i for i in idx if wants[i]], key=key)
        admitted = _fill(order, wants, bw, free_units, free_bw)
        return finish(admitted, qok)
    raise ValueError(f"unknown scheduler {name!r}")


# ----------------------------------------------------------------------------- env

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
        self.serving = self.roof and cfg.get("server_model", "serving") == "serving"
        self.budget = float(cfg.get("max_batched_tokens", 2048))
        # The prefix cache (envs.prefix_cache): on by default under the serving server only.
        self.kv_cache = self._flag("server_kv_cache")
        self.prm_cache = self._flag("prm_prefix_cache")
        self.kv_budget = self._kv_budget()
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
        return self.serving if v is None else bool(v)

    def _kv_budget(self) -> float:
        """KV budget [LLM-KV tokens]: the config's, else the server's memory less the LLM's and
        the PRM's weights over one LLM token's KV bytes; inf outside the serving server."""
        if not self.serving:
            return math.inf
        if self.cfg.get("kv_budget_tokens") is not None:
            return float(self.cfg["kv_budget_tokens"])
        c, hw = self.c, self.c.server_hw
        free = hw["mem_bytes"] - (c.llm.weights + c.prm.weights) * hw["weight_bytes"]
        return float(max(math.floor(free / kv_token_bytes(c.llm, hw)), 0))

    # -- delays
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
            if self.sched == "rsd" and not self.serving:
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

    def _request_serving(self, u: _User, fading: float):
        c, cfg, tau = self.c, self.cfg, self.cfg["tau_s"]
        _, bw_t, m_t, gain_t = self._cond(self.t)
        n = u.node
        ctx = self.ctx[n]
        cached = min(u.srv_kv, ctx) if self.kv_cache else 0
        up = ctx - cached            # prefilled; the upload carries all ctx tokens
        if cfg.get("llm_only", False):
            dec, _, _, _, dtok = self._path(n)
        else:
            dec = dtok = self.tok[n][1]
        snr = self.snr_bar * max(fading * gain_t, 1e-12)
        se = math.log2(1.0 + snr)
        need = lambda bits: min(max(bits / (se * c.uplink_target_s), c.min_request_hz), bw_t)  # noqa
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
        return dict(snr=snr, outage=snr < self.snr_th, bw=bw * min(t_up, tau) / tau,
                    up_hz=bw, dn_hz=bw_dn, up=t_up, dn=t_dn, srv=hold, pf_flops=pf_flops,
                    pf_tok=float(up), dec=float(dec), delay=t_up + hold + t_dn, load=load,
                    cached=cached, ctx=ctx)

    def _request(self, u: _User, fading: float):
        if self.serving:
            return self._request_serving(u, fading)
        c, cfg = self.c, self.cfg
        _, bw_t, m_t, gain_t = self._cond(self.t)
        ctx = self.ctx[u.node]
        ltok = self.tok[u.node][1]
        cached = min(u.srv_kv, ctx) if self.kv_cache else 0
        up = ctx - cached
        snr = self.snr_bar * max(fading * gain_t, 1e-12)
        se = math.log2(1.0 + snr)
        bw = up * c.bits_per_token / (se * c.uplink_target_s)
        bw = min(max(bw, c.min_request_hz), bw_t)
        t_up = up * c.bits_per_token / (bw * se)
        t_dn = ltok * c.bits_per_token / (bw * se) if cfg.get("downlink", True) else 0.0
        if self.roof:   # a full batch of M_t sequences (at least 1) shares every decode step
            pf = roofline_prefill(c.llm, c.server_hw, up, cached)
            t_srv = pf + roofline_decode(c.llm, c.server_hw, ltok, ctx, max(m_t, 1))
        else:
            pf = 0.0
            fl = flops_prefill(c.llm, up, cached) + flops_decode(c.llm, ltok, ctx)
            t_srv = fl / (c.server_peak_flops * c.server_eta)
        return dict(snr=snr, outage=snr < self.snr_th, bw=bw, up=t_up, dn=t_dn, srv=t_srv,
                    pf=pf, delay=t_up + t_srv + t_dn, cached=cached, ctx=ctx)

    def _advance(self, u: _User, i: int, finished_now: dict) -> None:
        """User ``i``'s step is over: it drafts its next step (the successor of its node by
        the server's candidate), or it finishes (recorded in ``finished_now``)."""
        nxt, corr, used_fb = self._next(u.node, 1)
        if nxt is None:
            finished_now[i] = (corr, self.t + 1)
            u.phase = "empty"
        else:
            if used_fb and self.serving:
                self._keep_prompt_only(u)
            self._begin_draft(u, nxt, self.ctx[u.node])

    def _keep_prompt_only(self, u: _User) -> None:
        """A move through a trace fallback (serving server): the server's prefixes of ``u``
        shrink to the problem's prompt (the only part of the old path its new context
        shares)."""
        prompt = self.ctx[self.root[self.problem[u.node]]]
        u.srv_kv = min(u.srv_kv, prompt)
        u.prm_kv = min(u.prm_kv, prompt)

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
        cfg, tau, U = self.cfg, self.cfg["tau_s"], self.U
        beta = cfg["beta"]
        reward = np.zeros(U)
        done = np.zeros(U, bool)
        decision = np.full(U, -1)
        outage = np.zeros(U, bool)
        decided = np.zeros(U, bool)
        users = self.users
        res = [None] * U
        if self.serving:
            busy_units = sum(1 for u in users if self._holds(u))
            busy_bw = sum(self._up_demand(u) for u in users)
        else:
            busy_units = sum(1 for u in users if u.phase == "service")
            busy_bw = sum(u.bw for u in users if u.phase == "service")
        offered_load = 0.0
        queue_len = sum(1 for u in users if u.phase == "queue")
        self._hits = [0, 0]     # prefix tokens the server's cache served, context tokens

        cands = []
        for i, u in enumerate(users):
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
        rate_t, bw_t, m_t, _ = self._cond(self.t)
        free_units = max(m_t - busy_units, 0)
        free_bw = max(bw_t - busy_bw, 0.0)
        scfg = dict(cfg, queue_len=queue_len, num_servers_t=m_t)
        dec = schedule(self.sched, cands, free_units, free_bw, scfg)

        # Env-side rules: expiry, outage, hard limits (truncation in user-slot order).
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
        if self.serving:   # offered load: new nominations that asked for the server
            for i in dec:
                if users[i].phase == "nominated" and (dec[i] != LOCAL or outage[i]):
                    offered_load += res[i]["load"]

        finished_now = {}
        for i, u in enumerate(users):
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
                r = res[i]
                cost += r["srv"]
                if cfg.get("reward_mode", "coarse") == "true":
                    penalty += r["up"] + r["dn"]
            if cfg.get("reward_mode", "coarse") == "true":
                penalty += u.wait * tau
            reward[i] = self.cprm[n][b] - self.prm[n] - beta * (cost + penalty)
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
                    if used_fb and self.serving:
                        self._keep_prompt_only(u)
                    self._begin_draft(u, nxt, u.slm_kv)
            else:
                r = res[i]
                u.phase = "service"
                u.left = self._nslots(r["delay"])
                u.bw = r["bw"]
                u.frac = (r["up"] + r["dn"]) / max(r["delay"], 1e-30)
                u.srv_kv = self.ctx[n] + self.tok[n][1]
                u.offloads += 1
                self._hits[0] += r["cached"]
                self._hits[1] += r["ctx"]
                if self.serving:
                    u.job = dict(up=r["up"], up_hz=r["up_hz"], pf=r["pf_tok"],
                                 pf_flops=r["pf_flops"], dec=r["dec"], ctx=float(self.ctx[n]),
                                 dn=r["dn"], dn_hz=r["dn_hz"], seq=True, prm=False, ticket=self.t)
                    continue
                # Batching server: remaining upload s, prefill s, tokens, context, download s.
                u.job = dict(up=r["up"], pf=r["pf"], dec=float(self.tok[n][1]),
                             ctx=float(self.ctx[n]), dn=r["dn"])

        # Slot time by phase, then end-of-slot transitions.
        in_use = sum(1 for u in users if u.phase == "service")
        bw_use = sum(u.bw for u in users if u.phase == "service")
        qlen = sum(1 for u in users if u.phase == "queue")
        stats = {}
        had_job = [u.phase in ("service", "score") for u in users]
        if self.serving:
            in_use = sum(1 for u in users if self._holds(u))
            bw_use = min(sum(self._up_demand(u) for u in users), bw_t)
            stats = self._serve_serving(users, tau, bw_t)
        elif self.roof:
            self._serve(users, tau)
        t_old = self.t
        for i, u in enumerate(users):
            if self.serving and u.phase in ("service", "score"):
                u.comm += u.job["comm"]
                u.proc += tau - u.job["comm"]
                if any(u.job[k] > 0 for k in ("up", "pf", "dec", "dn")):
                    continue
                if u.phase == "score":
                    u.phase, u.scored = "decide", True
                    continue
                if cfg.get("llm_only", False):   # the resident sequence ended the solution
                    _, steps, corr, fbs, _ = self._path(u.node)
                    first_fb = int(self._next(u.node, 1)[2])
                    u.steps += steps - 1
                    u.offloads += steps - 1
                    u.fallbacks += fbs - first_fb
                    finished_now[i] = (corr, self.t + 1)
                    u.phase = "empty"
                    continue
                self._advance(u, i, finished_now)
                continue
            if u.phase == "draft":
                u.proc += tau
                u.left -= 1
                if u.left <= 0:
                    u.phase = "decide"
            elif u.phase == "queue":
                u.queue += tau
                u.wait += 1
            elif u.phase == "service":
                if self.roof:
                    u.comm += u.job["comm"]
                    u.proc += tau - u.job["comm"]
                    u.left = 1 if any(u.job[k] > 0 for k in ("up", "pf", "dec", "dn")) else 0
                else:
                    u.comm += tau * u.frac
                    u.proc += tau - tau * u.frac
                    u.left -= 1
                if u.left <= 0:
                    u.bw = 0.0
                    self._advance(u, i, finished_now)

        info_user = {k: np.zeros(U) for k in ("user_correct", "user_latency_s",
                                               "user_processing_s", "user_communication_s",
                                               "user_queueing_s", "user_offloads", "user_outages",
                                               "user_steps", "user_fallbacks")}
        for i, (corr, end) in finished_now.items():
            u = users[i]
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
        self.t += 1
        n_arr = self._poisson(float(noise["u_arrival"]), rate_t * tau)
        blocked = self._arrive(n_arr, noise["problem"], self.t)
        if self.serving:
            for i, u in enumerate(users):
                if (self.sched == "rsd" and not cfg.get("llm_only", False)
                        and u.phase == "decide" and not getattr(u, "scored", False)):
                    offered_load += self._begin_score(u, float(noise["fading"][i]), t_old)
                u.scored = False
        cache = dict(evicted_tokens=0.0, kv_in_use_tokens=0.0, kv_pinned_tokens=0.0)
        if self.serving:
            cache = self._cache_end(users, had_job, t_old)
            stats = dict(stats, offered_job_s=offered_load)
        info = dict(**stats,decision_mask=decided, decision=decision, outage=outage, terminated=done,
                    server_in_use=in_use, bandwidth_in_use_hz=bw_use, queue_len=qlen,
                    arrivals=n_arr, num_servers_t=m_t, bandwidth_t_hz=bw_t,
                    blocked=blocked, arrived=self.arrived, finished=self.finished,
                    blocked_total=self.blocked,
                    in_flight=sum(1 for u in users if u.phase != "empty"),
                    prefix_hit_tokens=self._hits[0], prefix_ctx_tokens=self._hits[1], **cache,
                    **info_user)
        return self.observe(), reward, done, info

    def _cache_end(self, users, had_job, t: int) -> dict:
        """The prefix cache at the end of slot ``t`` (rules in ``envs.prefix_cache``), user by
        user: mark the prefixes of users with a server job this slot as used at ``t``, drop
        finished users' and disabled caches, then evict the least recently used prefix (ties
        by user slot) while the running sequences and the cached prefixes exceed the budget."""
        ratio = 1.0
        if self.c.server_hw is not None:
            ratio = kv_token_bytes(self.c.prm, self.c.server_hw) / kv_token_bytes(
                self.c.llm, self.c.server_hw)
        pinned, own = 0.0, {}
        for i, u in enumerate(users):
            if u.phase == "empty":
                u.srv_kv = u.prm_kv = 0
                continue
            if had_job[i] or u.phase in ("service", "score"):
                u.used = t
            if not self.kv_cache:
                u.srv_kv = 0
            if not self.prm_cache:
                u.prm_kv = 0
            holds = self._holds(u)
            if holds:
                pinned += u.job["ctx"]
            size = (0 if holds else u.srv_kv) + u.prm_kv * ratio
            if size > 0:
                own[i] = size
        total = pinned + sum(own.values())
        evicted = 0.0
        while total > self.kv_budget and own:
            i = min(own, key=lambda k: (users[k].used, k))
            u = users[i]
            if not self._holds(u):
                evicted += u.srv_kv
                u.srv_kv = 0
            evicted += u.prm_kv
            u.prm_kv = 0
            total -= own.pop(i)
        return dict(evicted_tokens=evicted, kv_in_use_tokens=total, kv_pinned_tokens=pinned)

    # -- the serving server (rules in ``envs.serving``), job by job
    @staticmethod
    def _holds(u: _User) -> bool:
        if u.phase not in ("service", "score"):
            return False
        j = u.job
        return j["seq"] and (j["up"] > 0 or j["pf"] > 0 or j["dec"] > 0)

    def _up_demand(self, u: _User) -> float:
        if u.phase not in ("service", "score") or u.job["up"] <= 0:
            return 0.0
        tau = self.cfg["tau_s"]
        return u.job["up_hz"] * min(u.job["up"], tau) / tau

    def _begin_score(self, u: _User, fading: float, t: int) -> float:
        """The online PRM's scoring job of an RSD user whose draft is done; returns its
        offered load [s]."""
        c, cfg = self.c, self.cfg
        _, bw_t, m_t, gain_t = self._cond(t)
        total = self.ctx[u.node] + self.tok[u.node][0]
        cached = min(u.prm_kv, total) if self.prm_cache else 0
        new = total - cached
        self._hits[0] += cached
        self._hits[1] += total
        snr = self.snr_bar * max(fading * gain_t, 1e-12)
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
        c = self.c
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
        c = self.c
        hw = c.server_hw
        pk = hw["peak_flops"] * hw["eta"]
        bwm = hw["mem_bw"] * hw["eta_mem"]
        idx = [i for i, u in enumerate(users) if u.phase in ("service", "score")]
        jobs = {i: users[i].job for i in idx}
        # uplink: processor sharing
        dem = sum(j["up_hz"] * min(j["up"], tau) for j in jobs.values() if j["up"] > 0)
        phi = 1.0 if dem <= bw_t * tau else bw_t * tau / dem
        up_new, comm_up = {}, {}
        for i, j in jobs.items():
            need = min(j["up"], tau) if j["up"] > 0 else 0.0
            left = j["up"] - phi * need
            up_new[i] = left if left > 1e-9 else 0.0
            comm_up[i] = 0.0 if j["up"] <= 0 else (need if up_new[i] == 0.0 else tau)
        decoding = [i for i, j in jobs.items() if j["up"] <= 0 and j["pf"] <= 0 and j["dec"] > 0]
        backlog = [i for i, j in jobs.items() if up_new[i] <= 0 and j["pf"] > 0]
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
            chunk = min(max(self.budget - b, 1.0), total)
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
        for i, j in jobs.items():
            j["up"] = up_new[i]
            j["comm"] = comm_up[i] + comm_dn[i]
        busy = tau if b else time_a
        return dict(server_batch=b, prefill_tokens=got_total, decode_tokens=dec_total,
                    server_busy_s=busy, uplink_demand=dem / (bw_t * tau),
                    downlink_demand=dem_dn / (bw_t * tau))

    def _serve(self, users, tau: float):
        """One slot of the batching server (rules in ``envs.edge._serve_slot``), job by job:
        every job's τ goes to upload, then prefill; all prefills of the slot run before the
        batch decodes; then decode, then download."""
        c = self.c
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
