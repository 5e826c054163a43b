"""Distillation losses: pure float32 functions of student logits, teacher data and masks.

Axis letters: B batch, A action tokens, V vocabulary, k teacher top-k. Every loss returns
``(loss, per_token)``: ``per_token`` [B, A] float32 (0 where ``mask`` is 0) and ``loss`` the
mean over masked tokens (sum / max(#mask, 1)). Teacher values are constants (stop-gradient).

Teacher top-k + tail distribution over k + 1 buckets: bucket i < k is token ``topk_ids[i]``
with probability ``exp(topk_logp[i])``; bucket k ("tail") is every other token together with
mass ``tail_mass``. The student is mapped to the same buckets (its tail = 1 - Σ top-k, computed
as a masked log-sum-exp, so it stays exact at extreme logits).

Temperature τ (forward KL and JSD): student log-probs are ``log_softmax(logits / τ)``;
the teacher's bucket log-probs are divided by τ and renormalised over the k + 1 buckets. For
τ ≠ 1 the tail bucket is treated as one atom, an approximation that is exact when the tail is
empty. The loss is not rescaled by τ².
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = -1e30


def _masked_mean(per_token: jax.Array, mask: jax.Array) -> jax.Array:
    mask = mask.astype(jnp.float32)
    per_token = jnp.where(mask > 0, per_token, 0.0)
    return per_token.sum() / jnp.maximum(mask.sum(), 1.0), per_token


def _student_buckets(logits: jax.Array, topk_ids: jax.Array, temperature: float):
    """Student log-probs on the k + 1 buckets: [B, A, k + 1]."""
    z = logits.astype(jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1, keepdims=True)
    logp = z - lse
    top = jnp.take_along_axis(logp, topk_ids, axis=-1)
    V = z.shape[-1]
    in_top = _scatter_mask(topk_ids, V)
    tail = jax.nn.logsumexp(jnp.where(in_top, _NEG, z), axis=-1) - lse[..., 0]
    return jnp.concatenate([top, tail[..., None]], axis=-1)


def _scatter_mask(topk_ids: jax.Array, V: int) -> jax.Array:
    flat = topk_ids.reshape(-1, topk_ids.shape[-1])
    m = jax.vmap(lambda ids: jnp.zeros((V,), bool).at[ids].set(True))(flat)
    return m.reshape(*topk_ids.shape[:-1], V)


def _teacher_buckets(topk_logp: jax.Array, tail_mass: jax.Array, temperature: float):
    """Teacher log-probs on the k + 1 buckets, tempered and renormalised: [B, A, k + 1]."""
    tl = jnp.log(jnp.clip(tail_mass.astype(jnp.float32), 0.0, 1.0))
    lp = jnp.concatenate([topk_logp.astype(jnp.float32), tl[..., None]], axis=-1)
    lp = jax.lax.stop_gradient(lp / temperature)
    return lp - jax.nn.logsumexp(lp, axis=-1, keepdims=True)


def _kl(logp: jax.Array, logq: jax.Array) -> jax.Array:
    """Σ p (log p − log q) over the last axis, with 0·log 0 = 0."""
    p = jnp.exp(logp)
    return jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1)


def forward_kl_topk(logits, topk_ids, topk_logp, tail_mass, mask, temperature: float = 1.0):
    """KL(teacher || student) on the top-k + tail buckets.

    Args:
      logits: [B, A, V] student logits at the positions that predict the action tokens.
      topk_ids: [B, A, k] int32 teacher top-k ids; topk_logp: [B, A, k] their log-probs.
      tail_mass: [B, A] teacher probability outside the top-k (in [0, 1]).
      mask: [B, A] 1 = counted.
      temperature: τ > 0 (see the module docstring).
    """
    ls = _student_buckets(logits, topk_ids, temperature)
    lt = _teacher_buckets(topk_logp, tail_mass, temperature)
    return _masked_mean(_kl(lt, ls), mask)


def generalized_jsd_topk(logits, topk_ids, topk_logp, tail_mass, mask, beta: float = 0.5,
                         temperature: float = 1.0, include_tail: bool = True):
    """Generalised Jensen–Shannon divergence JSD(β) on the teacher's top-k support.

    With P = teacher, Q = student on the buckets (top-k, plus the tail bucket when
    ``include_tail``; without it both are renormalised over the top-k ids) and
    M = β P + (1 − β) Q: ``JSD(β) = β KL(P || M) + (1 − β) KL(Q || M)``. β must lie in (0, 1);
    β = 0.5 is the symmetric JSD.
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must lie in (0, 1), got {beta!r}")
    ls = _student_buckets(logits, topk_ids, temperature)
    lt = _teacher_buckets(topk_logp, tail_mass, temperature)
    if not include_tail:
        ls = ls[..., :-1] - jax.nn.logsumexp(ls[..., :-1], axis=-1, keepdims=True)
        lt = lt[..., :-1] - jax.nn.logsumexp(lt[..., :-1], axis=-1, keepdims=True)
    lm = jnp.logaddexp(jnp.log(beta) + lt, jnp.log1p(-beta) + ls)
    per = beta * _kl(lt, lm) + (1.0 - beta) * _kl(ls, lm)
    return _masked_mean(per, mask)


def token_logprobs(logits, tokens, temperature: float = 1.0):
    """[B, A] float32 log π(tokens) under ``log_softmax(logits / τ)``."""
    z = logits.astype(jnp.float32) / temperature
    logp = z - jax.nn.logsumexp(z, axis=-1, keepdims=True)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def reverse_kl_pg(logits, sampled, teacher_logp, mask, coef: float = 1.0):
    """Per-token reverse-KL estimate on student-sampled tokens, as a policy-gradient loss.

    With y ~ π_S the sampled tokens, ``a = stopgrad(log π_S(y) − log π_T(y))`` and
    ``loss = coef · mean(a · log π_S(y))``. Its value's expectation is not the KL, but its
    gradient is an unbiased estimate of ∇ KL(π_S || π_T) (because E[∇ log π_S] = 0). The
    second return value is the per-token KL estimate ``log π_S(y) − log π_T(y)`` (mean over
    samples is unbiased for KL(π_S || π_T)); this is what to log.

    Args:
      logits: [B, A, V] student logits predicting the sampled tokens.
      sampled: [B, A] int32 student-sampled tokens; teacher_logp: [B, A] log π_T(y).
      mask: [B, A]; coef: loss coefficient.

    Returns:
      (loss, per_token_kl_estimate [B, A]).
    """
    lp = token_logprobs(logits, sampled)
    adv = jax.lax.stop_gradient(lp - teacher_logp.astype(jnp.float32))
    loss, _ = _masked_mean(adv * lp, mask)
    _, est = _masked_mean(adv, mask)
    return coef * loss, est


def sft_cross_entropy(logits, targets, mask):
    """Plain cross-entropy −log π_S(target) on teacher tokens (SFT baseline)."""
    return _masked_mean(-token_logprobs(logits, targets), mask)


def full_teacher_logp(topk_ids, topk_logp, tail_mass, vocab_size: int, floor: float = -1e4):
    """The teacher's log-probs on the whole vocabulary [B, A, V] from its top-k + tail export:
    each top-k id gets its log-prob, every other id an equal share of ``tail_mass``
    (``log(tail / (V − k))``). Exact when the tail is empty, i.e. when ``k`` = ``V``
    (``loss.top_k`` = the task's vocabulary). Clipped below at ``floor`` so that a student
    token the teacher gives probability 0 costs a large but finite amount (and a finite
    gradient). Constant (stop-gradient)."""
    k = topk_ids.shape[-1]
    tail = jnp.clip(tail_mass.astype(jnp.float32), 0.0, 1.0)
    rest = jnp.log(jnp.maximum(tail, 0.0) / max(vocab_size - k, 1))
    base = jnp.broadcast_to(rest[..., None], (*topk_ids.shape[:-1], vocab_size))
    flat_ids = topk_ids.reshape(-1, k)
    flat_lp = topk_logp.astype(jnp.float32).reshape(-1, k)
    full = jax.vmap(lambda b, i, v: b.at[i].set(v))(base.reshape(-1, vocab_size), flat_ids,
                                                    flat_lp)
    full = jnp.maximum(full.reshape(*topk_ids.shape[:-1], vocab_size), floor)
    return jax.lax.stop_gradient(full)


def reverse_kl_exact(logits, topk_ids, topk_logp, tail_mass, mask):
    """The exact per-token reverse KL ``KL(π_S || π_T) = Σ_v π_S(v) (log π_S(v) − log π_T(v))``
    over the whole vocabulary at every masked position, differentiated directly (no sampling:
    the primary loss arm of issue 44). The teacher's distribution comes from its top-k + tail
    export (:func:`full_teacher_logp`): exact when ``k`` equals the vocabulary size.

    Returns (loss = mean over masked tokens, per-token KL [B, A])."""
    z = logits.astype(jnp.float32)
    ls = z - jax.nn.logsumexp(z, axis=-1, keepdims=True)
    lt = full_teacher_logp(topk_ids, topk_logp, tail_mass, z.shape[-1])
    per = jnp.sum(jnp.exp(ls) * (ls - lt), axis=-1)
    return _masked_mean(per, mask)


def reverse_kl_pg_baseline(logits, sampled, teacher_logp, mask, coef: float = 1.0):
    """:func:`reverse_kl_pg` with a per-token mean baseline: the advantage of each sampled
    token is ``x_i − b_i`` with ``x_i = log π_S(y_i) − log π_T(y_i)`` and ``b_i`` the mean of
    the *other* masked tokens' ``x`` in the batch (leave-one-out, so ``b_i`` does not depend on
    ``y_i`` and the gradient stays unbiased; 0 when the batch holds one token). The second
    return value is the per-token KL estimate ``x`` (the same as :func:`reverse_kl_pg`'s)."""
    lp = token_logprobs(logits, sampled)
    m = mask.astype(jnp.float32)
    x = jax.lax.stop_gradient(lp - teacher_logp.astype(jnp.float32))
    n = m.sum()
    s = jnp.sum(jnp.where(m > 0, x, 0.0))
    b = jnp.where(n > 1, (s - x) / jnp.maximum(n - 1.0, 1.0), 0.0)
    loss, _ = _masked_mean((x - b) * lp, mask)
    _, est = _masked_mean(x, mask)
    return coef * loss, est
