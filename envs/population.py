"""The users of the edge env outside the server: the slot's randomness (``draw_noise``), new
users placed into empty slots (``admit``), their drafts on the edge SLM (``start_draft``), moves
down the trace tree (``successor``) and what the edge policy observes (``observe``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from envs.params import EnvParams, phase_slots
from envs.servers.registry import server_of
from envs.state import DECIDE, DRAFT, EMPTY, EnvState, Noise
from prada_jax import latency as lat
from prada_jax.sched.registry import RSD_INDEX
from prada_jax.traces.format import TraceSet

_MAX_ARRIVALS = 64  # truncation of the per-slot Poisson arrival count


def poisson_from_uniform(u, rate, max_count: int = _MAX_ARRIVALS):
    """Poisson(``rate``) count from one uniform ``u`` in [0, 1) by inverse CDF over
    ``0..max_count`` (int32). Cheaper to compile and run than ``jax.random.poisson`` (no rejection
    loop). Counts above ``max_count`` are truncated to it; with the default 64 that has
    probability < 1e-40 at 2 arrivals per slot (far beyond any U ≤ 64 env's capacity anyway)."""
    k = jnp.arange(max_count + 1, dtype=jnp.float32)
    log_pmf = k * jnp.log(jnp.maximum(rate, 1e-30)) - rate - jax.lax.lgamma(k + 1.0)
    cdf = jnp.cumsum(jnp.exp(log_pmf))
    n = jnp.sum((cdf < u).astype(jnp.int32))
    return jnp.where(rate > 0, jnp.minimum(n, max_count), 0).astype(jnp.int32)


def poisson_inverse_cdf(key, rate, max_count: int = _MAX_ARRIVALS):
    """Poisson(``rate``) sample (int32 scalar) from ``key``; see ``poisson_from_uniform``."""
    return poisson_from_uniform(jax.random.uniform(key, (), jnp.float32), rate, max_count)


def draw_noise(key, params: EnvParams) -> Noise:
    """All randomness of one slot from one key: 3·U + 1 uniforms in a single draw: the arrival
    uniform (``step`` maps it to a count at the slot's rate), the problems of new users
    (uniform over the trace set), Rayleigh power gains (Exp(1) = −log(1 − u)) and the
    scheduler's uniforms."""
    u = params.num_users
    n_problems = params.traces.root.shape[0]
    x = jax.random.uniform(key, (3 * u + 1,), jnp.float32)
    problem = jnp.minimum((x[1:u + 1] * n_problems).astype(jnp.int32), n_problems - 1)
    return Noise(
        u_arrival=x[0],
        problem=problem,
        fading=-jnp.log1p(-x[u + 1:2 * u + 1]),
        u_sched=x[2 * u + 1:])



def start_draft(params: EnvParams, node, edge_cached, rsd_on):
    """Draft delay (s), its slots, and the SLM cache after drafting, for a user at ``node``
    (``llm_only``: no draft, 0 s and 0 slots)."""
    tr = params.traces
    ctx = tr.ctx_tokens[node]
    dtok = tr.cand_tokens[node, 0]
    cached = jnp.minimum(edge_cached, ctx)
    delay = lat.draft_delay_s(params.latency, ctx - cached, cached, dtok)
    if not server_of(params).scores_on_server:   # else the PRM runs as a server job
        delay = delay + jnp.where(rsd_on, lat.prm_delay_s(params.latency, ctx + dtok), 0.0)
    delay = jnp.where(params.llm_only, 0.0, delay)
    slots = jnp.where(params.llm_only, 0, phase_slots(delay, params.tau_s))
    return delay, slots, ctx + dtok


def successor(tr: TraceSet, node, branch):
    """(next node, terminal, correct, used fallback) of taking candidate ``branch`` at ``node``."""
    child = tr.child[node, branch]
    term = tr.terminal[node, branch].astype(bool)
    used_fb = ~term & (child < 0)
    nxt = jnp.where(term, node, jnp.where(child >= 0, child, tr.fallback[node]))
    return nxt, term, tr.correct[node, branch].astype(bool), used_fb



def observe(state: EnvState, params: EnvParams):
    tr = params.traces
    n = state.node
    obs = jnp.concatenate([tr.feat[n].astype(jnp.float32),
                           tr.depth[n].astype(jnp.float32)[:, None],
                           (tr.ctx_tokens[n].astype(jnp.float32) * params.ctx_scale)[:, None]],
                          axis=-1)
    return jnp.where(state.active[:, None], obs, 0.0)


def admit(state: EnvState, params: EnvParams, n_arrivals, problem, slot, draft=True):
    """Places up to ``n_arrivals`` new users into EMPTY slots (index order), starting at ``slot``.

    Returns ``(state, blocked, admit [U] bool)``. With ``draft=False`` the first draft's delay,
    slots and SLM cache are left for the caller to fill (``envs.slot`` computes every draft that
    starts in a slot in one pass).
    """
    free = state.phase == EMPTY
    rank = jnp.cumsum(free.astype(jnp.int32)) - 1
    admit = free & (rank < n_arrivals)
    n_admit = jnp.sum(admit.astype(jnp.int32))
    root = params.traces.root[problem]
    if draft:
        rsd_on = params.scheduler == RSD_INDEX
        d_s, d_slots, cache = start_draft(params, root, jnp.zeros_like(root), rsd_on)
    else:
        d_s, d_slots, cache = state.draft_s, state.remaining, state.edge_cached
    zf = jnp.zeros_like(state.proc_s)
    zi = jnp.zeros_like(state.offloads)
    w = lambda new, old: jnp.where(admit, new, old)  # noqa: E731
    # llm_only: no draft, the user decides at once.
    first = jnp.where(d_slots <= 0, DECIDE, DRAFT) if draft else DRAFT
    state = state.replace(
        phase=w(first, state.phase), node=w(root, state.node),
        remaining=w(d_slots, state.remaining),
        wait=w(zi, state.wait), gain=w(zf, state.gain), draft_s=w(d_s, state.draft_s),
        svc_bw_hz=w(zf, state.svc_bw_hz), svc_comm_frac=w(zf, state.svc_comm_frac),
        edge_cached=w(cache, state.edge_cached), server_cached=w(zi, state.server_cached),
        arrival_slot=w(jnp.full_like(zi, slot), state.arrival_slot),
        proc_s=w(zf, state.proc_s), comm_s=w(zf, state.comm_s), queue_s=w(zf, state.queue_s),
        offloads=w(zi, state.offloads), outages=w(zi, state.outages), steps=w(zi, state.steps),
        fallbacks=w(zi, state.fallbacks),
        prm_cached=None if state.prm_cached is None else w(zi, state.prm_cached),
        cache_used=None if state.cache_used is None else w(zi, state.cache_used),
        arrived=state.arrived + n_arrivals, blocked=state.blocked + n_arrivals - n_admit)
    return state, n_arrivals - n_admit, admit

