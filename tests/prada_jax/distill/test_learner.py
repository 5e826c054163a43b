"""Train step: one compile, gradient accumulation equals the big batch, bf16 finite, and the
offline loss decreases on a fixed batch."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax.distill import pool as P
from prada_jax.distill.sampler import TurnSampler
from prada_jax.distill.task import arith
from prada_jax.distill.learner import init_state, make_optimizer, make_train_step
from prada_jax.lm.config import LMConfig
from prada_jax.lm.model import CausalLM


@functools.lru_cache(maxsize=None)
def _split_model(dtype):
    cfg = LMConfig(vocab_size=24, hidden_size=16, intermediate_size=32, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    return nnx.split(CausalLM(cfg, rngs=nnx.Rngs(params=0), dtype=dtype))


def _model(dtype=jnp.float32):
    """A fresh copy of the same tiny model (initialised once: an eager init compiles every
    initialiser on its own). The arrays are copied: the train step donates its state."""
    graphdef, state = _split_model(dtype)
    return nnx.merge(graphdef, jax.tree.map(lambda x: jax.device_put(np.array(x)), state))


def _batches(n_batches, B):
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(2, 8)))
    pool = P.make_pool(P.build_arrays(trajs, spans, [1] * 8), {})
    s = TurnSampler(pool, kappa=0.6)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n_batches):
        tb = s.sample(rng, B)
        # synthetic teacher: one-hot on the actual token (top-1) with a small tail
        ids = np.stack([tb.action, (tb.action + 1) % 24], -1).astype(np.int32)
        lp = np.log(np.stack([np.full(tb.action.shape, 0.8), np.full(tb.action.shape, 0.15)],
                             -1)).astype(np.float32)
        out.append(dict(prompt=tb.prompt, prompt_mask=tb.prompt_mask, action=tb.action,
                        action_valid=(tb.action_pos >= 0).astype(np.int32),
                        action_mask=np.broadcast_to(tb.action_mask[:, :1], tb.action.shape
                                                    ).astype(np.int32),  # equal counts/row
                        turn=tb.turn, topk_ids=ids, topk_logp=lp,
                        tail_mass=np.full(tb.action.shape, 0.05, np.float32)))
    return out


def test_grad_accumulation_loss_decrease_and_bf16():
    b1, b2 = _batches(2, 4)
    big = {k: np.concatenate([b1[k], b2[k]]) for k in b1}
    tx_acc = make_optimizer(1e-2, 1, 30, 0.0, 1e9, grad_accum=2)
    gd, st = init_state(_model(), tx_acc, jax.random.key(0))
    step = make_train_step(gd, tx_acc, "offline", "fkl", num_turns=4)
    st, m1 = step(st, b1)
    st, _ = step(st, b2)
    assert step._cache_size() == 1  # one compiled program for both micro-steps
    # two accumulated micro-batches == one update on their concatenation
    tx = make_optimizer(1e-2, 1, 30, 0.0, 1e9, grad_accum=1)
    gd2, st2 = init_state(_model(), tx, jax.random.key(0))
    big_step = make_train_step(gd2, tx, "offline", "fkl", num_turns=4)
    st2, m = big_step(st2, big)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6),
                 nnx.to_pure_dict(st.params), nnx.to_pure_dict(st2.params))
    assert np.isfinite(float(m1["loss"])) and m1["kl_turn_sum"].shape == (4,)
    # the loss decreases on a fixed batch
    first = float(m["loss"])
    for _ in range(14):
        st2, m = big_step(st2, big)
    assert float(m["loss"]) < 0.7 * first
    # bf16 compute: finite loss and gradients, params stay float32
    gdb, stb = init_state(_model(jnp.bfloat16), tx, jax.random.key(0))
    stb, mb = make_train_step(gdb, tx, "offline", "fkl", num_turns=4)(stb, big)
    assert np.isfinite(float(mb["loss"])) and np.isfinite(float(mb["grad_norm"]))
    assert jax.tree.leaves(stb.params)[0].dtype == jnp.float32


def test_bucketed_prompts_give_the_same_step_within_float_tolerance():
    """Cutting the left padding of a batch's prompts to a bucket (``train.prompt_bucket``)
    changes no number beyond float reassociation: loss, KL, per-turn sums and the updated
    parameters of one step equal the full-width step's."""
    from prada_jax.distill.batches import bucket_width, bucketed
    assert [bucket_width(n, 40, 16) for n in (0, 1, 16, 17, 33, 40)] == [16, 16, 16, 32, 40, 40]
    assert bucket_width(5, 40, 0) == 40
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(2, 16)))
    pool = P.make_pool(P.build_arrays(trajs, spans, [1] * 16), {})
    s = TurnSampler(pool, kappa=0.6)
    tb = s.sample(np.random.default_rng(1), 8)
    cut = bucketed(tb, 8)
    longest = int(tb.prompt_mask.sum(1).max())
    assert cut.prompt.shape[1] == bucket_width(longest, s.P, 8) < s.P
    np.testing.assert_array_equal(cut.prompt_mask.sum(1), tb.prompt_mask.sum(1))

    def as_batch(t):
        ids = np.stack([t.action, (t.action + 1) % 24], -1).astype(np.int32)
        lp = np.log(np.stack([np.full(t.action.shape, 0.8), np.full(t.action.shape, 0.15)],
                             -1)).astype(np.float32)
        return dict(prompt=t.prompt, prompt_mask=t.prompt_mask, action=t.action,
                    action_valid=(t.action_pos >= 0).astype(np.int32),
                    action_mask=t.action_mask, turn=t.turn, topk_ids=ids, topk_logp=lp,
                    tail_mass=np.full(t.action.shape, 0.05, np.float32))

    out = []
    for t in (tb, cut):
        tx = make_optimizer(1e-2, 1, 30, 0.0, 1e9, grad_accum=1)
        gd, st = init_state(_model(), tx, jax.random.key(0))
        st, m = make_train_step(gd, tx, "offline", "fkl", num_turns=4)(st, as_batch(t))
        out.append((nnx.to_pure_dict(st.params), jax.device_get(m)))
    (pa, ma), (pb, mb) = out
    for k in ("loss", "kl", "kl_turn_sum", "kl_turn_count", "grad_norm"):
        np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5, atol=1e-6, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), pa, pb)
