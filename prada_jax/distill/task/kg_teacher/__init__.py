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
on CPU; reruns reuse finished stages. All data is synthetic.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from prada_jax.distill import pool as pool_lib
from prada_jax.distill.task import kg

DEFAULTS = dict(hidden=128, layers=3, heads=4, kv_heads=2, intermediate=256, steps=700,
                batch=64, lr=3e-3, warmup=100, n_train=20000, n_pool=512, n_eval=256, top_k=8,
                temperature=1.0, threads=1)


def model_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int):
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=len(kg.VOCAB), hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       intermediate_size=intermediate, max_position_embeddings=256,
                       tie_word_embeddings=True, pad_token_id=kg.PAD_ID,
                       eos_token_id=kg.EOS_ID, bos_token_id=kg.EOS_ID, rope_theta=10000.0)


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
                  intermediate: int = DEFAULTS["intermediate"], log_every: int = 100) -> Path:
    """Trains a Qwen2 teacher from scratch on solved episodes (cross-entropy on agent tokens
    only; AdamW, linear warm-up + cosine; ``batch`` episodes per step) and saves it with the
    task tokenizer."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    seqs, spans = training_episodes(seed * 1000 + 1, n_train)
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
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps)
                                                                        / steps)))
    model.train()
    t0 = time.time()
    for step in range(steps):
        idx = rng.integers(0, len(seqs), size=batch)
        n = int(att_all[idx].sum(1).max())
        x, att, lab = (torch.from_numpy(a[idx, :n]) for a in (x_all, att_all, lab_all))
        loss = model(input_ids=x, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"teacher step {step} loss {loss.item():.4f} ({time.time() - t0:.0f}s)",
                  flush=True)
    out = Path(out_dir)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    kg.build_tokenizer().save_pretrained(out)
    return out


def torch_generate_fn(model, max_new_tokens: int = 8, temperature: float = 0.0,
                      seed: int = 0) -> kg.GenerateFn:
    """Batched action generation with a PyTorch causal LM (left padding, KV cache); greedy when
    ``temperature`` is 0, else softmax sampling at ``temperature`` from a ``torch.Generator``
    seeded by ``seed`` (reproducible on CPU); stops at ``</call>`` or ``</ans>``."""
    import torch
    gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def fn(contexts: list[list[int]]) -> list[list[int]]:
        L = max(len(c) for c in contexts)
        x = torch.full((len(contexts), L), kg.PAD_ID, dtype=torch.long)
        att = torch.zeros_like(x)
        for b, c in enumerate(contexts):
            x[b, L - len(c):] = torch.tensor(c)
            att[b, L - len(c):] = 1
        out = [[] for _ in contexts]
        live = [True] * len(contexts)
        past = None
        cur, cur_pos = x, (att.cumsum(-1) - 1).clamp(min=0)
        for _ in range(max_new_tokens):
            res = model(input_ids=cur, attention_mask=att, position_ids=cur_pos,
                        past_key_values=past, use_cache=True)
            past = res.past_key_values
            logits = res.logits[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
            else:
                nxt = logits.argmax(-1)
            for b in range(len(contexts)):
                if live[b]:
                    out[b].append(int(nxt[b]))
                    live[b] = int(nxt[b]) not in kg.STOP_IDS
            if not any(live):
                break
            cur = nxt[:, None]
            cur_pos = cur_pos[:, -1:] + 1
            att = torch.cat([att, torch.ones_like(cur)], dim=1)
        return out

    return fn


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
    trajs, spans, succ = [], [], []
    for r in results:
        t, s = kg.messages_to_tokens(r.messages)
        trajs.append(t)
        spans.append(s)
        succ.append(int(r.success))
    if jsonl_path is not None:
        with open(jsonl_path, "w") as f:
            for r in results:
                f.write(json.dumps({"messages": r.messages, "success": int(r.success),
                                    "task": kg.TASK_NAME}) + "\n")
    meta = {"task": kg.TASK_NAME,
            "tokenizer": pool_lib.tokenizer_meta(kg.build_tokenizer(), kg.TASK_NAME),
            "synthetic": True}
    meta.update(extra_meta or {})
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, succ), out_dir, meta)
    return pool_lib.load_pool(out_dir)
