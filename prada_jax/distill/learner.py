"""ReOPD learner: the jitted distillation step (offline / on-policy), one per mode.

One compiled ``train_step(state, batch) -> (state, metrics)`` per mode. The model input is
``concat(prompt, action)`` [B, P + A] (:mod:`prada_jax.distill.sampler` layout); the logits at
columns ``P - 1 .. P + A - 2`` predict the action tokens.

Modes (``config.mode``):

* ``offline``: the action is the teacher's recorded turn-t tokens; ``config.loss`` is
  ``fkl`` (forward KL on the exported top-k + tail), ``jsd`` (JSD(β) on the same buckets) or
  ``sft`` (cross-entropy on the teacher tokens, the SFT baseline).
* ``onpolicy`` (ReOPD as published): each round the student samples the turn-t action after the
  replayed prefix (``prada_jax.lm.sampling.generate``), the PyTorch teacher scores the sampled
  tokens in-process (a scoring function passed in: no environment calls), and the loss is the
  per-token reverse-KL policy gradient (``rkl_coef``) plus optionally ``fkl_coef`` × the
  top-k forward KL at the sampled positions.

Gradient accumulation uses ``optax.MultiSteps`` (every ``grad_accum`` micro-batches one
optimizer update); learning rate: linear warm-up + cosine decay (AdamW).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from prada_jax.distill import losses
from prada_jax.distill.opd import RoundStats
from prada_jax.lm.sampling import generate


RKL_ESTIMATORS = ("pg", "pg_baseline", "exact")   # on-policy / OPD reverse-KL loss arms


@struct.dataclass
class TrainState:
    """params / opt_state: pytrees of the student's nnx.Param state and the optimizer; step:
    micro-steps done (int32); key: typed PRNG key for on-policy sampling."""

    params: Any
    opt_state: Any
    step: Any
    key: Any


def make_optimizer(lr: float, warmup_steps: int, total_steps: int, weight_decay: float,
                   clip_norm: float, grad_accum: int) -> optax.GradientTransformation:
    """AdamW with warm-up + cosine over ``total_steps`` optimizer updates, clipped, accumulated
    over ``grad_accum`` micro-steps."""
    warm = max(1, warmup_steps)   # a 1-update ramp stands for "no warm-up"
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warm, max(total_steps, warm + 1),
                                               lr * 0.1)
    tx = optax.chain(optax.clip_by_global_norm(clip_norm),
                     optax.adamw(sched, b1=0.9, b2=0.98, weight_decay=weight_decay))
    if grad_accum > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=grad_accum)
    return tx


def init_state(model, tx, key) -> tuple[Any, TrainState]:
    """Splits the NNX model into (graphdef, TrainState)."""
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, TrainState(params=params, opt_state=tx.init(params),
                                step=jnp.zeros((), jnp.int32), key=key)


def _action_logits(graphdef, params, prompt, prompt_mask, action, action_valid):
    """Student logits [B, A, V] predicting each action token."""
    model = nnx.merge(graphdef, params)
    ids = jnp.concatenate([prompt, action], axis=1)
    mask = jnp.concatenate([prompt_mask, action_valid], axis=1).astype(jnp.int32)
    logits = model(ids, mask)
    P, A = prompt.shape[1], action.shape[1]
    return jax.lax.dynamic_slice_in_dim(logits, P - 1, A, axis=1).astype(jnp.float32)


def per_turn_sums(per_token, mask, turn, num_turns: int):
    """Per-sample mean of ``per_token`` over its masked tokens, summed by turn index.

    Returns ([num_turns] sums, [num_turns] counts of samples)."""
    m = mask.astype(jnp.float32)
    per_sample = per_token.sum(-1) / jnp.maximum(m.sum(-1), 1.0)
    has = (m.sum(-1) > 0).astype(jnp.float32)
    sums = jax.ops.segment_sum(per_sample * has, turn, num_segments=num_turns)
    counts = jax.ops.segment_sum(has, turn, num_segments=num_turns)
    return sums, counts


def make_train_step(graphdef, tx, mode: str, loss: str, *, temperature: float = 1.0,
                    beta: float = 0.5, rkl_coef: float = 1.0, fkl_coef: float = 0.0,
                    num_turns: int = 8, num_seeds: int = 1,
                    rkl_estimator: str = "pg") -> Callable:
    """Builds the jitted ``train_step(state, batch) -> (state, metrics)``.

    ``rkl_estimator`` (on-policy and OPD only): ``"pg"`` the single-sample reverse-KL policy
    gradient (:func:`~prada_jax.distill.losses.reverse_kl_pg`, the published estimator),
    ``"pg_baseline"`` the same with a leave-one-out per-token mean baseline
    (:func:`~prada_jax.distill.losses.reverse_kl_pg_baseline`), ``"exact"`` the exact per-token
    reverse KL over the teacher's exported distribution
    (:func:`~prada_jax.distill.losses.reverse_kl_exact`; exact when the export's top-k covers
    the vocabulary); the logged ``kl`` is then the exact per-token KL, not a sample estimate.

    ``num_seeds`` > 1: the step is ``vmap``-ped over a leading seed axis of ``state`` (stacked
    parameters and optimiser states, :func:`stack_states`) and of every ``batch`` array
    ([N, B, ...]); every metric gets the same leading axis [N, ...]. One compiled program
    updates all N students.

    ``batch`` (arrays): prompt [B, P], prompt_mask [B, P], action [B, A], action_valid [B, A]
    (real tokens), action_mask [B, A] (loss), turn [B]; offline fkl/jsd and on-policy also
    topk_ids [B, A, k], topk_logp [B, A, k], tail_mass [B, A]; on-policy also teacher_logp
    [B, A] (teacher log-prob of the sampled tokens).
    """
    if mode not in ("offline", "onpolicy"):
        raise ValueError(f"mode must be 'offline' or 'onpolicy', got {mode!r}")
    if mode == "offline" and loss not in ("fkl", "jsd", "sft"):
        raise ValueError(f"offline loss must be fkl, jsd or sft, got {loss!r}")
    if rkl_estimator not in RKL_ESTIMATORS:
        raise ValueError(f"rkl_estimator must be one of {RKL_ESTIMATORS}, got {rkl_estimator!r}")

    def loss_fn(params, batch):
        logits = _action_logits(graphdef, params, batch["prompt"], batch["prompt_mask"],
                                batch["action"], batch["action_valid"])
        mask = batch["action_mask"]
        aux = {}
        if mode == "offline":
            if loss == "fkl":
                val, per = losses.forward_kl_topk(logits, batch["topk_ids"], batch["topk_logp"],
                                                  batch["tail_mass"], mask, temperature)
            elif loss == "jsd":
                val, per = losses.generalized_jsd_topk(logits, batch["topk_ids"],
                                                       batch["topk_logp"], batch["tail_mass"],
                                                       mask, beta, temperature)
            else:
                val, per = losses.sft_cross_entropy(logits, batch["action"], mask)
            # KL(teacher||student) at the teacher tokens, logged for every loss
            _, kl_tok = losses.forward_kl_topk(jax.lax.stop_gradient(logits),
                                               batch["topk_ids"], batch["topk_logp"],
                                               batch["tail_mass"], mask)
        elif rkl_estimator == "exact":
            val, kl_tok = losses.reverse_kl_exact(logits, batch["topk_ids"], batch["topk_logp"],
                                                  batch["tail_mass"], mask)
            val = rkl_coef * val
        elif rkl_estimator == "pg_baseline":
            val, kl_tok = losses.reverse_kl_pg_baseline(logits, batch["action"],
                                                        batch["teacher_logp"], mask, rkl_coef)
        else:
            val, kl_tok = losses.reverse_kl_pg(logits, batch["action"], batch["teacher_logp"],
                                               mask, rkl_coef)
            if fkl_coef > 0:
                f, _ = losses.forward_kl_topk(logits, batch["topk_ids"], batch["topk_logp"],
                                              batch["tail_mass"], mask, temperature)
                val = val + fkl_coef * f
                aux["fkl"] = f
        m = mask.astype(jnp.float32)
        aux["kl"] = (kl_tok * m).sum() / jnp.maximum(m.sum(), 1.0)
        aux["kl_turn_sum"], aux["kl_turn_count"] = per_turn_sums(kl_tok, mask, batch["turn"],
                                                                 num_turns)
        aux["tokens"] = m.sum()
        return val, aux

    def train_step(state: TrainState, batch):
        (val, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(aux, loss=val, grad_norm=optax.global_norm(grads))
        return state.replace(params=params, opt_state=opt_state, step=state.step + 1), metrics

    if num_seeds > 1:
        return jax.jit(jax.vmap(train_step), donate_argnums=0)
    return jax.jit(train_step, donate_argnums=0)


def stack_states(states) -> TrainState:
    """Stacks per-seed :class:`TrainState`s along a new leading seed axis [N, ...]."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def seed_slice(tree, i: int):
    """Seed ``i`` of a seed-stacked pytree (every leaf indexed on its leading axis)."""
    return jax.tree.map(lambda x: x[i], tree)


def student_logits_fn(graphdef) -> Callable:
    """jit(params, ids [B, L], mask [B, L]) -> logits [B, L, V] float32."""

    @jax.jit
    def fn(params, ids, mask):
        return nnx.merge(graphdef, params)(ids, mask).astype(jnp.float32)

    return fn


def onpolicy_round(graphdef, params, key, tb, teacher_score_fn, *, max_new_tokens: int,
                   temperature: float, top_p: float, stop_ids, pad_id: int, prompt_tokens):
    """One on-policy scoring round (host side): the student samples each turn's action after
    its replayed prefix, the teacher scores the sampled tokens.

    Args:
      tb: a :class:`~prada_jax.distill.sampler.TurnBatch` (prompt left-padded).
      teacher_score_fn: list of token lists -> list of score dicts (exporter contract).
      prompt_tokens: list of the unpadded prefixes (token lists) of the batch rows.

    Returns:
      dict of arrays for ``train_step`` (action = student tokens), the number of generated
      tokens, and a :class:`prada_jax.distill.opd.RoundStats` (counts; ``rollout_s`` = student
      generation, ``scoring_s`` = the teacher's scoring; no tool calls).
    """

    t0 = time.perf_counter()
    model = nnx.merge(graphdef, params)
    toks, _, lengths = generate(model, tb.prompt, tb.prompt_mask, key=key,
                                max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=top_p, stop_token_ids=stop_ids, pad_token_id=pad_id)
    toks, lengths = np.asarray(toks), np.asarray(lengths)
    t1 = time.perf_counter()
    B, A = toks.shape
    seqs = [list(prompt_tokens[b]) + toks[b, :lengths[b]].tolist() for b in range(B)]
    scores = teacher_score_fn(seqs)
    t2 = time.perf_counter()
    k = int(np.asarray(scores[0]["topk_ids"]).shape[-1])
    tlogp = np.zeros((B, A), np.float32)
    ids = np.zeros((B, A, k), np.int32)
    tlp = np.full((B, A, k), -1e4, np.float32)
    tail = np.ones((B, A), np.float32)
    for b in range(B):
        n, g = len(prompt_tokens[b]), int(lengths[b])
        sl = slice(n - 1, n - 1 + g)  # entry i predicts token i + 1
        tlogp[b, :g] = scores[b]["logp_actual"][sl]
        ids[b, :g] = scores[b]["topk_ids"][sl]
        tlp[b, :g] = scores[b]["topk_logp"][sl]
        tail[b, :g] = np.clip(scores[b]["tail_mass"][sl], 0.0, 1.0)
    valid = (np.arange(A)[None, :] < lengths[:, None]).astype(np.int32)
    batch = dict(prompt=tb.prompt, prompt_mask=tb.prompt_mask, action=toks.astype(np.int32),
                 action_valid=valid, action_mask=valid, turn=tb.turn, teacher_logp=tlogp,
                 topk_ids=ids, topk_logp=tlp, tail_mass=tail)
    n = int(lengths.sum())
    stats = RoundStats(supervised_turns=int(np.sum(lengths > 0)), student_tokens=n,
                       teacher_tokens_scored=n, teacher_tokens_forwarded=sum(map(len, seqs)),
                       rollout_s=t1 - t0, scoring_s=t2 - t1)
    return batch, n, stats
