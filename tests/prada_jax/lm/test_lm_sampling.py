"""generate(): greedy parity with transformers, sampling distribution, stops, padding, jit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from prada_jax.lm import hf, sampling

from tests.helpers.hf_lm import padded_batch

jax.config.update("jax_default_matmul_precision", "highest")

# Shapes shared between tests so they share generate()'s compiled programs: prompts [3, 7]
# and 8 new tokens (greedy with stop (2,), or sampling with 3 stop ids).
LENGTH, NEW = 7, 8


def test_greedy_matches_transformers_generate(hf_dirs):
    import torch
    path, tmodel = hf_dirs("qwen2-gqa-tied")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size, length=LENGTH, seed=4)
    n = NEW
    toks, logps, lengths = sampling.generate(model, ids, mask, key=jax.random.key(0),
                                             max_new_tokens=n, stop_token_ids=(2,),
                                             pad_token_id=0)
    with torch.no_grad():
        ref = tmodel.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                              max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=0,
                              min_new_tokens=0)
    ref = ref[:, ids.shape[1]:].numpy()
    ref = np.pad(ref, ((0, 0), (0, n - ref.shape[1])))  # HF stops early when all rows are done
    np.testing.assert_array_equal(np.asarray(toks), ref)
    assert np.asarray(lengths).min() >= 1


def _teacher_forced_logps(model, ids, mask, toks, lengths):
    """Log-probs of generated tokens from one full forward over prompt + continuation."""
    full = np.concatenate([ids, np.asarray(toks)], axis=1)
    n = toks.shape[1]
    cont_mask = (np.arange(n)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    fmask = np.concatenate([mask, cont_mask], axis=1)
    # jitted: an eager NNX forward compiles every op on its own (slower than one program)
    logits = np.asarray(nnx.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(full),
                                                         jnp.asarray(fmask)))
    logp = jax.nn.log_softmax(logits, axis=-1)
    l = ids.shape[1]
    pred = np.asarray(logp)[:, l - 1:l - 1 + n]
    out = np.take_along_axis(pred, np.asarray(toks)[..., None], axis=-1)[..., 0]
    return np.where(cont_mask > 0, out, 0.0)


def test_sampled_logprobs_match_full_forward(hf_dirs):
    path, _ = hf_dirs("llama-gqa-untied-nobias")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size, length=LENGTH, seed=6)
    kw = dict(max_new_tokens=NEW, temperature=0.9, top_p=0.95, stop_token_ids=(5, 6, 7))
    toks, logps, lengths = sampling.generate(model, ids, mask, key=jax.random.key(1), **kw)
    ref = _teacher_forced_logps(model, ids, mask, toks, lengths)
    np.testing.assert_allclose(np.asarray(logps), ref, atol=1e-4, rtol=0)
    # Same key → same tokens; a different key → different tokens (at T=0.9 on 24 draws).
    again = sampling.generate(model, ids, mask, key=jax.random.key(1), **kw)
    np.testing.assert_array_equal(np.asarray(again[0]), np.asarray(toks))
    other = sampling.generate(model, ids, mask, key=jax.random.key(2), **kw)
    assert not np.array_equal(np.asarray(other[0]), np.asarray(toks))


def test_stop_tokens_and_padding_after_stop(hf_dirs):
    path, _ = hf_dirs("qwen2-gqa-tied")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size, length=7, seed=7)
    toks, logps, lengths = sampling.generate(model, ids, mask, key=jax.random.key(3),
                                             max_new_tokens=12, temperature=1.5,
                                             stop_token_ids=tuple(range(3, 120)), pad_token_id=1)
    toks, logps, lengths = map(np.asarray, (toks, logps, lengths))
    for b in range(3):
        n = lengths[b]
        stops = [i for i in range(12) if 3 <= toks[b, i] < 120]
        assert n == (stops[0] + 1 if stops else 12)
        assert (toks[b, n:] == 1).all() and (logps[b, n:] == 0).all()
        assert (logps[b, :n] < 0).all()


def test_left_padded_batch_equals_rows_alone(hf_dirs):
    path, _ = hf_dirs("qwen2-gqa-tied")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size, length=LENGTH, seed=8)
    kw = dict(max_new_tokens=NEW, stop_token_ids=(2,), pad_token_id=0)  # greedy
    toks, _, _ = sampling.generate(model, ids, mask, key=jax.random.key(0), **kw)
    for b, pad in [(2, 5)]:  # the most padded row (one extra compile per prompt length)
        alone, _, _ = sampling.generate(model, ids[b:b + 1, pad:], key=jax.random.key(0),
                                        **kw)
        np.testing.assert_array_equal(np.asarray(alone)[0], np.asarray(toks)[b])


def test_compiles_once_for_sampling_settings(hf_dirs):
    """Three temperature/top-p settings add at most one program to generate()'s cache (none
    when the shapes of ``test_sampled_logprobs_match_full_forward`` were compiled before);
    with the settings static they would add three."""
    path, _ = hf_dirs("llama-gqa-untied-nobias")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size, length=LENGTH, seed=9)
    before = sampling._generate_jit._cache_size()
    for t, p, seed in [(0.7, 0.9, 0), (1.3, 0.5, 1), (1.0, 1.0, 2)]:
        sampling.generate(model, ids, mask, key=jax.random.key(seed), max_new_tokens=NEW,
                          temperature=t, top_p=p, stop_token_ids=(5, 6, 7))
    assert sampling._generate_jit._cache_size() - before <= 1


def _nucleus_reference(logits, temperature, top_p):
    """NumPy nucleus distribution: sort descending, keep until the mass reaches top_p."""
    z = logits / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    out = np.zeros_like(p)
    mass = 0.0
    for i in order:
        if mass >= top_p:
            break
        out[i] = p[i]
        mass += p[i]
    return out / out.sum()


# temperature and top_p are traced: one program for every parametrized case
_draw = jax.jit(jax.vmap(lambda k, lg, t, p: sampling.sample_logits(k, lg[None], t, p)[0],
                         in_axes=(0, None, None, None)))


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8), (2.0, 0.5)],
                         ids=["plain", "t0.7-p0.8", "t2-p0.5"])
def test_sampling_frequencies_match_reference(temperature, top_p):
    logits = np.array([2.0, 1.0, 0.5, 0.1, -1.0, -3.0], np.float32)
    n = 40000
    keys = jax.random.split(jax.random.key(0), n)
    counts = np.bincount(np.asarray(_draw(keys, logits, temperature, top_p)),
                         minlength=logits.size)
    ref = _nucleus_reference(logits.astype(np.float64), temperature, top_p)
    assert (counts[ref == 0] == 0).all()
    sigma = np.sqrt(ref * (1 - ref) / n)
    np.testing.assert_array_less(np.abs(counts / n - ref), 5 * sigma + 1e-12)


def test_greedy_and_top_p_edge_cases():
    logits = jnp.array([[0.1, 3.0, 0.2], [5.0, 1.0, 1.0]])
    # jitted: eagerly, every op compiles on its own
    greedy = jax.jit(lambda k, lg: sampling.sample_logits(k, lg, 1.0, 1.0, greedy=True))
    np.testing.assert_array_equal(np.asarray(greedy(jax.random.key(0), logits)), [1, 0])
    # A tiny nucleus keeps only the argmax.
    many = jax.jit(jax.vmap(lambda k: sampling.sample_logits(k, logits, 1.0, 1e-6)))(
        jax.random.split(jax.random.key(0), 200))
    assert (np.asarray(many) == np.array([1, 0])).all()


class _CharTokenizer:
    def decode(self, ids):
        return "".join(chr(ord("a") + i % 26) if i != 0 else "\n" for i in ids)


def test_truncate_at_stop_strings():
    toks = np.array([[1, 2, 0, 0, 3, 4], [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 0]])
    lengths = np.array([6, 6, 1])
    out = sampling.truncate_at_stop_strings(_CharTokenizer(), toks, lengths, ["\n\n", "cde"])
    np.testing.assert_array_equal(out, [4, 4, 1])


def test_generate_rejects_bad_arguments(hf_dirs):
    path, _ = hf_dirs("qwen2-gqa-tied")
    model, _ = hf.load_hf(path)
    ids = np.ones((2, 3), np.int32)
    with pytest.raises(ValueError, match="left-padded"):
        sampling.generate(model, ids, np.array([[1, 1, 0], [1, 1, 1]]), key=jax.random.key(0),
                          max_new_tokens=2)
    with pytest.raises(ValueError, match="top_p"):
        sampling.generate(model, ids, key=jax.random.key(0), max_new_tokens=2, top_p=0.0)
