"""Flax CausalLM vs transformers on the same weights: logits, KV cache, save/load."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from prada_jax.lm import hf
from prada_jax.lm.config import LMConfig
from prada_jax.lm.model import CausalLM, KVCache

from tests.helpers.hf_lm import CASES, build_torch_model, padded_batch, torch_logits

jax.config.update("jax_default_matmul_precision", "highest")
ATOL = 1e-4

# One compiled forward per model structure and shape (an eager NNX forward compiles every op
# on its own, which costs more than compiling the whole forward once).
_forward = nnx.jit(lambda m, ids, mask: m(ids, mask))
_forward_unmasked = nnx.jit(lambda m, ids: m(ids))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(hf_dirs, case):
    path, tmodel = hf_dirs(case)
    model, config = hf.load_hf(path)
    assert config.tie_word_embeddings == CASES[case]["tie"]
    ids, mask = padded_batch(config.vocab_size)
    ref = torch_logits(tmodel, ids, mask)
    out = np.asarray(_forward(model, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)))
    assert out.shape == ref.shape and out.dtype == np.float32
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], ref[real], atol=ATOL, rtol=0)
    assert np.isfinite(out).all()  # padding rows stay finite (no NaN from fully masked rows)


def test_left_padding_does_not_change_real_logits(hf_dirs):
    path, _ = hf_dirs("qwen2-gqa-tied")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size)
    full = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    b = 2  # 5 pad tokens: the unpadded row alone must give the same logits
    alone = np.asarray(_forward_unmasked(model, jnp.asarray(ids[b:b + 1, 5:])))
    np.testing.assert_allclose(full[b, 5:], alone[0], atol=1e-5, rtol=0)


def test_kv_cache_decode_matches_full_forward(hf_dirs):
    path, _ = hf_dirs("llama-gqa-tied-bias-llama3")
    model, config = hf.load_hf(path)
    ids, mask = padded_batch(config.vocab_size, length=9)
    full = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))

    @nnx.jit
    def step(m, tok, msk, cache):
        return m(tok, msk, cache=cache)

    cache = KVCache.init(config, batch=3, max_len=12)
    logits, cache = step(model, jnp.asarray(ids[:, :6]), jnp.asarray(mask[:, :6]), cache)
    got = [np.asarray(logits)]
    for t in range(6, 9):
        logits, cache = step(model, jnp.asarray(ids[:, t:t + 1]), jnp.asarray(mask[:, t:t + 1]),
                             cache)
        got.append(np.asarray(logits))
    got = np.concatenate(got, axis=1)
    real = mask.astype(bool)
    np.testing.assert_allclose(got[real], full[real], atol=1e-5, rtol=0)
    assert int(cache.index) == 9
    np.testing.assert_array_equal(np.asarray(cache.next_pos), mask.sum(-1))


def test_sharded_checkpoint_with_index(tmp_path):
    tmodel = build_torch_model(arch="llama", heads=4, kv=2, tie=False, seed=3)
    tmodel.save_pretrained(tmp_path, max_shard_size="40KB")
    assert os.path.isfile(tmp_path / hf.INDEX_FILE)
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 2
    mesh = jax.make_mesh((1,), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    model, config = hf.load_hf(tmp_path, sharding=replicated)
    emb = nnx.state(model)["embed_tokens"]["embedding"][...]
    assert emb.sharding == replicated
    ids, mask = padded_batch(config.vocab_size, seed=1)
    ref = torch_logits(tmodel, ids, mask)
    out = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], ref[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch,tie", [("qwen2", False), ("llama", True)])
def test_save_hf_loads_in_transformers(tmp_path, arch, tie):
    import transformers
    config = LMConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, tie_word_embeddings=tie,
                      attention_bias=(arch == "qwen2"), attention_out_bias=False, arch=arch,
                      rope_theta=1000.0)
    # Every parameter drawn in NumPy (norms 1 + 0.1·N(0, 1), the rest 0.1·N(0, 1)) into the
    # abstract model, so non-trivial norms and biases show a mis-mapped tensor; an eager
    # random init would compile one sampler per parameter shape.
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    values = [jnp.asarray(("norm" in jax.tree_util.keystr(path))
                          + 0.1 * rng.standard_normal(x.shape), x.dtype) for path, x in leaves]
    model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, values))
    assert all(isinstance(v[...], jax.Array) for _, v in nnx.iter_graph(model)
               if isinstance(v, nnx.Param))
    hf.save_hf(model, config, tmp_path)
    tmodel = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(tmodel).__name__ == ("Qwen2ForCausalLM" if arch == "qwen2" else
                                     "LlamaForCausalLM")
    ids, mask = padded_batch(config.vocab_size, seed=2)
    ref = torch_logits(tmodel, ids, mask)
    out = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    real = mask.astype(bool)
    np.testing.assert_allclose(out[real], ref[real], atol=ATOL, rtol=0)
    reloaded, config2 = hf.load_hf(tmp_path)
    assert config2 == config
    np.testing.assert_allclose(np.asarray(_forward(reloaded, jnp.asarray(ids), jnp.asarray(mask))),
                               out, atol=0, rtol=0)


def test_config_roundtrip_and_errors(tmp_path):
    config = LMConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, arch="llama", attention_bias=False,
                      rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert LMConfig.from_hf(config.to_hf_dict()) == config
    with pytest.raises(ValueError, match="arch='qwen2' needs"):
        config.to_hf_dict("qwen2")
    with pytest.raises(ValueError, match="num_kv_heads"):
        LMConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=3,
                 num_kv_heads=2, head_dim=8)
    bad = dict(config.to_hf_dict(), hidden_act="gelu")
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"config\.json.*hidden_act"):
        LMConfig.from_hf(tmp_path)


def _copy_dir(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def test_truncated_shard_error_names_file(hf_dirs, tmp_path):
    path, _ = hf_dirs("qwen2-gqa-tied")
    d = _copy_dir(path, tmp_path / "m")
    f = d / hf.SINGLE_FILE
    data = f.read_bytes()
    f.write_bytes(data[:len(data) - 1000])
    with pytest.raises(ValueError, match=r"model\.safetensors.*truncated"):
        hf.load_hf(d)


def test_index_errors_name_file(tmp_path):
    tmodel = build_torch_model(arch="qwen2", heads=2, kv=1, hidden=32, vocab=64, seed=5)
    tmodel.save_pretrained(tmp_path / "a", max_shard_size="20KB")
    index = json.loads((tmp_path / "a" / hf.INDEX_FILE).read_text())
    # An index entry pointing to a shard that is not there.
    bad = json.loads(json.dumps(index))
    bad["weight_map"]["model.norm.weight"] = "model-99999-of-99999.safetensors"
    d = _copy_dir(tmp_path / "a", tmp_path / "b")
    (d / hf.INDEX_FILE).write_text(json.dumps(bad))
    with pytest.raises(FileNotFoundError, match="model-99999-of-99999"):
        hf.load_hf(d)
    # An index entry pointing to a shard that does not hold the tensor.
    shards = sorted(set(index["weight_map"].values()))
    key = "model.norm.weight"
    other = next(s for s in shards if s != index["weight_map"][key])
    bad = json.loads(json.dumps(index))
    bad["weight_map"][key] = other
    d = _copy_dir(tmp_path / "a", tmp_path / "c")
    (d / hf.INDEX_FILE).write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=other.replace(".", r"\.") + ".*model.norm.weight"):
        hf.load_hf(d)


def test_shape_mismatch_error(hf_dirs, tmp_path):
    path, _ = hf_dirs("qwen2-gqa-tied")
    d = _copy_dir(path, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="gate_proj.weight.*shape"):
        hf.load_hf(d)


def test_loader_does_not_initialise_random_weights(hf_dirs, monkeypatch):
    """Initialisers only ever see abstract tracers (nnx.eval_shape), never concrete keys."""
    path, _ = hf_dirs("qwen2-gqa-tied")
    seen = []
    from jax._src import random as jrandom  # what jax.nn.initializers call
    for name in ("normal", "truncated_normal", "uniform"):
        real = getattr(jrandom, name)

        def spy(key, *a, _real=real, **k):
            seen.append(isinstance(key, jax.core.Tracer))
            return _real(key, *a, **k)

        monkeypatch.setattr(jrandom, name, spy)
    model, _ = hf.load_hf(path)
    assert seen and all(seen)
    assert all(isinstance(v[...], jax.Array) and not isinstance(v[...], jax.core.Tracer)
               for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Param))


def test_bf16_checkpoint_and_per_parameter_sharding(tmp_path):
    import torch
    tmodel = build_torch_model(arch="qwen2", heads=2, kv=1, hidden=32, vocab=64, seed=7)
    tmodel.to(torch.bfloat16).save_pretrained(tmp_path)
    mesh = jax.make_mesh((1,), ("model",))
    seen = []

    def choose(path, shape):
        seen.append(path)
        spec = jax.sharding.PartitionSpec("model") if path == "embed_tokens.embedding" else \
            jax.sharding.PartitionSpec()
        return jax.sharding.NamedSharding(mesh, spec)

    model, config = hf.load_hf(tmp_path, sharding=choose)
    assert "layers.1.self_attn.q_proj.bias" in seen and "embed_tokens.embedding" in seen
    emb = nnx.state(model)["embed_tokens"]["embedding"][...]
    assert emb.dtype == jnp.float32
    assert emb.sharding.spec == jax.sharding.PartitionSpec("model")
    np.testing.assert_array_equal(np.asarray(emb),
                                  tmodel.model.embed_tokens.weight.detach().float().numpy())
    q = nnx.state(model)["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
    q_ref = tmodel.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T
    np.testing.assert_array_equal(np.asarray(q), q_ref)


_SHARDED_SCRIPT = r"""
import os, sys
sys.path.insert(0, sys.argv[2])
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from prada_jax.lm import hf
from tests.helpers.hf_lm import build_torch_model, padded_batch, torch_logits
assert jax.device_count() == 8, jax.devices()
jax.config.update("jax_default_matmul_precision", "highest")
tmodel = build_torch_model(arch="qwen2", heads=4, kv=2, tie=False, seed=11)
tmodel.save_pretrained(sys.argv[1])
# Auto axes: XLA propagates shardings through the model (explicit axes would need
# out_sharding annotations on the embedding gather, which the model does not carry).
mesh = jax.make_mesh((8,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
P = jax.sharding.PartitionSpec
def choose(path, shape):
  # Vocabulary-parallel embedding/head, column-parallel q/k/v/gate/up, the rest replicated.
  if path == "embed_tokens.embedding":
    spec = P("model", None)
  elif path.endswith(("q_proj.kernel", "k_proj.kernel", "v_proj.kernel", "gate_proj.kernel",
                      "up_proj.kernel", "lm_head.kernel")):
    spec = P(None, "model")
  else:
    spec = P()
  return jax.sharding.NamedSharding(mesh, spec)
model, config = hf.load_hf(sys.argv[1], sharding=choose)
emb = nnx.state(model)["embed_tokens"]["embedding"][...]
assert len(emb.addressable_shards) == 8 and emb.addressable_shards[0].data.shape[0] == 40
ids, mask = padded_batch(config.vocab_size, seed=12)
out = np.asarray(nnx.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(ids), jnp.asarray(mask)))
ref = torch_logits(tmodel, ids, mask)
real = mask.astype(bool)
np.testing.assert_allclose(out[real], ref[real], atol=1e-4, rtol=0)
print("OK")
"""


@pytest.mark.slow
def test_load_sharded_over_8_simulated_devices(tmp_path):
    """Loads onto an 8-device mesh (simulated CPU devices) and keeps transformers parity."""
    import subprocess
    import sys
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1")
    here = os.path.dirname(os.path.abspath(__file__))
    res = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT, str(tmp_path), here], env=env,
                         capture_output=True, text=True, cwd=os.getcwd())
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]
