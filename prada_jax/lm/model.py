"""Flax NNX decoder-only causal LM of the Qwen2/Llama family, with an optional KV cache.

Layout follows the Hugging Face modules (``embed_tokens``, ``layers[i].self_attn.q_proj``, ...)
so the weight key map in :mod:`prada_jax.lm.hf` reads one-to-one. Linear kernels are stored
``[in, out]`` (Flax convention; HF stores ``[out, in]``).
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from prada_jax.lm.config import LMConfig

# Finite "minus infinity" for masked attention scores: a fully masked query row (a left-padding
# position) then gets a uniform distribution instead of NaN, so gradients stay finite.
_MASK_VALUE = -1e30


@flax.struct.dataclass
class KVCache:
    """Key/value cache for incremental decoding; all rows share one slot counter.

    Attributes:
      k, v: [N, B, S, K, Dh] cached keys/values (N layers, S slots, K kv heads).
      mask: [B, S] int32, 1 where a slot holds a real (non-padding) token.
      index: [] int32, next free slot (slots ``< index`` are filled, padding included).
      next_pos: [B] int32, rotary position of the next real token of each row.
    """

    k: jax.Array
    v: jax.Array
    mask: jax.Array
    index: jax.Array
    next_pos: jax.Array

    @classmethod
    def init(cls, config: LMConfig, batch: int, max_len: int, dtype=jnp.float32) -> "KVCache":
        """An empty cache with ``max_len`` slots per row."""
        shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   mask=jnp.zeros((batch, max_len), jnp.int32), index=jnp.zeros((), jnp.int32),
                   next_pos=jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


class RMSNorm(nnx.Module):
    """y = w · x / sqrt(mean(x²) + ε), statistics in float32."""

    def __init__(self, dim: int, eps: float, *, dtype, param_dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        var = jnp.mean(x32 * x32, axis=-1, keepdims=True)
        y = (x32 * jax.lax.rsqrt(var + self.eps)).astype(self.dtype)
        return self.weight[...].astype(self.dtype) * y


def _rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope_cos_sin(config: LMConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rotary tables for integer positions [B, L] → (cos, sin), each [B, L, Dh] float32."""
    inv_freq, scale = config.rope_inv_freq()
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary embeddings."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, h, k, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q_proj = nnx.Linear(d, h * hd, use_bias=config.attention_bias, **kw)
        self.k_proj = nnx.Linear(d, k * hd, use_bias=config.attention_bias, **kw)
        self.v_proj = nnx.Linear(d, k * hd, use_bias=config.attention_bias, **kw)
        self.o_proj = nnx.Linear(h * hd, d, use_bias=config.attention_out_bias, **kw)
        self.num_heads, self.num_kv_heads, self.head_dim = h, k, hd
        self.dtype = dtype

    def __call__(self, x, cos, sin, attn_mask, kv=None, index=None):
        """One attention block.

        Args:
          x: [B, L, D] hidden states.
          cos, sin: [B, L, Dh] rotary tables for the L query positions.
          attn_mask: [B, L, S] bool, True where query l may attend key slot s.
          kv: optional (k_cache, v_cache), each [B, S, K, Dh]; the new keys/values are written at
            slots [index, index + L). Without a cache S = L.
          index: [] int32 first slot to write (with ``kv``).

        Returns:
          ([B, L, D] output, updated (k_cache, v_cache) or None).
        """
        b, l, _ = x.shape
        h, kh, hd = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).reshape(b, l, h, hd)
        k = self.k_proj(x).reshape(b, l, kh, hd)
        v = self.v_proj(x).reshape(b, l, kh, hd)
        c, s = cos[:, :, None, :].astype(self.dtype), sin[:, :, None, :].astype(self.dtype)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        if kv is not None:
            k_cache, v_cache = kv
            k = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, index, 0, 0))
            kv = (k, v)
        # Query head j uses kv head j // G (HF repeat_kv order): split H into [K, G].
        g = h // kh
        qg = q.reshape(b, l, kh, g, hd).astype(jnp.float32)
        scores = jnp.einsum("blkgd,bskd->bkgls", qg, k.astype(jnp.float32)) * (hd ** -0.5)
        scores = jnp.where(attn_mask[:, None, None, :, :], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bkgls,bskd->blkgd", probs, v.astype(jnp.float32))
        out = out.reshape(b, l, h * hd).astype(self.dtype)
        return self.o_proj(out), kv


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) · up(x))."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, f = config.hidden_size, config.intermediate_size
        kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs, use_bias=config.mlp_bias)
        self.gate_proj = nnx.Linear(d, f, **kw)
        self.up_proj = nnx.Linear(d, f, **kw)
        self.down_proj = nnx.Linear(f, d, **kw)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)); x + mlp(norm(x))."""

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.self_attn = Attention(config, rngs=rngs, **kw)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.mlp = MLP(config, rngs=rngs, **kw)

    def __call__(self, x, cos, sin, attn_mask, kv=None, index=None):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, attn_mask, kv, index)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv


def positions_from_mask(attention_mask: jax.Array, start: jax.Array | None = None) -> jax.Array:
    """Rotary positions [B, L] int32: 0 at each row's first real token (left padding allowed).

    Padding positions get the position of the next real token minus one clipped at ``start``; they
    are masked out of attention, so their value never reaches a real token.

    Args:
      attention_mask: [B, L], 1 = real token.
      start: optional [B] int32 position of the first real token (cache continuation).
    """
    m = attention_mask.astype(jnp.int32)
    pos = jnp.maximum(jnp.cumsum(m, axis=-1) - 1, 0)
    if start is not None:
        pos = pos + start[:, None]
    return pos


class CausalLM(nnx.Module):
    """Decoder-only LM: embeddings, ``num_layers`` decoder blocks, final RMSNorm, LM head.

    Args:
      config: architecture.
      rngs: initialiser randomness (``nnx.Rngs(params=...)``); unused when built abstractly and
        filled from a checkpoint (:func:`prada_jax.lm.hf.load_hf`).
      dtype: activation / matmul dtype (attention softmax and logits are float32 regardless).
      param_dtype: parameter storage dtype.
    """

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
                 param_dtype=jnp.float32):
        self.config = config
        self.dtype = dtype
        kw = dict(dtype=dtype, param_dtype=param_dtype)
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs, **kw)
        self.layers = nnx.List([DecoderLayer(config, rngs=rngs, **kw)
                                for _ in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False,
                                      rngs=rngs, **kw)

    def hidden_states(self, input_ids, attention_mask=None, positions=None, cache=None):
        """Final normed hidden states [B, L, D] (and the updated cache when one is given)."""
        b, l = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, l), jnp.int32)
        mask = attention_mask.astype(jnp.int32)
        if cache is None:
            if positions is None:
                positions = positions_from_mask(mask)
            keys_valid = mask.astype(bool)                                    # [B, S=L]
            causal = jnp.arange(l)[None, :] <= jnp.arange(l)[:, None]        # [L, S]
            index = None
        else:
            if positions is None:
                positions = positions_from_mask(mask, cache.next_pos)
            index = cache.index
            new_mask = jax.lax.dynamic_update_slice(cache.mask, mask, (0, index))
            keys_valid = new_mask.astype(bool)
            slots = jnp.arange(cache.max_len)
            causal = slots[None, :] <= (index + jnp.arange(l))[:, None]
        attn_mask = keys_valid[:, None, :] & causal[None, :, :]
        cos, sin = rope_cos_sin(self.config, positions)
        x = self.embed_tokens(input_ids)
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            kv = None if cache is None else (cache.k[i], cache.v[i])
            x, kv = layer(x, cos, sin, attn_mask, kv, index)
            if cache is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        x = self.norm(x)
        if cache is None:
            return x, None
        cache = cache.replace(k=jnp.stack(new_k), v=jnp.stack(new_v), mask=new_mask,
                              index=index + l, next_pos=cache.next_pos + jnp.sum(mask, axis=-1))
        return x, cache

    def logits_from_hidden(self, x):
        """LM head: [B, L, D] → [B, L, V] float32."""
        if self.config.tie_word_embeddings:
            logits = self.embed_tokens.attend(x)
        else:
            logits = self.lm_head(x)
        return logits.astype(jnp.float32)

    def __call__(self, input_ids, attention_mask=None, positions=None, cache=None):
        """Forward pass.

        Args:
          input_ids: [B, L] int32 token ids.
          attention_mask: [B, L], 1 = real token, 0 = padding (left padding allowed); default all 1.
          positions: [B, L] int32 rotary positions; default derived from the mask (0 at each row's
            first real token, continuing from ``cache.next_pos`` with a cache), as transformers'
            ``generate`` does.
          cache: optional :class:`KVCache`; the L tokens are written at slots
            ``[cache.index, cache.index + L)``.

        Returns:
          logits [B, L, V] float32, or (logits, updated cache) when ``cache`` is given.
        """
        x, new_cache = self.hidden_states(input_ids, attention_mask, positions, cache)
        logits = self.logits_from_hidden(x)
        return logits if cache is None else (logits, new_cache)
