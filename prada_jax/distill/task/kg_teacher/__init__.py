"""Trains the knowledge-graph task's PyTorch teacher, records its *sampled* trajectories into
pools and exports its top-k logits (needs the ``[torch]`` extra).

    python -m prada_jax.distill.task.kg_teacher --cache=checkpoints/kg_cache [--seed=0]

writes, under ``<cache>/seed<seed>/``: ``teacher/`` (HF folder: Qwen2 from a config, trained
from scratch on synthetic solved episodes whose call forms are drawn 50/50), ``pool/`` +
``pool.jsonl`` (the teacher run with the ``lookup`` tool on fresh problems, sampled at
temperature ``--temperature``, every trajectory kept with its success flag), ``logits/``
(teacher top-k + tail per pool token, at temperature 1), ``pool_heldout/`` +
``logits_heldout/`` (the same on other problems) and ``teacher_eval.json`` (teacher success
sampled at the pool temperature and greedy, with 95% Wilson intervals). Problem seeds follow
the arithmetic task: ``seed*1000 + 1`` teacher training, ``+2`` pool, ``+3`` evaluation (the
trainer's held-out problems), ``+4`` held-out pool. Everything is deterministic from the seed
on CPU; reruns reuse the teacher and the pools. All data is synthetic.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from prada_jax.distill import pool as pool_lib
from prada_jax.distill.task import common, kg

DEFAULTS = dict(hidden=128, layers=3, heads=4, kv_heads=2, intermediate=256, steps=700,
                batch=64, lr=3e-3, warmup=100, n_train=20000, n_pool=4096, n_eval=256, top_k=8,
                temperature=1.0, threads=1)
# n_pool: 4096 trajectories, not the arithmetic task's 512: on 512 the 300-1000-update
# students memorised the pool (SFT loss below the teacher's own) and stayed near 0 success
# (docs/distill.md, "Second built-in task")


def model_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int):
    return common.qwen2_config(len(kg.VOCAB), kg.PAD_ID, kg.EOS_ID, 256, hidden, layers, heads,
                               kv_heads, intermediate)


def training_episodes(seed: int, n: int) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """``n`` solved episodes (tokens, agent-turn spans) of problems ``make_problems(seed, n)``,
    each call's argument order drawn 50/50 (generator seeded by ``seed``)."""
    rng = np.random.default_rng(seed)
    seqs, spans = [], []
    for p in kg.make_problems(seed, n):
        t, s = kg.messages_to_tokens(kg.solved_messages(p, rng))
        seqs.append(t)
        spans.append(s)
    return seqs, spans


def train_teacher(out_dir: os.PathLike | str, seed: int = 0, steps: int = DEFAULTS["steps"],
                  batch: int = DEFAULTS["batch"], lr: float = DEFAULTS["lr"],
                  warmup: int = DEFAULTS["warmup"], n_train: int = DEFAULTS["n_train"],
                  hidden: int = DEFAULTS["hidden"], layers: int = DEFAULTS["layers"],
                  heads: int = DEFAULTS["heads"], kv_heads: int = DEFAULTS["kv_heads"],
                  intermediate: int = DEFAULTS["intermediate"], log_every: int = 100,
                  episodes: tuple | None = None, tokenizer=None) -> Path:
    """Trains a Qwen2 teacher from scratch on solved episodes (cross-entropy on agent tokens
    only; AdamW, linear warm-up + cosine; ``batch`` episodes per step) and saves it with the
    task tokenizer. ``episodes``: other training data as ``(token lists, loss spans)`` (e.g.
    :func:`prada_jax.distill.task.kg_short.training_episodes`, whose injected errors carry no
    span); ``tokenizer``: saved instead of the kg task's."""
    import torch  # lazy: torch is the optional [torch] extra
    from transformers import Qwen2ForCausalLM  # lazy: transformers takes seconds to import; only the teacher paths need it

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    seqs, spans = (training_episodes(seed * 1000 + 1, n_train) if episodes is None
                   else (list(episodes[0]), list(episodes[1])))
    L = max(len(s) for s in seqs)
    x_all = np.full((len(seqs), L), kg.PAD_ID, np.int64)
    lab_all = np.full((len(seqs), L), -100, np.int64)
    att_all = np.zeros((len(seqs), L), np.int64)
    for i, (s, sp) in enumerate(zip(seqs, spans)):
        x_all[i, :len(s)] = s
        att_all[i, :len(s)] = 1
        for a, e in sp:
            lab_all[i, a:e] = s[a:e]
    model = Qwen2ForCausalLM(model_config(hidden, layers, heads, kv_heads, intermediate))

    def next_batch():
        idx = rng.integers(0, len(seqs), size=batch)
        n = int(att_all[idx].sum(1).max())
        return tuple(a[idx, :n] for a in (x_all, att_all, lab_all))

    common.fit_teacher(model, next_batch, steps, lr, warmup, log_every)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    (tokenizer or kg.build_tokenizer()).save_pretrained(out)
    return out


def torch_generate_fn(model, max_new_tokens: int = 8, temperature: float = 0.0,
                      seed: int = 0) -> kg.GenerateFn:
    """Batched action generation with a PyTorch causal LM (left padding, KV cache); greedy when
    ``temperature`` is 0, else softmax sampling at ``temperature`` from a ``torch.Generator``
    seeded by ``seed`` (reproducible on CPU); stops at ``</call>`` or ``</ans>``
    (:func:`..common.torch_generate_fn`)."""
    return common.torch_generate_fn(model, pad_id=kg.PAD_ID, stop_ids=kg.STOP_IDS,
                                    max_new_tokens=max_new_tokens, temperature=temperature,
                                    seed=seed)


def run_teacher(model, problems: Sequence[kg.Problem], temperature: float = 0.0,
                seed: int = 0, batch: int = 256) -> list[kg.EpisodeResult]:
    """Runs the task with the PyTorch teacher and the tool (``batch`` episodes at a time)."""
    fn = torch_generate_fn(model, temperature=temperature, seed=seed)
    results = []
    for i in range(0, len(problems), batch):
        results += kg.run_episodes(problems[i:i + batch], fn)
    return results


def evaluate_torch(model, problems: Sequence[kg.Problem], temperature: float = 0.0,
                   seed: int = 0) -> dict:
    """Teacher success rate (+ Wilson 95% CI), tool calls, mean turns at ``temperature``."""
    return kg.summarize(run_teacher(model, problems, temperature, seed))


def record_pool(model, problems: Sequence[kg.Problem], out_dir: os.PathLike | str,
                jsonl_path: os.PathLike | str | None = None, temperature: float = 0.0,
                seed: int = 0, extra_meta: dict | None = None) -> pool_lib.Pool:
    """Runs the teacher (sampled at ``temperature``, generator seed ``seed``) on ``problems``
    with the tool and stores every trajectory with its success flag as a pool
    (:func:`save_episodes`)."""
    results = run_teacher(model, problems, temperature, seed)
    meta = {"source": {"recorder": "prada_jax.distill.task.kg_teacher",
                       "temperature": temperature, "seed": seed}}
    meta.update(extra_meta or {})
    return save_episodes(results, out_dir, jsonl_path, meta)


def save_episodes(results: Sequence[kg.EpisodeResult], out_dir: os.PathLike | str,
                  jsonl_path: os.PathLike | str | None = None,
                  extra_meta: dict | None = None) -> pool_lib.Pool:
    """Stores episodes (in order, each with its success flag) as a pool of task
    ``kg_lookup_v1``; optionally also as chat JSONL. Returns the loaded pool."""
    return common.save_episodes(results, out_dir, kg.messages_to_tokens, kg.TASK_NAME,
                                kg.build_tokenizer(), jsonl_path, extra_meta)
