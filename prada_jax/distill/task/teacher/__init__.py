"""Trains the arithmetic task's PyTorch teacher, records its trajectories into a pool, and
exports its top-k logits (needs the ``[torch]`` extra).

    python -m prada_jax.distill.task.teacher --cache checkpoints/task_cache [--seed 0]

writes, under ``<cache>/seed<seed>/``: ``teacher/`` (HF folder: Qwen2 from a config, trained
from scratch on synthetic solved episodes, safetensors + tokenizer), ``pool/`` (teacher
trajectories recorded by running the task with the calculator), ``pool.jsonl`` (the same
trajectories as chat messages), ``logits/`` (teacher top-k + tail per pool token) and
``teacher_eval.json`` (teacher success on held-out problems), and ``pool_heldout/`` +
``logits_heldout/`` (the same recording and export on another ``n_pool`` fresh problems, never
trained on: the held-out set of the prefix likelihood-ratio diagnostic,
``prada_jax.distill.ratio``). Everything is deterministic from
the seed on CPU; reruns reuse finished stages. All data is synthetic.
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
from prada_jax.distill.task import arith
from prada_jax.distill.task.export_local import export_logits

DEFAULTS = dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, steps=600,
                batch=64, lr=3e-3, warmup=100, n_train=20000, n_pool=512, n_eval=256, top_k=8)


def model_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int):
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=len(arith.VOCAB), hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       intermediate_size=intermediate, max_position_embeddings=128,
                       tie_word_embeddings=True, pad_token_id=arith.PAD_ID,
                       eos_token_id=arith.EOS_ID, bos_token_id=arith.EOS_ID, rope_theta=10000.0)


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
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    problems = arith.make_problems(seed * 1000 + 1, n_train)
    seqs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p)) for p in problems))
    L = max(len(s) for s in seqs)
    model = Qwen2ForCausalLM(model_config(hidden, layers, heads, kv_heads, intermediate))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps)
                                                                        / steps)))
    model.train()
    t0 = time.time()
    for step in range(steps):
        x, att, lab = (torch.from_numpy(a) for a in _batches(list(seqs), list(spans), batch,
                                                             rng, L))
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
    arith.build_tokenizer().save_pretrained(out)
    return out


def torch_generate_fn(model, max_new_tokens: int = 10, temperature: float = 0.0,
                      seed: int = 0) -> arith.GenerateFn:
    """Batched action generation with a PyTorch causal LM (left padding; greedy when
    ``temperature`` is 0); stops at ``</calc>`` or ``</ans>``."""
    import torch
    gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def fn(contexts: list[list[int]]) -> list[list[int]]:
        L = max(len(c) for c in contexts)
        x = torch.full((len(contexts), L), arith.PAD_ID, dtype=torch.long)
        att = torch.zeros_like(x)
        for b, c in enumerate(contexts):
            x[b, L - len(c):] = torch.tensor(c)
            att[b, L - len(c):] = 1
        out = [[] for _ in contexts]
        live = torch.ones(len(contexts), dtype=torch.bool)
        past = None
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        cur, cur_pos = x, pos
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
                    if int(nxt[b]) in arith.STOP_IDS:
                        live[b] = False
            if not live.any():
                break
            cur = nxt[:, None]
            cur_pos = cur_pos[:, -1:] + 1
            att = torch.cat([att, torch.ones_like(cur)], dim=1)
        return out

    return fn


def load_teacher(path: os.PathLike | str):
    """The PyTorch teacher of a Hugging Face folder (float32, eval mode); see
    :func:`prada_jax.distill.scoring.load_teacher` (damaged folders raise ``BadInput``)."""
    from prada_jax.distill.scoring import load_teacher as load
    return load(path)


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
    trajs, spans, succ = [], [], []
    for r in results:
        t, s = arith.messages_to_tokens(r.messages)
        trajs.append(t)
        spans.append(s)
        succ.append(int(r.success))
    if jsonl_path is not None:
        with open(jsonl_path, "w") as f:
            for r in results:
                f.write(json.dumps({"messages": r.messages, "success": int(r.success),
                                    "task": arith.TASK_NAME}) + "\n")
    meta = {"task": arith.TASK_NAME,
            "tokenizer": pool_lib.tokenizer_meta(arith.build_tokenizer(), arith.TASK_NAME),
            "synthetic": True,
            "source": {"recorder": "prada_jax.distill.task.teacher", "temperature": temperature,
                       "seed": seed}}
    meta.update(extra_meta or {})
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, succ), out_dir, meta)
    return pool_lib.load_pool(out_dir)
