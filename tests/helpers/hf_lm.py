"""Tiny PyTorch Qwen2/Llama reference models for the LM tests (offline): the parity cases,
the model builder, left-padded batches and transformers logits. Import as
``from tests.helpers.hf_lm import ...`` after ``pytest.importorskip("torch")``."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

# Parity cases: GQA and MHA, tied and untied embeddings, QKV bias on (Qwen2, Llama
# attention_bias) and off (Llama), each rope scaling scheme once.
CASES = {
    "qwen2-gqa-tied": dict(arch="qwen2", heads=4, kv=2, tie=True),
    "qwen2-mha-untied-yarn": dict(arch="qwen2", heads=4, kv=4, tie=False,
                                  rope={"rope_type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 32}),
    "llama-gqa-untied-nobias": dict(arch="llama", heads=4, kv=1, tie=False, bias=False),
    "llama-gqa-tied-bias-llama3": dict(arch="llama", heads=4, kv=2, tie=True, bias=True,
                                       rope={"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 16}),
    "llama-mha-untied-linear": dict(arch="llama", heads=2, kv=2, tie=False, bias=False,
                                    rope={"rope_type": "linear", "factor": 2.0}, theta=500.0),
}


def build_torch_model(arch="qwen2", heads=4, kv=2, tie=False, bias=False, rope=None,
                      theta=10000.0, vocab=320, hidden=64, layers=2, seed=0, *, eps=1e-6,
                      head_dim=None, mlp_bias=False, max_pos=128, scale=0.15, embed_scale=None):
    """A randomly initialised tiny HF causal LM with every parameter (biases, norms) perturbed:
    norms 1 + 0.2·N(0, 1), embeddings ``embed_scale``·N(0, 1) (default ``scale``), every other
    parameter ``scale``·N(0, 1)."""
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  head_dim=head_dim or hidden // heads, tie_word_embeddings=tie,
                  max_position_embeddings=max_pos, rms_norm_eps=eps, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)
    rope_params = {"rope_type": "default", "rope_theta": theta, **(rope or {})}
    rope_params.setdefault("rope_theta", theta)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(rope_parameters=rope_params, **common)
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.LlamaConfig(rope_parameters=rope_params, attention_bias=bias,
                                       mlp_bias=mlp_bias, **common)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif embed_scale is not None and "embed_tokens" in name:
                p.copy_(embed_scale * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return model


def padded_batch(vocab, batch=3, length=9, seed=0):
    """Random ids [B, L] with rows left-padded by 0, 3 and 5 tokens (mask 1 = real)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(batch, length)).astype(np.int64)
    mask = np.ones((batch, length), np.int64)
    for b, pad in enumerate([0, 3, 5][:batch]):
        mask[b, :pad] = 0
        ids[b, :pad] = 0
    return ids, mask


def torch_logits(model, ids, mask):
    """transformers logits with generate()'s positions (cumsum of the mask − 1)."""
    pos = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(pos))
    return out.logits.float().numpy()
