"""Teacher-forced scoring of token sequences by a PyTorch Hugging Face causal LM (top-k + tail).

torch is imported inside the functions only, so importing this module (and ``prada_jax``) never
pulls in torch.

Alignment: for a sequence ``s`` of length L the results have L − 1 rows; row ``i`` is the
teacher's distribution for token ``s[i + 1]`` given ``s[0..i]`` (so ``logp_actual[i] =
log p(s[i+1] | s[:i+1])``). Sequences shorter than 2 tokens give 0 rows.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from prada_jax.errors import BadInput
from prada_jax.lm import safetensors_io

# Files of which at least one must be present for ``AutoTokenizer`` to load a real tokenizer
# (without them it can quietly build a 1-token tokenizer from the model config).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "tokenizer_config.json")


def tokenizer_fingerprint(tokenizer) -> str:
    """``"sha256:<hex>"`` of the tokenizer's vocabulary items ``(token, id)`` sorted by id.

    Only the vocabulary (added tokens included) enters, never the model's embedding size, so two
    models that share a tokenizer but pad their embeddings differently (151936 vs 152064 rows)
    get the same fingerprint.
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return "sha256:" + hashlib.sha256(json.dumps(vocab).encode()).hexdigest()


def check_teacher_files(path: os.PathLike | str, flag: str = "--teacher") -> Path:
    """Checks a local Hugging Face model folder before ``from_pretrained`` reads it: the folder
    and its ``config.json`` exist and every ``*.safetensors`` weight file is complete (a
    truncated shard is named by file). Raises :class:`~prada_jax.errors.BadInput`."""
    d = Path(path)
    if not d.is_dir():
        raise BadInput(f"{flag} {d}: teacher folder not found (a local folder is needed)")
    if not (d / "config.json").is_file():
        raise BadInput(f"{flag} {d}: no config.json (not a Hugging Face model folder)")
    shards = sorted(d.glob("*.safetensors"))
    if not shards and not any(d.glob("*.bin")):
        raise BadInput(f"{flag} {d}: no weight files (*.safetensors)")
    for f in shards:
        try:
            safetensors_io.read_header(f)
        except (safetensors_io.SafetensorsError, OSError) as e:
            raise BadInput(f"{flag}: teacher weight file {e}") from None
    return d


def load_tokenizer(path: os.PathLike | str, flag: str = "--tokenizer"):
    """``AutoTokenizer`` of a local folder that really holds tokenizer files (else
    :class:`~prada_jax.errors.BadInput` naming the folder and the flag)."""
    import transformers  # lazy: transformers takes seconds to import; only the teacher paths need it
    d = Path(path)
    if not d.is_dir():
        raise BadInput(f"{flag} {d}: tokenizer folder not found")
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        raise BadInput(f"{flag} {d}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); pass "
                       "--tokenizer with the folder that has them")
    try:
        return transformers.AutoTokenizer.from_pretrained(str(d))
    except (OSError, ValueError) as e:
        raise BadInput(f"{flag} {d}: cannot load a tokenizer "
                       f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def load_teacher(path: os.PathLike | str, dtype: str = "float32", device: str = "cpu",
                 flag: str = "--teacher"):
    """The PyTorch teacher of a local Hugging Face folder (eval mode, ``dtype`` on ``device``);
    damaged folders raise :class:`~prada_jax.errors.BadInput` naming the file."""
    import torch  # lazy: torch is the optional [torch] extra
    import transformers  # lazy: transformers takes seconds to import; only the teacher paths need it
    d = check_teacher_files(path, flag)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(d),
                                                                  dtype=getattr(torch, dtype))
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(f"{flag} {d}: cannot load the teacher ({first})") from None
    return model.to(device).eval()


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Greedy, order-preserving batches whose padded size (rows × longest) ≤ ``batch_tokens``.

    A sequence longer than ``batch_tokens`` gets a batch of its own. The plan depends only on
    the lengths, so a resumed export re-forms exactly the batches of the original run.

    Returns:
      lists of indices into ``lengths``.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    batches, cur, cur_max = [], [], 0
    for i, n in enumerate(lengths):
        new_max = max(cur_max, int(n))
        if cur and new_max * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_max = [], int(n)
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


def _score_batch(model, seqs, top_k, device, temperature, vocab_size):
    import torch  # lazy: torch is the optional [torch] extra

    lens = [len(s) for s in seqs]
    width = max(lens)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.as_tensor(np.asarray(s, np.int64))
        mask[b, :len(s)] = 1
    with torch.inference_mode():
        # Right padding: causal attention keeps real tokens blind to the padding after them, and
        # positions are the plain 0..L-1.
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        if logits.shape[-1] < vocab_size:
            raise ValueError(f"teacher has {logits.shape[-1]} output rows but the tokenizer has "
                             f"{vocab_size} tokens")
        # Rows past the tokenizer's vocabulary are embedding padding: excluded from the softmax.
        logits = logits[:, :-1, :vocab_size].float()
        if temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits, dim=-1)
        topk_logp, topk_ids = torch.topk(logp, top_k, dim=-1)
        target = ids[:, 1:].to(logp.device)
        logp_actual = torch.gather(logp, -1, target[..., None])[..., 0]
        rest = logp.scatter(-1, topk_ids, float("-inf"))
        tail = torch.logsumexp(rest, dim=-1).exp() if top_k < vocab_size else torch.zeros_like(
            logp_actual)
    out = []
    for b, n in enumerate(lens):
        m = max(n - 1, 0)
        out.append({
            "logp_actual": logp_actual[b, :m].cpu().numpy().astype(np.float32),
            "topk_ids": topk_ids[b, :m].cpu().numpy().astype(np.int32),
            "topk_logp": topk_logp[b, :m].cpu().numpy().astype(np.float32),
            "tail_mass": tail[b, :m].cpu().numpy().astype(np.float32),
        })
    return out


def score_batches(model_torch, token_seqs: Sequence[Sequence[int]], *, top_k: int = 64,
                  batch_tokens: int = 4096, device=None, temperature: float = 1.0,
                  vocab_size: int | None = None):
    """Yields ``(indices, results)`` per planned batch (see :func:`plan_batches`).

    Same arguments as :func:`score_sequences`; lets a caller stream and skip work.
    """
    for idx in plan_batches([len(s) for s in token_seqs], batch_tokens):
        yield idx, score_subset(model_torch, [token_seqs[i] for i in idx], top_k=top_k,
                                device=device, temperature=temperature, vocab_size=vocab_size)


def score_subset(model_torch, seqs, *, top_k, device=None, temperature=1.0, vocab_size=None):
    """Scores one batch of sequences together (right-padded); see :func:`score_sequences`."""
    vocab_size, device = _resolve(model_torch, top_k, device, temperature, vocab_size)
    results = [None] * len(seqs)
    real = [i for i, s in enumerate(seqs) if len(s) >= 2]
    if real:
        scored = _score_batch(model_torch, [seqs[i] for i in real], top_k, device, temperature,
                              vocab_size)
        for i, r in zip(real, scored):
            results[i] = r
    for i, r in enumerate(results):
        if r is None:
            results[i] = {"logp_actual": np.zeros(0, np.float32),
                          "topk_ids": np.zeros((0, top_k), np.int32),
                          "topk_logp": np.zeros((0, top_k), np.float32),
                          "tail_mass": np.zeros(0, np.float32)}
    return results


def _resolve(model, top_k, device, temperature, vocab_size):
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    rows = model.get_output_embeddings().weight.shape[0]
    vocab_size = int(vocab_size or rows)
    if vocab_size > rows:
        raise ValueError(f"teacher has {rows} output rows but the tokenizer has {vocab_size} "
                         "tokens")
    if not 1 <= top_k <= vocab_size:
        raise ValueError(f"top_k must be in [1, {vocab_size}], got {top_k}")
    if device is None:
        device = next(model.parameters()).device
    return vocab_size, device


def score_sequences(model_torch, token_seqs: Sequence[Sequence[int]], top_k: int = 64,
                    batch_tokens: int = 4096, device=None, temperature: float = 1.0,
                    vocab_size: int | None = None) -> list[dict]:
    """Teacher-forced top-k scoring of each sequence.

    Args:
      model_torch: a ``transformers`` causal LM (eval mode), any dtype/device.
      token_seqs: N token-id lists.
      top_k: stored candidates per position.
      batch_tokens: bound on rows × padded length per forward pass (memory ≈ batch_tokens × V ×
        4 bytes × ~3 for float32 logits, log-probs and the tail computation).
      device: torch device for the inputs (default: the model's).
      temperature: divides the logits before the softmax.
      vocab_size: number of real token ids (the tokenizer's length); teacher output rows past it
        are padding and are dropped before the softmax. Default: all rows.

    Returns:
      N dicts; for a sequence of length L (row i predicts token i + 1):
        ``logp_actual`` [L-1] float32, ``topk_ids`` [L-1, k] int32 (descending probability),
        ``topk_logp`` [L-1, k] float32, ``tail_mass`` [L-1] float32 = 1 − Σ top-k p (computed as
        the mass of the other tokens, accurate for tiny tails).
    """
    out: list = [None] * len(token_seqs)
    for idx, results in score_batches(model_torch, token_seqs, top_k=top_k,
                                      batch_tokens=batch_tokens, device=device,
                                      temperature=temperature, vocab_size=vocab_size):
        for i, r in zip(idx, results):
            out[i] = r
    return out
