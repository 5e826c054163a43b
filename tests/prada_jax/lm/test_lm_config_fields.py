"""Flax CausalLM vs transformers for config fields that differ from the defaults: RMSNorm ε,
head_dim ≠ hidden/heads, rope θ and scaling variants, attention/MLP biases, tied and untied
heads. Each case changes fields the fixtures of ``test_lm_parity.py`` leave at their default,
so a loader that drops one of them (reads the default instead) fails here."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from prada_jax.lm import hf

from tests.helpers.hf_lm import build_torch_model, padded_batch, torch_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

jax.config.update("jax_default_matmul_precision", "highest")
ATOL = 1e-4

# Every case differs from LMConfig's defaults (ε 1e-6, θ 1e4, head_dim = hidden/heads,
# plain rope) in at least the fields named in its id.
FIELD_CASES = {
    "llama-eps1e-5": dict(arch="llama", eps=1e-5),
    "llama-eps1e-2-tied": dict(arch="llama", eps=1e-2, tie=True),
    "qwen2-eps1e-4-headdim24": dict(arch="qwen2", eps=1e-4, head_dim=24),
    "llama-headdim4-mlpbias-attnbias": dict(arch="llama", head_dim=4, heads=8, kv=2,
                                            bias=True, mlp_bias=True),
    "llama-theta50-linear": dict(arch="llama", theta=50.0,
                                 rope={"rope_type": "linear", "factor": 3.0}),
    "qwen2-theta1e6-yarn-tied": dict(arch="qwen2", theta=1e6, tie=True,
                                     rope={"rope_type": "yarn", "factor": 2.0,
                                           "original_max_position_embeddings": 8}),
    "llama-llama3-headdim12": dict(arch="llama", head_dim=12,
                                   rope={"rope_type": "llama3", "factor": 4.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 2.0,
                                         "original_max_position_embeddings": 8}),
}


def _torch_model(**kw):
    """A random tiny HF model with every parameter (norms, biases) perturbed; activations
    are kept small (embeddings σ = 0.05) so RMSNorm's ε is visible in the logits."""
    return build_torch_model(**dict(dict(hidden=32, vocab=96, max_pos=64, scale=0.3,
                                         embed_scale=0.05), **kw))


@pytest.mark.parametrize("case", list(FIELD_CASES))
def test_non_default_fields_match_transformers(case, tmp_path):
    kw = FIELD_CASES[case]
    tmodel = _torch_model(**kw)
    tmodel.save_pretrained(tmp_path)
    model, config = hf.load_hf(tmp_path)
    tc = tmodel.config
    # the loaded config carries every field as written (not the defaults)
    assert config.rms_norm_eps == tc.rms_norm_eps
    assert config.head_dim == tc.head_dim
    assert config.num_heads == tc.num_attention_heads
    assert config.num_kv_heads == tc.num_key_value_heads
    assert config.rope_theta == pytest.approx(kw.get("theta", 1e4))
    assert config.rope_type == (kw.get("rope") or {}).get("rope_type", "default")
    assert config.tie_word_embeddings == kw.get("tie", False)
    if kw["arch"] == "llama":
        assert config.attention_bias == kw.get("bias", False)
        assert config.mlp_bias == kw.get("mlp_bias", False)
    ids, mask = padded_batch(config.vocab_size, length=12, seed=3)
    ref = torch_logits(tmodel, ids, mask)
    # jitted: an eager NNX forward compiles every op on its own (slower than one program)
    out = np.asarray(nnx.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(ids, jnp.int32),
                                                      jnp.asarray(mask, jnp.int32)))
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], ref[real], atol=ATOL, rtol=0)
