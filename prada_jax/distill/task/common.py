"""Helpers shared by the built-in ReOPD tasks (:mod:`.arith`, :mod:`.kg`) and their teachers
(:mod:`.teacher`, :mod:`.kg_teacher`), parameterised by the task's vocabulary, pad id, stop ids
and model sizes: one-id-per-character-or-tag tokenization, the ``PreTrainedTokenizerFast``
build, action parsing, static-shape Flax generation, the PyTorch teacher's config, training
loop, KV-cached generation and pool recording. numpy only at import; jax, torch and
transformers are imported where used.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from prada_jax.distill import pool as pool_lib
from prada_jax.distill.scoring import load_teacher

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
TOKEN_PATTERN = r"</?[a-z]+>|."
_TOKEN_RE = re.compile(TOKEN_PATTERN, re.S)

# Generates one action per context: list of token lists -> list of token lists (each ending
# at a stop token, or truncated).
GenerateFn = Callable[[list[list[int]]], list[list[int]]]


# --- tokens -----------------------------------------------------------------------------------

def encode(text: str, token_id: Mapping[str, int], task_label: str) -> list[int]:
    """Text -> token ids (one per character or ``<tag>``). Raises ValueError naming an unknown
    symbol and ``task_label`` (e.g. "arithmetic")."""
    out = []
    for m in _TOKEN_RE.finditer(text):
        s = m.group(0)
        if s not in token_id:
            raise ValueError(f"symbol {s!r} is not in the {task_label} task vocabulary")
        out.append(token_id[s])
    return out


def decode(ids: Sequence[int], vocab: Sequence[str]) -> str:
    """Token ids -> text; an id outside the vocabulary reads ``?``."""
    return "".join(vocab[int(i)] if 0 <= int(i) < len(vocab) else "?" for i in ids)


def messages_to_tokens(messages: Sequence[dict], encode_fn: Callable[[str], list[int]]
                       ) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokens and agent-turn spans (end exclusive) of a chat, without a tokenizer object."""
    toks, spans = [], []
    for m in messages:
        ids = encode_fn(m["content"])
        if m["role"] == "assistant":
            spans.append((len(toks), len(toks) + len(ids)))
        toks.extend(ids)
    return toks, spans


def parse_action(text: str, tool_tag: str) -> tuple[str, str]:
    """Decoded action text -> (kind, payload); kind is ``tool_tag`` (``<tool_tag>..</tool_tag>``),
    "ans" or "bad"."""
    m = re.fullmatch(rf"<{tool_tag}>(.*)</{tool_tag}>", text, re.S)
    if m:
        return tool_tag, m.group(1)
    m = re.fullmatch(r"<ans>(.*)</ans>", text, re.S)
    if m:
        return "ans", m.group(1)
    return "bad", text


def build_tokenizer(token_id: Mapping[str, int], task_name: str):
    """A ``PreTrainedTokenizerFast`` over a task vocabulary (``<pad>``, ``<eos>``, ``<err>`` as
    pad / eos / unknown) with the concatenating chat template."""
    # lazy: transformers takes seconds to import; only the teacher paths need it (and its tokenizers)
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # lazy: as above
    from transformers import PreTrainedTokenizerFast  # lazy: as above

    tk = Tokenizer(models.WordLevel(vocab=dict(token_id), unk_token="<err>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(TOKEN_PATTERN), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<err>")
    tok.chat_template = CHAT_TEMPLATE
    tok.name_or_path = task_name
    return tok


# --- Flax generation ----------------------------------------------------------------------------

# --- PyTorch teacher ------------------------------------------------------------------------------

def qwen2_config(vocab_size: int, pad_id: int, eos_id: int, max_positions: int, hidden: int,
                 layers: int, heads: int, kv_heads: int, intermediate: int):
    """The teacher's ``Qwen2Config`` (tied embeddings, ``<eos>`` also as BOS)."""
    from transformers import Qwen2Config  # lazy: transformers takes seconds to import; only the teacher paths need it
    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       intermediate_size=intermediate, max_position_embeddings=max_positions,
                       tie_word_embeddings=True, pad_token_id=pad_id,
                       eos_token_id=eos_id, bos_token_id=eos_id, rope_theta=10000.0)


def fit_teacher(model, next_batch: Callable[[], tuple], steps: int, lr: float, warmup: int,
                log_every: int = 100) -> None:
    """Trains ``model`` for ``steps`` steps on ``next_batch()`` -> (input ids, attention mask,
    labels) numpy arrays (loss on labelled tokens; AdamW, linear warm-up + cosine, gradient
    norm clipped at 1); leaves it in eval mode."""
    import torch  # lazy: torch is the optional [torch] extra
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps)
                                                                        / steps)))
    model.train()
    t0 = time.time()
    for step in range(steps):
        x, att, lab = (torch.from_numpy(a) for a in next_batch())
        loss = model(input_ids=x, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"teacher step {step} loss {loss.item():.4f} ({time.time() - t0:.0f}s)",
                  flush=True)
    model.eval()


def _cache_of(output):
    """The KV cache a transformers forward returned (``cache`` in 5.x, ``past_key_values``
    in 4.x)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def torch_generate_fn(model, *, pad_id: int, stop_ids: Sequence[int], max_new_tokens: int,
                      temperature: float = 0.0, seed: int = 0) -> GenerateFn:
    """Batched action generation with a PyTorch causal LM (left padding, KV cache); greedy when
    ``temperature`` is 0, else softmax sampling at ``temperature`` from a ``torch.Generator``
    seeded by ``seed`` (reproducible on CPU); stops at any of ``stop_ids``."""
    import torch  # lazy: torch is the optional [torch] extra
    gen = torch.Generator().manual_seed(seed)
    # transformers 5 renamed the forward argument past_key_values -> cache (the old name warns
    # and goes away in 5.40); 4.x knows only past_key_values.
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"

    @torch.no_grad()
    def fn(contexts: list[list[int]]) -> list[list[int]]:
        L = max(len(c) for c in contexts)
        x = torch.full((len(contexts), L), pad_id, dtype=torch.long)
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
                        use_cache=True, **{cache_kw: past})
            past = _cache_of(res)
            logits = res.logits[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=gen)[:, 0]
            else:
                nxt = logits.argmax(-1)
            for b in range(len(contexts)):
                if live[b]:
                    out[b].append(int(nxt[b]))
                    live[b] = int(nxt[b]) not in stop_ids
            if not any(live):
                break
            cur = nxt[:, None]
            cur_pos = cur_pos[:, -1:] + 1
            att = torch.cat([att, torch.ones_like(cur)], dim=1)
        return out

    return fn


def save_episodes(results: Sequence, out_dir: os.PathLike | str,
                  to_tokens: Callable[[Sequence[dict]], tuple[list[int], list[tuple[int, int]]]],
                  task_name: str, tokenizer, jsonl_path: os.PathLike | str | None = None,
                  extra_meta: dict | None = None):
    """Stores episodes (objects with ``messages`` and ``success``; in order) as a pool of task
    ``task_name``; optionally also as chat JSONL. Returns the loaded pool."""
    trajs, spans, succ = [], [], []
    for r in results:
        t, s = to_tokens(r.messages)
        trajs.append(t)
        spans.append(s)
        succ.append(int(r.success))
    if jsonl_path is not None:
        with open(jsonl_path, "w") as f:
            for r in results:
                f.write(json.dumps({"messages": r.messages, "success": int(r.success),
                                    "task": task_name}) + "\n")
    meta = {"task": task_name, "tokenizer": pool_lib.tokenizer_meta(tokenizer, task_name),
            "synthetic": True}
    meta.update(extra_meta or {})
    pool_lib.save_pool(pool_lib.build_arrays(trajs, spans, succ), out_dir, meta)
    return pool_lib.load_pool(out_dir)


# --- episodes ---------------------------------------------------------------------------------

class ToolCounter:
    """Counts tool (environment) calls made in this process (one instance per task)."""

    def __init__(self):
        self.calls = 0


@dataclass
class EpisodeResult:
    messages: list[dict]
    success: bool
    tool_calls: int
    turns: int


def run_episodes(problems: Sequence, generate_fn: GenerateFn, max_turns: int, *,
                 encode_fn: Callable[[str], list[int]],
                 decode_fn: Callable[[Sequence[int]], str],
                 parse_fn: Callable[[Sequence[int]], tuple[str, str]], tool_kind: str,
                 tool: Callable[[object, str], str],
                 answer_ok: Callable[[object, str], bool],
                 tool_delay_s: float = 0.0) -> list[EpisodeResult]:
    """Runs a task with an agent and its tool, all problems batched per turn.

    Each turn, ``generate_fn`` acts for every live episode; ``parse_fn`` reads the action: a
    ``tool_kind`` action is answered by ``tool(problem, payload)`` (a tool message, appended
    to the context), any other action ends the episode, a success iff it is an ``ans`` action
    with ``answer_ok(problem, payload)``. Episodes still live after ``max_turns`` fail.
    ``tool_delay_s`` [s] is a simulated tool latency: the calls of one turn round are issued
    together, so a round with at least one call waits ``tool_delay_s`` once (the count
    ``tool_rounds`` that ``prada_jax.distill.gpucost`` and the fair clock price); 0 = none.
    """
    msgs = [[{"role": "user", "content": p.question}] for p in problems]
    ctx = [encode_fn(p.question) for p in problems]
    done = [False] * len(problems)
    success = [False] * len(problems)
    calls = [0] * len(problems)
    turns = [0] * len(problems)
    for _ in range(max_turns):
        live = [i for i, d in enumerate(done) if not d]
        if not live:
            break
        actions = generate_fn([ctx[i] for i in live])
        called = False
        for i, act in zip(live, actions):
            act = [int(a) for a in act]
            turns[i] += 1
            kind, payload = parse_fn(act)
            msgs[i].append({"role": "assistant", "content": decode_fn(act)})
            ctx[i].extend(act)
            if kind == tool_kind:
                reply = tool(problems[i], payload)
                called = True
                calls[i] += 1
                msgs[i].append({"role": "tool", "content": reply})
                ctx[i].extend(encode_fn(reply))
            else:
                done[i] = True
                success[i] = kind == "ans" and answer_ok(problems[i], payload)
        if called and tool_delay_s > 0:
            time.sleep(tool_delay_s)   # the round's calls run concurrently: one wait
    return [EpisodeResult(m, s, c, t) for m, s, c, t in zip(msgs, success, calls, turns)]


def ensure_teacher(tdir: os.PathLike | str, fv, train_fn: Callable, t0: float):
    """The teacher of a task cache: trains it into ``tdir`` with ``train_fn`` (a task's
    ``train_teacher``; seed and sizes from the parsed flags ``fv``) unless ``tdir`` already
    holds a ``config.json``, then loads it (PyTorch, float32, eval mode)."""
    if not (Path(tdir) / "config.json").is_file():
        train_fn(tdir, fv.seed, fv.steps, fv.batch, fv.lr, fv.warmup, fv.n_train,
                 fv.hidden, fv.layers, fv.heads, fv.kv_heads, fv.intermediate)
    print(f"teacher ready ({time.time() - t0:.0f}s)", flush=True)
    return load_teacher(tdir)
