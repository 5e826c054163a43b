"""One optimiser update of every seed's student, run from the host.

:func:`optimizer_update` draws each seed's batch for every micro-step
(:func:`prada_jax.distill.batches.draw`), stacks the seeds' batches (N > 1) and shards them over
the mesh, calls the jitted (seed-vmapped when N > 1) step, and returns the new train state with
a new :class:`~prada_jax.distill.host_state.HostState` holding the metrics, sampled-turn
histograms, tokens, tool calls, time and the update's cost record (:data:`opd.COUNTS` and
:data:`opd.TIMES` summed over seeds and micro-steps).

With N > 1 seeds the seeds' OPD rollouts run one after another on the host, but their tool calls
of one turn round are concurrent (the count ``tool_rounds`` prices): each seed's rollout waits
for nothing and the update waits once per merged round.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from prada_jax import parallel
from prada_jax.distill import opd as opd_lib
from prada_jax.distill.batches import Drawn, draw, stack_seeds
from prada_jax.distill.host_state import HostState
from prada_jax.lm.sampling import _generate_jit


def compilations(setup) -> int:
    """Programs compiled so far by the jitted step and the student's generation."""
    return int(setup.step_fn._cache_size()) + int(_generate_jit._cache_size())


def _draw_seeds(setup, rec, params, s: int, hist: np.ndarray, merged_wait: float,
                cost) -> list[Drawn]:
    """Micro-step ``s``'s batch of every seed (``params``: the current, seed-stacked when
    N > 1, parameters); adds the turn counts to ``hist`` and the costs to ``cost``, and waits
    ``merged_wait`` once per tool round merged across the seeds."""
    got: list[Drawn] = []
    for i, seed in enumerate(setup.seeds):
        # the student's parameters only where it samples (offline rows need none)
        p = None if setup.config.mode == "offline" else setup.params_of(params, i)
        d = draw(setup, rec.samplers[i], p, seed, s, rec.prompts,
                 tool_delay_s=0.0 if merged_wait else None)
        hist[i] += d.turn_counts
        got.append(d)
    mask = 0
    for d in got:
        for f in opd_lib.COUNTS + opd_lib.TIMES:
            setattr(cost, f, getattr(cost, f) + getattr(d.stats, f))
        mask |= d.stats.tool_turn_mask
    cost.tool_turn_mask |= mask
    cost.tool_rounds += bin(mask).count("1")   # one round per turn, across seeds
    if merged_wait and mask:
        tw = time.perf_counter()
        time.sleep(merged_wait * bin(mask).count("1"))   # one wait per merged round
        cost.rollout_s += time.perf_counter() - tw
    return got


def _batch_of(setup, got: list[Drawn]) -> dict:
    """The step's input: the seeds' batches stacked (N > 1), split over the mesh's ``batch``
    axis when there is a mesh."""
    batch = stack_seeds([d.batch for d in got]) if setup.stacked else got[0].batch
    if setup.mesh is not None:   # sequences split over the ``batch`` mesh axis
        batch = (parallel.shard_axis(batch, setup.mesh, 1) if setup.stacked
                 else parallel.shard_batch(batch, setup.mesh))
    return batch


def optimizer_update(setup, rec, state, host: HostState, opt_step: int):
    """Update ``opt_step`` (``optim.grad_accum`` micro-steps) of every seed's student from
    ``state`` (``rec``: the run's :class:`~prada_jax.distill.host_state.SeedRecords`, whose
    samplers draw the pairs). Returns ``(state, host)``."""
    grad_accum = int(setup.config.optim.grad_accum)
    hist, acc, tokens_done = host.turn_hist.copy(), dict(host.acc), host.tokens_done
    compiled0 = compilations(setup)
    t0 = time.perf_counter()
    calls0 = setup.task.tool_calls()
    ntok_step = 0
    cost = opd_lib.RoundStats()
    merged_wait = (float(setup.config.opd.tool_latency_s)
                   if setup.config.mode == "opd" and setup.stacked else 0.0)
    for micro in range(grad_accum):
        got = _draw_seeds(setup, rec, state.params, opt_step * grad_accum + micro, hist,
                          merged_wait, cost)
        ntok = sum(d.tokens for d in got)
        batch = _batch_of(setup, got)
        tu = time.perf_counter()
        state, m = setup.step_fn(state, batch)
        m = jax.device_get(m)
        cost.update_s += time.perf_counter() - tu
        for k, v in m.items():
            acc[k] = acc.get(k, 0.0) + np.asarray(v, np.float64)
        acc["n"] = acc.get("n", 0) + 1
        tokens_done += ntok
        ntok_step += ntok
    jax.block_until_ready(state.params)
    env_calls = host.env_calls + setup.task.tool_calls() - calls0
    dt = time.perf_counter() - t0
    # an update that compiled (the first of a process, and the second, whose parameters come
    # out of the step with another sharding annotation) is not timed
    timed = host.calls > 0 and compilations(setup) == compiled0
    return state, host._replace(
        turn_hist=hist, acc=acc, tokens_done=tokens_done, env_calls=env_calls,
        update_times=host.update_times + ((dt,) if timed else ()),
        costs=host.costs + (dict(cost.as_dict(), timed=timed),),
        window=host.window + (((dt, ntok_step),) if timed else ()), calls=host.calls + 1)
