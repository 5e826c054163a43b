"""The short-horizon knowledge-graph task ``kg_short_v1`` and its error-and-recovery teacher data.

The kg task (:mod:`prada_jax.distill.task.kg`: hidden graph, ``lookup`` tool, worked answer,
47-id vocabulary) with **0-2 link hops per chain**: a reference solution has h1 + h2 + 3 =
**3-7 agent turns**, an episode with one error and its recovery 4-8; the turn cap is
:data:`MAX_TURNS`. Problems, tool, success rule and tokens are the kg task's; only the hop range
(and so the problem draws) and the task name differ, so pools of the two never mix.

Error-and-recovery episodes (issue 44, item 2): a teacher trained only on solved episodes never
sees a state with a wrong or rejected call, so its targets on a student's error states are
unreliable. :func:`recovery_messages` builds a solved chat in which, with probability
``inject_rate``, one call turn (drawn uniformly) is preceded by an injected error — a wrong
relation, a wrong entity (both well-formed: the tool answers with a real but wrong reply) or a
malformed call (the tool answers ``<res><err></res>``), one of the three uniformly — and its
tool reply, after which the correct call follows. The injected turn is returned as unsupervised
(:func:`training_episodes` leaves its span out of the loss spans), so a teacher learns to
recover, not to err. Everything is deterministic from the generator.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from prada_jax.distill.task import common, kg, kg_teacher

TASK_NAME = "kg_short_v1"
MIN_HOPS, MAX_HOPS = 0, 2
MAX_TURNS = 10               # an episode still running after this many agent turns fails
ERROR_KINDS = ("relation", "entity", "malformed")


def make_problems(seed: int, n: int) -> list[kg.Problem]:
    """``n`` problems with 0-2 link hops per chain, deterministic from ``seed``."""
    return kg.make_problems(seed, n, MIN_HOPS, MAX_HOPS)


def _calls(p: kg.Problem) -> list[tuple[int, str]]:
    out = []
    for k in (0, 1):
        rels = [kg.LINKS[r] for r in p.paths[k]] + [kg.ATTRS[p.attr[k]]]
        out += list(zip(p.chain_entities(k), rels))
    return out


def wrong_call(entity: int, relation: str, kind: str, rng: np.random.Generator) -> str:
    """An erroneous call payload for the correct call ``(entity, relation)``: ``relation``
    (another relation of the same type: link for a link, the other attribute for an
    attribute), ``entity`` (another entity) or ``malformed`` (two entities, rejected by the
    tool). Entity-first form."""
    e = kg.ENTITIES[entity]
    if kind == "relation":
        pool = kg.LINKS if relation in kg.LINKS else kg.ATTRS
        others = [r for r in pool if r != relation]
        return e + others[int(rng.integers(0, len(others)))]
    if kind == "entity":
        others = [x for x in kg.ENTITIES if x != e]
        return others[int(rng.integers(0, len(others)))] + relation
    if kind == "malformed":
        others = [x for x in kg.ENTITIES if x != e]
        return e + others[int(rng.integers(0, len(others)))]
    raise ValueError(f"error kind must be one of {ERROR_KINDS}, got {kind!r}")


def recovery_messages(p: kg.Problem, rng: np.random.Generator, inject_rate: float
                      ) -> tuple[list[dict], int | None]:
    """A solved chat of ``p`` (call forms drawn 50/50) with, with probability ``inject_rate``,
    one injected error before a uniformly drawn call turn (see the module docstring).

    Returns (messages, the agent-turn index of the injected error or None). The tool replies
    are the tool's own (:func:`kg.lookup`); the tool-call counter is left unchanged."""
    if not 0.0 <= inject_rate <= 1.0:
        raise ValueError(f"inject_rate must lie in [0, 1], got {inject_rate!r}")
    calls0 = kg.TOOL_CALLS.calls
    calls = _calls(p)
    inject = bool(rng.random() < inject_rate)
    at = int(rng.integers(0, len(calls))) if inject else -1
    kind = ERROR_KINDS[int(rng.integers(0, len(ERROR_KINDS)))] if inject else None
    msgs = [{"role": "user", "content": p.question}]
    turn, bad_turn = 0, None
    for j, (e, r) in enumerate(calls):
        if j == at:
            payload = wrong_call(e, r, kind, rng)
            msgs += [{"role": "assistant", "content": f"<call>{payload}</call>"},
                     {"role": "tool", "content": kg.lookup(p, payload)}]
            bad_turn = turn
            turn += 1
        act = kg.call_text(e, r, bool(rng.integers(0, 2)))
        msgs += [{"role": "assistant", "content": act},
                 {"role": "tool", "content": kg.lookup(p, act[6:-7])}]
        turn += 1
    msgs.append({"role": "assistant", "content": kg.answer_text(p)})
    kg.TOOL_CALLS.calls = calls0
    return msgs, bad_turn


def training_episodes(seed: int, n: int, inject_rate: float
                      ) -> tuple[list[list[int]], list[list[tuple[int, int]]], dict]:
    """``n`` teacher-training episodes of ``make_problems(seed, n)`` (generator seeded by
    ``seed``): tokens, the agent-turn spans that carry loss (every turn but an injected error)
    and counts ``{"episodes", "injected", "by_kind"}``."""
    rng = np.random.default_rng(seed)
    seqs, spans, injected = [], [], 0
    for p in make_problems(seed, n):
        msgs, bad = recovery_messages(p, rng, inject_rate)
        toks, sp = kg.messages_to_tokens(msgs)
        if bad is not None:
            injected += 1
            sp = sp[:bad] + sp[bad + 1:]
        seqs.append(toks)
        spans.append(sp)
    return seqs, spans, {"episodes": n, "injected": injected, "inject_rate": inject_rate}


def run_episodes(problems: Sequence[kg.Problem], generate_fn, max_turns: int = MAX_TURNS,
                 tool_delay_s: float = 0.0):
    """The kg task's episodes (tool, success rule) with this task's turn cap."""
    return kg.run_episodes(problems, generate_fn, max_turns, tool_delay_s=tool_delay_s)


def build_tokenizer():
    """The kg vocabulary's tokenizer under this task's name."""
    return common.build_tokenizer(kg.TOKEN_ID, TASK_NAME)


def save_episodes(results, out_dir, jsonl_path=None, extra_meta: dict | None = None):
    """Stores episodes as a pool of task ``kg_short_v1`` (:func:`common.save_episodes`)."""
    return common.save_episodes(results, out_dir, kg.messages_to_tokens, TASK_NAME,
                                build_tokenizer(), jsonl_path, extra_meta)


def evaluate_model(model, problems: Sequence[kg.Problem], batch: int = 64,
                   temperature: float = 0.0, key=None) -> dict:
    """Success of a Flax LM on ``problems`` with the tool (greedy, or sampled at
    ``temperature`` with ``key``): :func:`kg.summarize`."""
    fn = kg.flax_generate_fn(model, batch=batch, temperature=temperature, key=key)
    return kg.summarize(run_episodes(problems, fn))


def run_teacher(model, problems: Sequence[kg.Problem], temperature: float = 0.0,
                seed: int = 0, batch: int = 256) -> list:
    """The PyTorch teacher on ``problems`` with the tool and this task's turn cap (greedy, or
    sampled at ``temperature`` from a generator seeded by ``seed``)."""
    fn = kg_teacher.torch_generate_fn(model, temperature=temperature, seed=seed)
    out = []
    for i in range(0, len(problems), batch):
        out += run_episodes(problems[i:i + batch], fn)
    return out


def record_pool(model, problems: Sequence[kg.Problem], out_dir, jsonl_path=None,
                temperature: float = 1.0, seed: int = 0, extra_meta: dict | None = None):
    """The teacher's trajectories on ``problems`` (sampled at ``temperature``), every one kept
    with its success flag, as a ``kg_short_v1`` pool whose meta records the problems' seed."""
    res = run_teacher(model, problems, temperature, seed)
    meta = {"source": {"recorder": "prada_jax.distill.task.kg_short",
                       "temperature": temperature, "seed": seed}}
    meta.update(extra_meta or {})
    return save_episodes(res, out_dir, jsonl_path, meta)
