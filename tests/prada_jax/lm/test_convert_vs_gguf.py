"""The converted folder (``prada_jax.lm.convert``) against the GGUF file itself, read by code
that shares nothing with the converter (marker ``real``; ``make test-real``).

The converter goes through ``transformers``' GGUF loader and writes a folder; the parity tests
of test_real_smollm2.py then load that folder on both sides (Flax and torch), so a weight the
converter transposes or a ``rope_theta`` it writes wrong passes them. Here the reference reads
the GGUF with the ``gguf`` package only (its reader and de-quantiser, no transformers):

* a NumPy forward pass written in the GGUF / llama.cpp convention (Q and K rows in the GGUF's
  permuted order, RoPE rotating adjacent pairs, θ from ``llama.rope.freq_base``, GQA, RMSNorm
  ε from the metadata, tied output) gives logits that the project's Flax LM on the converted
  folder matches within ``LOGIT_ATOL`` (measured max |Δ| 6.6e-5 on logits up to |37|; a
  transposed ``o_proj`` of one layer moves them by up to 8.5, ``rope_theta`` 10 000 instead of
  100 000 by up to 3.8);
* every tensor of the folder equals the de-quantised GGUF tensor it came from (Q and K rows
  un-permuted by the test's own inverse of llama.cpp's permutation), exactly;
* rope θ, RMSNorm ε, head counts, the vocabulary (size and every token string), the special
  token ids and the chat template of the folder equal the GGUF metadata.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from gguf.quants import dequantize  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from prada_jax.lm import hf  # noqa: E402
from tests.helpers.real_model import gguf_file, real_model_dir  # noqa: E402

pytestmark = pytest.mark.real

jax.config.update("jax_default_matmul_precision", "highest")
#: |Δ logit| allowed between the Flax LM on the folder and the NumPy GGUF forward: float32
#: sums over 30 layers in another order (measured max 6.6e-5 at |logit| ≤ 37).
LOGIT_ATOL = 1e-3
PROMPT = "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"


def _meta(reader, key):
    field = reader.get_field(key)
    return None if field is None else field.contents()


@pytest.fixture(scope="module")
def ref():
    """(reader, {GGUF tensor name: float32 array in NumPy [rows, cols] order}, folder)."""
    folder = real_model_dir()
    reader = gguf.GGUFReader(str(gguf_file()))
    tensors = {t.name: np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(
        [int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    return reader, tensors, folder


def _unpermute(w, n_head):
    """Inverse of llama.cpp's ``permute`` (convert_hf_to_gguf.py, LlamaModel): the GGUF stores
    each head's Q/K rows as interleaved pairs, HF as two halves."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_pairs(x, theta):
    """RoPE of llama.cpp's "normal" mode: dimension pairs (2i, 2i+1) rotate by pos·θ^(−2i/d).
    x: [T, H, d]."""
    t, _, d = x.shape
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]          # [T, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    out = np.empty(x.shape, np.float64)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out.astype(np.float32)


def gguf_forward(reader, w, ids):
    """Logits [T, V] of one unpadded sequence, from the GGUF tensors and metadata alone."""
    arch = _meta(reader, "general.architecture")
    n_layer = int(_meta(reader, f"{arch}.block_count"))
    n_head = int(_meta(reader, f"{arch}.attention.head_count"))
    n_kv = int(_meta(reader, f"{arch}.attention.head_count_kv"))
    eps = float(_meta(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
    theta = float(_meta(reader, f"{arch}.rope.freq_base"))
    x = w["token_embd.weight"][np.asarray(ids)]
    t, d = x.shape
    hd = d // n_head
    causal = np.tril(np.ones((t, t), bool))
    for i in range(n_layer):
        p = f"blk.{i}."
        h = _rms(x, w[p + "attn_norm.weight"], eps)
        q = _rope_pairs((h @ w[p + "attn_q.weight"].T).reshape(t, n_head, hd), theta)
        k = _rope_pairs((h @ w[p + "attn_k.weight"].T).reshape(t, n_kv, hd), theta)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, n_kv, hd)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        s = np.where(causal[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(t, d)
        x = x + o @ w[p + "attn_output.weight"].T
        h = _rms(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * (h @ w[p + "ffn_up.weight"].T)) @ \
            w[p + "ffn_down.weight"].T
    x = _rms(x, w["output_norm.weight"], eps)
    out = w.get("output.weight", w["token_embd.weight"])
    return x @ out.T


def test_flax_on_the_folder_matches_a_numpy_forward_of_the_gguf(ref):
    reader, w, folder = ref
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    assert len(ids) >= 16
    want = gguf_forward(reader, w, ids)
    model, _ = hf.load_hf(folder)
    got = np.asarray(model(jnp.asarray([ids], jnp.int32), jnp.ones((1, len(ids)), jnp.int32)))[0]
    diff = np.abs(got - want)
    print(f"\nFlax (folder) vs NumPy (GGUF): max |Δ logit| {diff.max():.2e} over {len(ids)} "
          f"positions, max |logit| {np.abs(want).max():.1f}")
    np.testing.assert_allclose(got, want, atol=LOGIT_ATOL, rtol=0)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


_HF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def test_every_folder_tensor_is_the_dequantized_gguf_tensor(ref):
    reader, w, folder = ref
    n_head = int(_meta(reader, "llama.attention.head_count"))
    n_kv = int(_meta(reader, "llama.attention.head_count_kv"))
    sd = load_file(str(folder / "model.safetensors"))
    expect = {"model.embed_tokens.weight": w["token_embd.weight"],
              "model.norm.weight": w["output_norm.weight"]}
    if "output.weight" in w:
        expect["lm_head.weight"] = w["output.weight"]
    for name, arr in w.items():
        if not name.startswith("blk."):
            continue
        _, i, kind, _ = name.split(".")
        if kind == "attn_q":
            arr = _unpermute(arr, n_head)
        elif kind == "attn_k":
            arr = _unpermute(arr, n_kv)
        expect[f"model.layers.{i}.{_HF_NAMES[kind]}.weight"] = arr
    assert set(sd) - {"lm_head.weight"} == set(expect) - {"lm_head.weight"}
    for name, arr in expect.items():
        assert sd[name].shape == arr.shape, name
        np.testing.assert_array_equal(sd[name], arr, err_msg=name)


def test_folder_metadata_matches_the_gguf(ref):
    reader, _, folder = ref
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", np.nan)))
    assert theta == float(_meta(reader, "llama.rope.freq_base")) == 100000.0
    assert hf.load_hf(folder)[1].rope_theta == theta   # what the Flax LM runs
    assert cfg["rms_norm_eps"] == pytest.approx(
        float(_meta(reader, "llama.attention.layer_norm_rms_epsilon")), rel=1e-6)
    assert cfg["num_attention_heads"] == int(_meta(reader, "llama.attention.head_count"))
    assert cfg["num_key_value_heads"] == int(_meta(reader, "llama.attention.head_count_kv"))
    assert cfg["num_hidden_layers"] == int(_meta(reader, "llama.block_count"))
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    assert cfg["vocab_size"] == len(tokens) == int(_meta(reader, "llama.vocab_size")) == 49152
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert len(tok) == len(tokens)
    assert tok.convert_ids_to_tokens(list(range(len(tokens)))) == list(tokens)
    assert tok.chat_template == _meta(reader, "tokenizer.chat_template")
    for key, cfg_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        assert cfg[cfg_key] == int(_meta(reader, f"tokenizer.ggml.{key}"))
