"""The task interface the distillation trainer is given, and a registry of tasks by name.

The trainer (:mod:`prada_jax.distill.trainer`) imports no task: everything task-specific reaches
it through a :class:`Task`, looked up by the pool's ``meta["task"]`` name (:func:`for_pool`)
or passed in by the caller. A task bundles

* its token ids the trainer needs (``pad_id``, ``eos_id``, ``stop_ids`` ending an agent turn),
* ``build_tokenizer()`` (saved next to the student's Hugging Face folder),
* ``tool_calls()`` — the environment's call counter in this process (the trainer logs its
  increase over training steps as ``distill/env_calls``; it must stay 0),
* ``build_pool(teacher_model, out_dir, n, seed)`` — records teacher trajectories as a pool,
* ``teacher_scorer(teacher_dir, top_k)`` — a function ``list[list[int]] -> list[dict]`` with the
  exporter's contract (:func:`prada_jax.distill.scoring.score_sequences`), for on-policy mode,
* ``evaluate(model, n_problems, seed, batch)`` — runs the task with its tool on a Flax model and
  returns ``{"success_rate", "ci95", "n", "tool_calls", "mean_turns"}``; ``None`` when the task
  has no evaluator (the trainer then records no success rate),
* for online OPD (``config.mode = "opd"``, :mod:`prada_jax.distill.opd`): ``pool_problems(pool)``
  — the problems of the pool's trajectories, in pool order (the episodes start from the same
  questions the teacher's pool holds), ``run_episodes(problems, generate_fn, tool_delay_s=0)``
  — episodes with the task's tool (``EpisodeResult`` list,
  :func:`prada_jax.distill.task.common.run_episodes`), ``to_tokens(messages)`` — tokens and
  agent-turn spans of an episode, and ``max_turns``, the agent-turn cap of an episode. A task
  without them (``None``) cannot run OPD.

A pool of an unregistered task gets :func:`generic_task` (no evaluator, no stop ids, teacher
scoring by the shared exporter path), so the trainer still runs on converted chat-JSONL pools.
"""
from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from prada_jax.distill.scoring import load_teacher, score_sequences
from prada_jax.errors import BadInput


class Task(NamedTuple):
    """What the trainer needs from a task (see the module docstring)."""

    name: str
    pad_id: int
    eos_id: int
    stop_ids: tuple[int, ...]
    build_tokenizer: Optional[Callable[[], Any]]
    tool_calls: Callable[[], int]
    build_pool: Optional[Callable[..., Any]]
    teacher_scorer: Callable[[Any, int], Callable]
    evaluate: Optional[Callable[..., dict]]
    pool_problems: Optional[Callable[[Any], list]] = None
    run_episodes: Optional[Callable[..., list]] = None
    to_tokens: Optional[Callable[[Any], tuple]] = None
    max_turns: int = 0


def pool_questions(pool) -> list[list[int]]:
    """The tokens before the first agent turn of every pool trajectory (the user's question)."""
    toks = np.asarray(pool.tokens)
    offs, toffs = np.asarray(pool.traj_offsets), np.asarray(pool.turn_offsets)
    starts = np.asarray(pool.turn_starts)
    out = []
    for i in range(len(offs) - 1):
        end = int(starts[toffs[i]]) if toffs[i + 1] > toffs[i] else int(offs[i + 1])
        out.append(toks[int(offs[i]):end].tolist())
    return out


def _arith_pool_problems(pool) -> list:
    """Arithmetic problems parsed from the pool's questions (``<q>12*7+5</q>``)."""
    from prada_jax.distill.task import arith  # lazy: the trainer loads no task module; a task's module loads when a pool names it
    out = []
    for i, q in enumerate(pool_questions(pool)):
        m = re.fullmatch(r"<q>([0-9]+(?:[+\-*][0-9]+)*)</q>", arith.decode(q))
        if m is None:
            raise BadInput(f"pool trajectory {i}: question {arith.decode(q)!r} is not an "
                           "arithmetic problem")
        parts = re.split(r"([+\-*])", m.group(1))
        out.append(arith.Problem(tuple(int(x) for x in parts[0::2]), tuple(parts[1::2])))
    return out


def _kg_pool_problems(pool) -> list:
    """The kg problems of a pool recorded by ``build_pool`` (their hidden graphs are not in the
    tokens): regenerated from the recorder's seed and checked question by question."""
    from prada_jax.distill.task import kg  # lazy: the trainer loads no task module; a task's module loads when a pool names it
    qs = pool_questions(pool)
    seed = (pool.meta.get("source") or {}).get("seed")
    if seed is None:
        raise BadInput("config.mode=opd: the kg pool records no source seed; its problems (and "
                       "their hidden graphs) cannot be rebuilt")
    probs = kg.make_problems(int(seed) * 1000 + 2, len(qs))
    for i, (p, q) in enumerate(zip(probs, qs)):
        if kg.encode(p.question) != q:
            raise BadInput(f"config.mode=opd: kg pool trajectory {i} does not match the problem "
                           f"its recorder's seed {seed} draws")
    return probs


def hf_teacher_scorer(teacher_dir, top_k: int) -> Callable:
    """Loads a Hugging Face teacher folder once; returns ``seqs -> score dicts`` (the one
    teacher-scoring path, :func:`prada_jax.distill.scoring.score_sequences`)."""
    model = load_teacher(teacher_dir)
    return lambda seqs: score_sequences(model, seqs, top_k)


def _arith() -> Task:
    from prada_jax.distill.task import arith  # lazy: the trainer loads no task module; a task's module loads when a pool names it

    def evaluate(model, n_problems: int, seed: int, batch: int) -> dict:
        from prada_jax.distill.task.evaluate import evaluate_model  # lazy: the trainer loads no task module; a task's module loads when a pool names it
        problems = arith.make_problems(seed * 1000 + 3, n_problems, split="eval")
        return evaluate_model(model, problems, batch=batch)

    def build_pool(teacher_model, out_dir, n: int, seed: int, **kw):
        from prada_jax.distill.task.teacher import record_pool  # lazy: the trainer loads no task module; a task's module loads when a pool names it
        problems = arith.make_problems(seed * 1000 + 2, n, split="train")
        return record_pool(teacher_model, problems, out_dir, seed=seed, **kw)

    return Task(name=arith.TASK_NAME, pad_id=arith.PAD_ID, eos_id=arith.EOS_ID,
                stop_ids=tuple(arith.STOP_IDS), build_tokenizer=arith.build_tokenizer,
                tool_calls=lambda: arith.TOOL_CALLS.calls, build_pool=build_pool,
                teacher_scorer=hf_teacher_scorer, evaluate=evaluate,
                pool_problems=_arith_pool_problems, run_episodes=arith.run_episodes,
                to_tokens=arith.messages_to_tokens, max_turns=6)


def _kg() -> Task:
    from prada_jax.distill.task import kg  # lazy: the trainer loads no task module; a task's module loads when a pool names it

    def evaluate(model, n_problems: int, seed: int, batch: int) -> dict:
        return kg.evaluate_model(model, kg.make_problems(seed * 1000 + 3, n_problems),
                                 batch=batch)

    def build_pool(teacher_model, out_dir, n: int, seed: int, **kw):
        from prada_jax.distill.task.kg_teacher import record_pool  # lazy: the trainer loads no task module; a task's module loads when a pool names it
        return record_pool(teacher_model, kg.make_problems(seed * 1000 + 2, n), out_dir,
                           seed=seed, **kw)

    return Task(name=kg.TASK_NAME, pad_id=kg.PAD_ID, eos_id=kg.EOS_ID,
                stop_ids=tuple(kg.STOP_IDS), build_tokenizer=kg.build_tokenizer,
                tool_calls=lambda: kg.TOOL_CALLS.calls, build_pool=build_pool,
                teacher_scorer=hf_teacher_scorer, evaluate=evaluate,
                pool_problems=_kg_pool_problems, run_episodes=kg.run_episodes,
                to_tokens=kg.messages_to_tokens, max_turns=kg.MAX_TURNS)


def _kg_short() -> Task:
    """``kg_short_v1`` (issue 44): the kg task with 0-2 hops per chain, turn cap 10."""
    from prada_jax.distill.task import kg, kg_short  # lazy: a task's module loads with its pools

    def evaluate(model, n_problems: int, seed: int, batch: int) -> dict:
        return kg_short.evaluate_model(model, kg_short.make_problems(seed * 1000 + 3, n_problems),
                                       batch=batch)

    def build_pool(teacher_model, out_dir, n: int, seed: int, **kw):
        return kg_short.record_pool(teacher_model, kg_short.make_problems(seed * 1000 + 2, n),
                                    out_dir, seed=seed, **kw)

    def pool_problems(pool) -> list:
        qs = pool_questions(pool)
        seed = (pool.meta.get("source") or {}).get("seed")
        if seed is None:
            raise BadInput("config.mode=opd: the kg_short pool records no source seed; its "
                           "problems (and their hidden graphs) cannot be rebuilt")
        probs = kg_short.make_problems(int(seed) * 1000 + 2, len(qs))
        for i, (p, q) in enumerate(zip(probs, qs)):
            if kg.encode(p.question) != q:
                raise BadInput(f"config.mode=opd: kg_short pool trajectory {i} does not match "
                               f"the problem its recorder's seed {seed} draws")
        return probs

    return Task(name=kg_short.TASK_NAME, pad_id=kg.PAD_ID, eos_id=kg.EOS_ID,
                stop_ids=tuple(kg.STOP_IDS), build_tokenizer=kg_short.build_tokenizer,
                tool_calls=lambda: kg.TOOL_CALLS.calls, build_pool=build_pool,
                teacher_scorer=hf_teacher_scorer, evaluate=evaluate,
                pool_problems=pool_problems, run_episodes=kg_short.run_episodes,
                to_tokens=kg.messages_to_tokens, max_turns=kg_short.MAX_TURNS)


_FACTORIES: dict[str, Callable[[], Task]] = {"arith_calc_v1": _arith, "kg_lookup_v1": _kg,
                                             "kg_short_v1": _kg_short}


def register(name: str, factory: Callable[[], Task]) -> None:
    """Adds a task factory under ``name`` (the ``task`` field its pools record)."""
    _FACTORIES[name] = factory


def names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def get(name: str) -> Task:
    """The registered task ``name``; :class:`~prada_jax.errors.BadInput` naming the choices."""
    if name not in _FACTORIES:
        raise BadInput(f"unknown distillation task {name!r}; registered: {sorted(_FACTORIES)}")
    return _FACTORIES[name]()


def generic_task(name: str = "generic") -> Task:
    """A task known only by its pool: no evaluator, no stop ids, pad/eos id 0/1."""
    return Task(name=name, pad_id=0, eos_id=1, stop_ids=(), build_tokenizer=None,
                tool_calls=lambda: 0, build_pool=None, teacher_scorer=hf_teacher_scorer,
                evaluate=None)


def for_pool(pool_meta: dict) -> Task:
    """The registered task a pool was recorded for, else :func:`generic_task`."""
    name = str(pool_meta.get("task", ""))
    return get(name) if name in _FACTORIES else generic_task(name or "generic")
