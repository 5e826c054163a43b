"""Runs the arithmetic task with a Flax student and the calculator tool; reports success rate.

    python -m prada_jax.distill.task.evaluate --student DIR [--n 256] [--seed 0]

``DIR`` is a Hugging Face folder (the trainer's ``student_hf/``, or the teacher's folder: the
Flax model loads any Qwen2/Llama checkpoint). Greedy decoding; problems are synthetic and
deterministic from ``--seed`` (the held-out set of :mod:`..teacher` uses ``seed * 1000 + 3``).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from prada_jax.distill.task import arith
from prada_jax.lm.sampling import contexts_generate_fn


def flax_generate_fn(model, *, batch: int = 64, context_len: int = 96,
                     max_new_tokens: int = 12, temperature: float = 0.0,
                     key=None) -> arith.GenerateFn:
    """Batched action generation with the Flax LM at static shapes [batch, context_len]
    (contexts longer than ``context_len`` keep their last tokens; partial batches are padded
    with dummy rows), so one program serves a whole evaluation
    (:func:`prada_jax.lm.sampling.contexts_generate_fn`)."""
    return contexts_generate_fn(model, pad_id=arith.PAD_ID, stop_ids=arith.STOP_IDS,
                                   batch=batch, context_len=context_len,
                                   max_new_tokens=max_new_tokens, temperature=temperature,
                                   key=key)


def wilson_ci(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def evaluate_model(model, problems: Sequence[arith.Problem], batch: int = 64,
                   max_turns: int = 6) -> dict:
    """Success rate (+ Wilson 95% CI), tool calls and mean agent turns of a Flax LM."""
    results = arith.run_episodes(problems, flax_generate_fn(model, batch=batch), max_turns)
    k = sum(r.success for r in results)
    lo, hi = wilson_ci(k, len(results))
    return {"success_rate": k / max(len(results), 1), "ci95": [lo, hi], "n": len(results),
            "tool_calls": int(sum(r.tool_calls for r in results)),
            "mean_turns": float(np.mean([r.turns for r in results]))}
