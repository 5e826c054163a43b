"""Trains the arithmetic task's PyTorch teacher, records its trajectories into a pool, and
exports its top-k logits (needs the ``[torch]`` extra).

    python -m prada_jax.distill.task.teacher --cache checkpoints/task_cache [--seed 0]

writes, under ``<cache>/seed<seed>/``: ``teacher/`` (HF folder: Qwen2 from a config, trained
from scratch on synthetic solved episodes, safetensors + tokenizer), ``pool/`` (teacher
trajectories recorded by running the task with the calculator), ``pool.jsonl`` (the same
trajectories as chat messages), ``logits/`` (teacher top-k + tail per pool token) and
``teacher_eval.json`` (teacher success on evaluation problems), and ``pool_heldout/`` +
``logits_heldout/`` (the same recording and export on another ``n_pool`` problems, never
trained on: the held-out set of the prefix likelihood-ratio diagnostic,
``prada_jax.distill.ratio``). Teacher training and ``pool/`` use the ``"train"`` split of the
problems, the evaluation and ``pool_heldout/`` the ``"eval"`` and ``"heldout"`` splits
(``arith.split_of``, by problem text), so no evaluated or held-out problem is in the pool.
Everything is deterministic from the seed on CPU; reruns reuse the teacher and the pools. All
data is synthetic.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from prada_jax.distill import pool as pool_lib
from prada_jax.distill.scoring import load_teacher as _load_teacher
from prada_jax.distill.task import arith, common
from prada_jax.distill.task.export_local import export_logits

DEFAULTS = dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, steps=600,
                batch=64, lr=3e-3, warmup=100, n_train=20000, n_pool=512, n_eval=256, top_k=8)


def model_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int):
    return common.qwen2_config(len(arith.VOCAB), arith.PAD_ID, arith.EOS_ID, 128, hidden, layers,
                               heads, kv_heads, intermediate)


def _batches(seqs: list[list[int]], spans: list[list[tuple[int, int]]], batch: int,
             rng: np.random.Generator, L: int):
    idx = rng.integers(0, len(seqs), size=batch)
    x = np.full((batch, L), arith.PAD_ID, np.int64)
    att = np.zeros((batch, L), np.int64)
    lab = np.full((batch, L), -100, np.int64)
    for b, i in enumerate(idx):
        s = seqs[i]
        x[b, : len(s)] = s
        att[b, : len(s)] = 1
        for a, e in spans[i]:
            lab[b, a:e] = s[a:e]
    return x, att, lab


def train_teacher(out_dir: os.PathLike | str, seed: int = 0, steps: int = DEFAULTS["steps"],
                  batch: int = DEFAULTS["batch"], lr: float = DEFAULTS["lr"],
                  warmup: int = DEFAULTS["warmup"], n_train: int = DEFAULTS["n_train"],
                  hidden: int = DEFAULTS["hidden"], layers: int = DEFAULTS["layers"],
                  heads: int = DEFAULTS["heads"], kv_heads: int = DEFAULTS["kv_heads"],
                  intermediate: int = DEFAULTS["intermediate"], log_every: int = 100) -> Path:
    """Trains a Qwen2 teacher from scratch on solved episodes (loss on agent tokens only;
    AdamW, linear warm-up + cosine) and saves it with the task tokenizer."""
    import torch  # lazy: torch is the optional [torch] extra
    from transformers import Qwen2ForCausalLM  # lazy: transformers takes seconds to import; only the teacher paths need it

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    problems = arith.make_problems(seed * 1000 + 1, n_train, split="train")
    seqs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p)) for p in problems))
    L = max(len(s) for s in seqs)
    model = Qwen2ForCausalLM(model_config(hidden, layers, heads, kv_heads, intermediate))
    seqs, spans = list(seqs), list(spans)
    common.fit_teacher(model, lambda: _batches(seqs, spans, batch, rng, L), steps, lr, warmup,
                       log_every)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    arith.build_tokenizer().save_pretrained(out)
    return out


def torch_generate_fn(model, max_new_tokens: int = 10, temperature: float = 0.0,
                      seed: int = 0) -> arith.GenerateFn:
    """Batched action generation with a PyTorch causal LM (left padding; greedy when
    ``temperature`` is 0); stops at ``</calc>`` or ``</ans>``
    (:func:`..common.torch_generate_fn`)."""
    return common.torch_generate_fn(model, pad_id=arith.PAD_ID, stop_ids=arith.STOP_IDS,
                                    max_new_tokens=max_new_tokens, temperature=temperature,
                                    seed=seed)


def load_teacher(path: os.PathLike | str):
    """The PyTorch teacher of a Hugging Face folder (float32, eval mode); see
    :func:`prada_jax.distill.scoring.load_teacher` (damaged folders raise ``BadInput``)."""
    return _load_teacher(path)


def evaluate_torch(model, problems: Sequence[arith.Problem], batch: int = 256) -> dict:
    """Runs the task with a PyTorch model (greedy) and the tool; returns success rate etc."""
    fn = torch_generate_fn(model)
    results = []
    for i in range(0, len(problems), batch):
        results += arith.run_episodes(problems[i:i + batch], fn)
    succ = np.array([r.success for r in results], np.float64)
    return {"success_rate": float(succ.mean()), "n": len(results),
            "tool_calls": int(sum(r.tool_calls for r in results))}


def record_pool(model, problems: Sequence[arith.Problem], out_dir: os.PathLike | str,
                jsonl_path: os.PathLike | str | None = None, temperature: float = 0.0,
                seed: int = 0, extra_meta: dict | None = None) -> pool_lib.Pool:
    """Runs the teacher on ``problems`` with the tool and stores every trajectory (with its
    success flag) as a pool; optionally also as chat JSONL."""
    fn = torch_generate_fn(model, temperature=temperature, seed=seed)
    results = []
    for i in range(0, len(problems), 256):
        results += arith.run_episodes(problems[i:i + 256], fn)
    meta = {"source": {"recorder": "prada_jax.distill.task.teacher", "temperature": temperature,
                       "seed": seed}}
    meta.update(extra_meta or {})
    return common.save_episodes(results, out_dir, arith.messages_to_tokens, arith.TASK_NAME,
                                arith.build_tokenizer(), jsonl_path, meta)


def tiny_cache(root: os.PathLike | str, n_problems: int = 12, top_k: int = 4) -> Path:
    """A small synthetic cache for tests and benchmarks (not a trained teacher).

    It holds ``teacher/``, an untrained random Qwen2 (hidden 16, torch seed 0) with the task's
    tokenizer, then ``pool/``, the ``n_problems`` solved reference episodes of
    ``make_problems(5, n_problems)``, and ``logits/``, the teacher's top-``top_k`` export of that
    pool. It returns ``root``. Needs torch.
    """
    import torch  # lazy: torch is the optional [torch] extra
    from transformers import Qwen2ForCausalLM  # lazy: transformers takes seconds to import; only the teacher paths need it

    root = Path(root)
    torch.manual_seed(0)
    Qwen2ForCausalLM(model_config(16, 1, 2, 1, 32)).save_pretrained(root / "teacher")
    arith.build_tokenizer().save_pretrained(root / "teacher")
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(5, n_problems)))
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, [1] * n_problems), root / "pool",
                       {"task": arith.TASK_NAME, "synthetic": True,
                        "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer())})
    export_logits(root / "teacher", root / "pool", root / "logits", top_k=top_k)
    return root
