"""How one micro-step's batch of supervised rows is drawn, for one seed's student.

Three sources (``config.mode``):

* ``offline``: (trajectory, turn) pairs of the pool drawn with the sampler's κ^t (or adaptive)
  weights, the teacher's recorded turn-t tokens as the action and its exported top-k log-probs
  gathered from the teacher table;
* ``onpolicy`` (ReOPD): the same pairs, the student samples turn t after the replayed teacher
  prefix and the teacher scores the sampled tokens;
* ``opd``: ``opd.episodes`` pool problems played whole by the student with the task's tool,
  every student turn scored by the teacher.

Determinism: micro-step ``s`` of seed ``seed`` draws with ``np.random.default_rng([seed, s])``
and samples with ``fold_in(key(seed), s)``, so a resumed run continues the same sequence and
seed i of a multi-seed run draws what a separate run with that seed draws. Nothing here
touches the run's counters: :func:`draw` returns the rows, their trained-token count, what they
cost and the sampled-turn counts, and the trainer adds them up.
"""
from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import numpy as np

from prada_jax.distill import opd as opd_lib
from prada_jax.distill.learner import onpolicy_round


class Drawn(NamedTuple):
    """One seed's micro-batch: ``batch`` (numpy arrays, the jitted step's input), ``tokens``
    (trained action tokens), ``stats`` (:class:`prada_jax.distill.opd.RoundStats`: what drawing
    it cost) and ``turn_counts`` [num_turns] (rows per agent turn, for the histogram)."""

    batch: dict
    tokens: int
    stats: Any
    turn_counts: np.ndarray


def bucket_width(longest: int, width: int, bucket: int) -> int:
    """Prompt width of a batch whose longest prefix has ``longest`` tokens: the next multiple
    of ``bucket`` (at least one bucket), at most the full ``width``; ``bucket`` = 0: ``width``."""
    if bucket <= 0:
        return int(width)
    return int(min(width, max(bucket, -(-int(longest) // bucket) * bucket)))


def bucketed(tb, bucket: int):
    """A :class:`~prada_jax.distill.sampler.TurnBatch` with its left-padded prompt cut to
    :func:`bucket_width` of its longest prefix (only padding columns are dropped: positions come
    from the mask, so the step computes the same numbers up to float reassociation)."""
    w = bucket_width(int(tb.prompt_mask.sum(1).max()), tb.prompt.shape[1], bucket)
    if w == tb.prompt.shape[1]:
        return tb
    return tb.replace(prompt=tb.prompt[:, -w:], prompt_mask=tb.prompt_mask[:, -w:])


def widen(batch: dict, width: int) -> dict:
    """``batch`` with prompt / prompt_mask left-padded (zeros) to ``width`` columns."""
    p = batch["prompt"].shape[1]
    if p == width:
        return batch
    pad = ((0, 0), (width - p, 0))
    return dict(batch, prompt=np.pad(batch["prompt"], pad),
                prompt_mask=np.pad(batch["prompt_mask"], pad))


def stack_seeds(batches: list[dict]) -> dict:
    """Per-seed batches stacked on a leading seed axis ``[N, B, ...]`` (bucketed prompts padded
    to the seeds' widest)."""
    w = max(b["prompt"].shape[1] for b in batches)
    parts = [widen(b, w) for b in batches]
    return {k: np.stack([b[k] for b in parts]) for k in parts[0]}


def opd_rows(config, task) -> int:
    """Static row count of an OPD batch: ``opd.episodes`` × the task's agent-turn cap."""
    return int(config.opd.episodes) * int(task.max_turns)


def prefix(pool, sampler, k, cache: dict) -> list[int]:
    """The replayed teacher prefix of pair ``k`` (at most the sampler's prompt width ``P``
    tokens of its trajectory before turn t), memoised in ``cache``."""
    k = int(k)
    if k not in cache:
        s = int(pool.turn_starts[k])
        a = max(int(pool.traj_offsets[sampler.pair_traj[k]]), s - sampler.P)
        cache[k] = np.asarray(pool.tokens[a:s]).tolist()
    return cache[k]


def opd_batch(setup, params, seed: int, s: int, tool_delay_s: float | None = None) -> Drawn:
    """Micro-step ``s``'s OPD batch of the student ``params`` of seed ``seed``: ``opd.episodes``
    pool problems drawn with ``default_rng([seed, s])``, played by the student (sampling key
    ``fold_in(key(seed), s)``), scored by the teacher. ``tool_delay_s``: the simulated wait per
    turn round with a call (None: ``opd.tool_latency_s``; the trainer passes 0 when N > 1
    seeds and waits once per round merged across the seeds itself)."""
    config, task = setup.config, setup.task
    rng = np.random.default_rng([seed, s])
    idx = rng.integers(0, len(setup.problems), size=int(config.opd.episodes))
    gen = opd_lib.student_generate_fn(
        setup.graphdef, params, jax.random.fold_in(jax.random.key(seed), s),
        batch=int(config.opd.episodes), context_len=int(config.opd.context_len),
        max_new_tokens=config.onpolicy.max_new_tokens, temperature=config.onpolicy.temperature,
        top_p=config.onpolicy.top_p, stop_ids=task.stop_ids, pad_id=task.pad_id)
    batch, st, _ = opd_lib.opd_round(
        task, [setup.problems[j] for j in idx], gen, setup.teacher_score_fn,
        rows=opd_rows(config, task), context_len=int(config.opd.context_len),
        action_len=int(config.onpolicy.max_new_tokens),
        tool_delay_s=float(config.opd.tool_latency_s if tool_delay_s is None
                           else tool_delay_s))
    has = batch["action_mask"].sum(-1) > 0
    counts = np.bincount(batch["turn"][has], minlength=setup.num_turns)[:setup.num_turns]
    return Drawn(batch, st.student_tokens, st, counts)


def draw(setup, sampler, params, seed: int, s: int, prompts_cache: dict,
         tool_delay_s: float | None = None) -> Drawn:
    """Micro-step ``s``'s batch for the student ``params`` of seed ``seed`` (what a separate
    run with ``config.seed = seed`` draws; offline rows do not read ``params``, which may be
    None there); ``sampler`` is that seed's
    :class:`~prada_jax.distill.sampler.TurnSampler` (its schedule state in force);
    ``tool_delay_s``: OPD's simulated tool wait override (:func:`opd_batch`)."""
    if setup.config.mode == "opd":
        return opd_batch(setup, params, seed, s, tool_delay_s)
    t0 = time.perf_counter()
    config, task = setup.config, setup.task
    rng = np.random.default_rng([seed, s])
    pairs = sampler.draw(rng, config.train.batch_size)
    tb = bucketed(sampler.batch(pairs), int(config.train.prompt_bucket))
    counts = np.bincount(tb.turn, minlength=setup.num_turns)
    if config.mode == "onpolicy":
        prompts = [prefix(setup.pool, sampler, k, prompts_cache) for k in pairs]
        batch, n, st = onpolicy_round(
            setup.graphdef, params, jax.random.fold_in(jax.random.key(seed), s), tb,
            setup.teacher_score_fn, max_new_tokens=config.onpolicy.max_new_tokens,
            temperature=config.onpolicy.temperature, top_p=config.onpolicy.top_p,
            stop_ids=task.stop_ids, pad_id=task.pad_id, prompt_tokens=prompts)
        return Drawn(batch, n, st, counts)
    batch = dict(prompt=tb.prompt, prompt_mask=tb.prompt_mask, action=tb.action,
                 action_valid=(tb.action_pos >= 0).astype(np.int32),
                 action_mask=tb.action_mask, turn=tb.turn)
    g = setup.table.gather(tb.action_pos)
    batch.update(topk_ids=g["topk_ids"], topk_logp=g["topk_logp"], tail_mass=g["tail_mass"])
    n = int(tb.action_mask.sum())
    st = opd_lib.RoundStats(supervised_turns=int(np.sum(tb.action_mask.sum(-1) > 0)),
                            rollout_s=time.perf_counter() - t0)
    return Drawn(batch, n, st, counts)
