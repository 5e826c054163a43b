"""Batched autoregressive sampling (greedy, temperature, top-p, stop tokens) with a KV cache."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax.lm.model import CausalLM, KVCache


def top_p_mask(logits: jax.Array, top_p: jax.Array | float) -> jax.Array:
    """Boolean [..., V]: the nucleus, the fewest most-likely tokens whose mass reaches ``top_p``.

    A token is kept when the mass of the tokens strictly more likely than it is < top_p, so the
    most likely token is always kept and top_p ≥ 1 keeps everything. Tokens tied with the last
    kept one are kept too.
    """
    probs = jax.nn.softmax(logits, axis=-1)
    sorted_probs = jnp.sort(probs, axis=-1)[..., ::-1]
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    # Smallest kept probability; every token at least that likely is in the nucleus.
    threshold = jnp.min(jnp.where(keep_sorted, sorted_probs, jnp.inf), axis=-1, keepdims=True)
    return probs >= threshold


def sample_logits(key: jax.Array, logits: jax.Array, temperature: jax.Array | float,
                  top_p: jax.Array | float, greedy: bool = False) -> jax.Array:
    """Draws one token per row.

    Args:
      key: PRNG key.
      logits: [B, V] float32.
      temperature: > 0 softmax temperature (ignored when greedy).
      top_p: nucleus mass in (0, 1]; 1 disables the nucleus filter.
      greedy: argmax instead of sampling (static).

    Returns:
      [B] int32 token ids.
    """
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = logits / temperature
    scaled = jnp.where(top_p_mask(scaled, top_p), scaled, -jnp.inf)
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "greedy"))
def _generate_jit(graphdef, state, input_ids, attention_mask, key, temperature, top_p, stop_ids,
                  pad_token_id, *, max_new_tokens, greedy):
    model = nnx.merge(graphdef, state)
    b, l = input_ids.shape
    cache = KVCache.init(model.config, b, l + max_new_tokens, dtype=model.dtype)
    logits, cache = model(input_ids, attention_mask, cache=cache)

    def _step(carry, t):
        cache, last_logits, done, lengths = carry
        tok = sample_logits(jax.random.fold_in(key, t), last_logits, temperature, top_p, greedy)
        logp = jnp.take_along_axis(jax.nn.log_softmax(last_logits, axis=-1), tok[:, None],
                                   axis=-1)[:, 0]
        tok = jnp.where(done, pad_token_id, tok)
        logp = jnp.where(done, 0.0, logp)
        lengths = lengths + (~done).astype(jnp.int32)
        is_stop = jnp.any(tok[:, None] == stop_ids[None, :], axis=-1)
        new_done = done | is_stop
        next_logits, cache = model(tok[:, None], (~done)[:, None].astype(jnp.int32), cache=cache)
        return (cache, next_logits[:, -1], new_done, lengths), (tok, logp)

    init = (cache, logits[:, -1], jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32))
    (_, _, _, lengths), (toks, logps) = jax.lax.scan(_step, init, jnp.arange(max_new_tokens))
    return toks.T, logps.T, lengths


def generate(model: CausalLM, input_ids, attention_mask=None, *, key: jax.Array,
             max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
             stop_token_ids: Sequence[int] = (), pad_token_id: int = 0):
    """Samples continuations of a left-padded prompt batch (one compiled program per shape).

    Args:
      model: the LM.
      input_ids: [B, L] int32 prompts, left-padded (every row needs ≥ 1 real token).
      attention_mask: [B, L], 1 = real token; default all ones.
      key: PRNG key (step t uses ``fold_in(key, t)``); unused when greedy.
      max_new_tokens: tokens to generate (static: the KV cache holds L + max_new_tokens slots).
      temperature: 0 → greedy argmax; > 0 → softmax sampling at that temperature.
      top_p: nucleus mass in (0, 1].
      stop_token_ids: a row stops after emitting any of these (the stop token is kept).
      pad_token_id: written after a row stopped.

    Returns:
      tokens [B, T] int32 (T = max_new_tokens; ``pad_token_id`` after a stop),
      logprobs [B, T] float32: log-prob of each emitted token under the model's *unmodified*
        distribution (log-softmax of the logits, before temperature/top-p; 0 after a stop),
      lengths [B] int32: emitted tokens per row including the stop token.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    input_ids = jnp.asarray(input_ids, jnp.int32)
    if attention_mask is None:
        attention_mask = jnp.ones_like(input_ids)
    attention_mask = jnp.asarray(attention_mask, jnp.int32)
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids [B, L] and attention_mask must match, got {input_ids.shape} "
                         f"and {attention_mask.shape}")
    if not bool(jnp.all(attention_mask[:, -1] == 1)):
        raise ValueError("prompts must be left-padded: attention_mask[:, -1] must be 1 in every "
                         "row")
    graphdef, state = nnx.split(model)
    greedy = temperature == 0.0
    stop = jnp.asarray(list(stop_token_ids) or [-1], jnp.int32)
    return _generate_jit(graphdef, state, input_ids, attention_mask, key,
                         jnp.float32(temperature if not greedy else 1.0), jnp.float32(top_p), stop,
                         jnp.int32(pad_token_id), max_new_tokens=int(max_new_tokens), greedy=greedy)


def truncate_at_stop_strings(tokenizer, tokens, lengths, stop_strings: Sequence[str]) -> np.ndarray:
    """Shortens each row to end right after the first token that completes a stop string.

    Args:
      tokenizer: anything with ``decode(list[int]) -> str`` (a HF tokenizer).
      tokens: [B, T] generated ids.
      lengths: [B] valid lengths (from :func:`generate`).
      stop_strings: strings such as ``"\\n\\n"``.

    Returns:
      [B] int32 new lengths (≤ lengths); a row without a stop string keeps its length.
    """
    tokens = np.asarray(tokens)
    out = np.asarray(lengths, np.int32).copy()
    if not stop_strings:
        return out
    for b in range(tokens.shape[0]):
        row = tokens[b, :out[b]].tolist()
        if not any(s in tokenizer.decode(row) for s in stop_strings):
            continue
        for n in range(1, len(row) + 1):
            text = tokenizer.decode(row[:n])
            if any(s in text for s in stop_strings):
                out[b] = n
                break
    return out


def contexts_generate_fn(model, *, pad_id: int, stop_ids: Sequence[int], batch: int,
                         context_len: int, max_new_tokens: int, temperature: float = 0.0,
                         top_p: float = 1.0, key=None, first_call: int = 1
                         ) -> Callable[[list[list[int]]], list[list[int]]]:
    """``contexts (lists of token ids) -> generated token lists`` with the Flax LM
    (:func:`generate`) at static shapes [batch, context_len] tokens (longer contexts keep their last tokens; partial
    batches are padded with dummy rows), so one program serves a whole evaluation; greedy when
    ``temperature`` is 0 (else nucleus sampling at ``top_p``); stops at any of ``stop_ids``.
    Call c of the function (counting from ``first_call``) samples with ``fold_in(key, c)``."""
    key = jax.random.key(0) if key is None else key
    calls = [0]

    def fn(contexts: list[list[int]]) -> list[list[int]]:
        out = []
        for s in range(0, len(contexts), batch):
            chunk = contexts[s:s + batch]
            ids = np.full((batch, context_len), pad_id, np.int32)
            mask = np.zeros((batch, context_len), np.int32)
            for b in range(batch):
                c = chunk[b][-context_len:] if b < len(chunk) else [pad_id]
                ids[b, context_len - len(c):] = c
                mask[b, context_len - len(c):] = 1
            toks, _, lens = generate(model, ids, mask,
                                     key=jax.random.fold_in(key, first_call + calls[0]),
                                     max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_p=top_p, stop_token_ids=stop_ids, pad_token_id=pad_id)
            calls[0] += 1
            toks, lens = np.asarray(toks), np.asarray(lens)
            out += [toks[b, :lens[b]].tolist() for b in range(len(chunk))]
        return out

    return fn
