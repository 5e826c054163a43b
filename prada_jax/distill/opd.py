"""Online on-policy distillation (OPD): the student plays whole task episodes with the tool, the
teacher scores every student turn, and the rows feed the same reverse-KL step as ReOPD.

One OPD round (:func:`opd_round`, host side) for one student:

1. **rollout**: ``episodes`` problems of the pool (the questions the teacher's pool was recorded
   on) are played by the student with the task's tool: at every agent turn the student samples
   its action (``prada_jax.lm.sampling.generate`` at ``temperature`` / ``top_p``, static shapes
   [episodes, context_len]), the tool answers it (``tool_delay_s`` seconds of simulated latency
   per turn round with a call: a round's calls run concurrently), until an answer, a malformed action or the task's turn cap;
2. **scoring**: the teacher scores each whole episode once, teacher-forced (the exporter's
   contract, :func:`prada_jax.distill.scoring.score_sequences`); the log-prob of every student
   action token is read off it;
3. every student turn t of every episode becomes one row in the layout of
   :mod:`prada_jax.distill.sampler` — prompt = the episode before the turn (its last
   ``context_len`` tokens, left-padded), action = the student's turn tokens — so the jitted
   on-policy step of :mod:`prada_jax.distill.learner` applies unchanged: per-token reverse KL
   ``log π_S(y) − log π_T(y)`` as a policy-gradient advantage, mean over all supervised tokens.

The batch has a static ``episodes × max_turns`` rows (one compile); rows past the real turns
carry no loss. :class:`RoundStats` counts what the round cost: supervised turns, student tokens
generated, teacher tokens scored (and forwarded), tool calls, and the wall time of rollout and
scoring (the trainer adds the update's).
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Callable, Sequence

import numpy as np
from flax import nnx

from prada_jax.lm.sampling import contexts_generate_fn

# per-update cost counters of every on-policy / OPD / offline update (trainer: ``cost/*``)
COUNTS = ("supervised_turns", "student_tokens", "teacher_tokens_scored",
          "teacher_tokens_forwarded", "tool_calls", "episodes")
TIMES = ("rollout_s", "scoring_s", "update_s")


@dataclasses.dataclass
class RoundStats:
    """What one batch cost. Counts are integers; times are wall-clock seconds.

    ``supervised_turns``: rows with at least one supervised token; ``student_tokens``: tokens the
    student generated; ``teacher_tokens_scored``: student tokens whose teacher log-prob enters
    the loss; ``teacher_tokens_forwarded``: tokens the teacher ran a forward pass over
    (prefixes included); ``tool_calls``: environment calls; ``episodes``: OPD episodes played;
    ``tool_turn_mask``: bit t set iff some episode called the tool at agent turn t (OR-ed over
    the seeds of an update: tool calls of one turn can run concurrently across episodes and
    seeds); ``tool_rounds``: the number of such turn rounds (per update: the set bits of each
    micro-step's mask, summed; the fair clock charges the tool latency once per round,
    ``studies.reopd_kg.fairclock``);
    ``rollout_s``: student generation + tool calls (offline: building the batch);
    ``scoring_s``: the teacher's scoring; ``update_s``: the jitted step (set by the trainer).
    """

    supervised_turns: int = 0
    student_tokens: int = 0
    teacher_tokens_scored: int = 0
    teacher_tokens_forwarded: int = 0
    tool_calls: int = 0
    episodes: int = 0
    tool_turn_mask: int = 0
    tool_rounds: int = 0
    rollout_s: float = 0.0
    scoring_s: float = 0.0
    update_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def student_generate_fn(graphdef, params, key, *, batch: int, context_len: int,
                        max_new_tokens: int, temperature: float, top_p: float,
                        stop_ids: Sequence[int], pad_id: int) -> Callable:
    """The student as a task agent: ``contexts (list of token lists) -> actions``, sampled at
    static shapes [batch, context_len] (longer contexts keep their last ``context_len`` tokens;
    missing rows are dummies), call c of the function with key ``fold_in(key, c)``."""
    return contexts_generate_fn(
        nnx.merge(graphdef, params), pad_id=pad_id, stop_ids=stop_ids, batch=batch,
        context_len=context_len, max_new_tokens=max_new_tokens, temperature=temperature,
        top_p=top_p, key=key, first_call=0)


def episode_rows(episodes, to_tokens: Callable, scores: list[dict], *, rows: int,
                 context_len: int, action_len: int, pad_id: int) -> tuple[dict, RoundStats]:
    """Rows of the on-policy step from played episodes and their teacher scores.

    Args:
      episodes: ``EpisodeResult`` list (messages of each episode).
      to_tokens: the task's ``messages -> (tokens, agent-turn spans)``.
      scores: one teacher score dict per episode over its full tokens (row i predicts token
        i + 1: ``logp_actual`` [L-1], ``topk_ids`` / ``topk_logp`` [L-1, k], ``tail_mass``).
      rows: static number of rows R (>= the episodes' turns); context_len: prompt width P;
        action_len: action width A (>= the longest turn).

    Returns:
      (batch for ``train_step``: prompt [R, P], prompt_mask, action [R, A], action_valid,
      action_mask, turn [R], teacher_logp [R, A], topk_ids [R, A, k], topk_logp, tail_mass
      [R, A]; stats with the counts filled in).
    """
    k = int(np.asarray(scores[0]["topk_ids"]).shape[-1]) if scores else 1
    P, A = context_len, action_len
    prompt = np.full((rows, P), pad_id, np.int32)
    pmask = np.zeros((rows, P), np.int32)
    prompt[:, -1], pmask[:, -1] = pad_id, 1        # padding rows: one real token, no loss
    action = np.full((rows, A), pad_id, np.int32)
    valid = np.zeros((rows, A), np.int32)
    turn = np.zeros((rows,), np.int32)
    tlogp = np.zeros((rows, A), np.float32)
    ids = np.zeros((rows, A, k), np.int32)
    tlp = np.full((rows, A, k), -1e4, np.float32)
    tail = np.ones((rows, A), np.float32)
    st = RoundStats(episodes=len(episodes))
    r = 0
    for ep, sc in zip(episodes, scores):
        toks, spans = to_tokens(ep.messages)
        st.teacher_tokens_forwarded += len(toks)
        for t, (a, e) in enumerate(spans):
            g = e - a
            if g > A:
                raise ValueError(f"an agent turn of {g} tokens is longer than action_len {A}")
            if r >= rows:
                raise ValueError(f"the episodes hold more than {rows} agent turns")
            ctx = toks[max(0, a - P):a]
            prompt[r, P - len(ctx):] = ctx
            pmask[r, :] = 0
            pmask[r, P - len(ctx):] = 1
            action[r, :g] = toks[a:e]
            valid[r, :g] = 1
            turn[r] = t
            sl = slice(a - 1, e - 1)      # entry i predicts token i + 1
            tlogp[r, :g] = sc["logp_actual"][sl]
            ids[r, :g] = sc["topk_ids"][sl]
            tlp[r, :g] = sc["topk_logp"][sl]
            tail[r, :g] = np.clip(sc["tail_mass"][sl], 0.0, 1.0)
            st.supervised_turns += int(g > 0)
            st.student_tokens += g
            st.teacher_tokens_scored += g
            r += 1
    batch = dict(prompt=prompt, prompt_mask=pmask, action=action, action_valid=valid,
                 action_mask=valid.copy(), turn=turn, teacher_logp=tlogp, topk_ids=ids,
                 topk_logp=tlp, tail_mass=tail)
    return batch, st


def opd_round(task, problems, generate_fn: Callable, teacher_score_fn: Callable, *,
              rows: int, context_len: int, action_len: int, tool_delay_s: float = 0.0
              ) -> tuple[dict, RoundStats, list]:
    """One OPD round: the agent ``generate_fn`` (the student) plays ``problems`` with the task's
    tool, the teacher scores the episodes, the rows are built (:func:`episode_rows`).

    Returns (batch, stats, episodes); ``stats.tool_calls`` is the task's tool-call counter's
    increase during the rollout."""
    calls0 = task.tool_calls()
    t0 = time.perf_counter()
    episodes = task.run_episodes(problems, generate_fn, task.max_turns, tool_delay_s=tool_delay_s)
    t1 = time.perf_counter()
    calls = task.tool_calls() - calls0
    seqs = [task.to_tokens(ep.messages)[0] for ep in episodes]
    scores = teacher_score_fn(seqs)
    t2 = time.perf_counter()
    batch, st = episode_rows(episodes, task.to_tokens, scores, rows=rows,
                             context_len=context_len, action_len=action_len,
                             pad_id=task.pad_id)
    st.tool_calls, st.rollout_s, st.scoring_s = int(calls), t1 - t0, t2 - t1
    st.tool_turn_mask = tool_turn_mask(episodes)
    st.tool_rounds = bin(st.tool_turn_mask).count("1")
    return batch, st, episodes


def tool_turn_mask(episodes) -> int:
    """Bit t set iff some episode's agent turn t (from 0) was answered by the tool (an
    assistant message followed by a tool message)."""
    mask = 0
    for ep in episodes:
        t = 0
        msgs = ep.messages
        for j, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            if j + 1 < len(msgs) and msgs[j + 1]["role"] == "tool":
                mask |= 1 << t
            t += 1
    return mask


def cost_summary(costs: list[dict]) -> dict:
    """``results.json["cost"]`` of a run from its per-update cost records (each a
    :class:`RoundStats` dict summed over seeds and micro-steps, plus ``timed``: False for an
    update whose times include compilation, e.g. the first of a process).

    Returns ``totals`` (every count summed over all updates), ``<time>_per_turn`` [s per
    supervised turn] and ``<time>_median`` [s per update] over the timed updates (None when
    there are none), and ``per_update`` (the records)."""
    out: dict = {"updates": len(costs), "totals": {f: int(sum(c[f] for c in costs))
                                                   for f in COUNTS}}
    timed = [c for c in costs if c.get("timed")]
    out["timed_updates"] = len(timed)
    turns = sum(c["supervised_turns"] for c in timed)
    for f in TIMES:
        out[f"{f}_per_turn"] = (sum(c[f] for c in timed) / turns) if turns else None
        out[f"{f}_median"] = float(np.median([c[f] for c in timed])) if timed else None
    out["per_update"] = [dict(c) for c in costs]
    return out


def cost_scalars(costs: list[dict], total: list[dict]) -> dict:
    """TensorBoard ``cost/*`` scalars: the mean per update of every count and time over
    ``costs`` (the updates since the last log) and the running totals ``cost/total_<count>``
    over ``total`` (every update so far)."""
    out = {}
    if costs:
        for f in COUNTS + TIMES:
            out[f"cost/{f}"] = float(np.mean([c[f] for c in costs]))
    for f in COUNTS:
        out[f"cost/total_{f}"] = float(sum(c[f] for c in total))
    return out


def untimed_results(res: dict) -> dict:
    """A copy of a ``results.json`` dict without its wall-clock fields, which differ between
    processes (for comparing a resumed run with an uninterrupted one): ``update_s_median`` and,
    in ``cost``, every time, ``timed_updates`` and the per-update ``timed`` flags."""
    res = json.loads(json.dumps(res))
    for r in [res] + list(res.get("per_seed", [])):
        r.pop("update_s_median", None)
        cost = r.get("cost")
        if cost:
            for k in [k for k in cost if k.endswith(("_per_turn", "_median"))]:
                cost.pop(k)
            cost.pop("timed_updates", None)
            for u in cost["per_update"]:
                for k in TIMES + ("timed",):
                    u.pop(k, None)
    return res
