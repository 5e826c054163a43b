"""Flax CausalLM forward tokens/s vs the transformers PyTorch model on the same weights, plus
KV-cache generation and teacher-logit export throughput. Medians of repeats; one process.

    python -m benchmarks.lm_forward [--preset small] [--batch 4] [--length 128] [--repeats 10]
                                    [--skip_export] [--skip_generate] [--torch_threads N]
                                    [--json FILE]

Weights are random (SYNTHETIC): the numbers measure speed only. The model is a Qwen2 config
built in PyTorch, saved with ``save_pretrained`` and loaded with ``prada_jax.lm.hf.load_hf``.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from benchmarks.common import save_json
from prada_jax import cli
from prada_jax.distill import export as export_mod
from prada_jax.lm import hf, sampling

PRESETS = {
    # name: (vocab, hidden, intermediate, layers, heads, kv_heads)
    "tiny": (512, 64, 128, 2, 4, 2),
    "small": (8192, 256, 704, 4, 8, 2),
    "medium": (32768, 512, 1408, 8, 8, 2),
}


def _median_s(fn, repeats):
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def _define(fv):
    """The command's flags."""
    flags.DEFINE_enum("preset", "small", sorted(PRESETS), "model size", flag_values=fv)
    for name, default, help_ in (
            ("batch", 4, "sequences per batch"), ("length", 128, "tokens per sequence"),
            ("repeats", 10, "timed calls (median)"),
            ("new_tokens", 32, "generate() benchmark length"),
            ("export_seqs", 32, "sequences for the export part"),
            ("top_k", 64, "exported logits per position")):
        flags.DEFINE_integer(name, default, help_, lower_bound=1, flag_values=fv)
    flags.DEFINE_bool("skip_export", False, "skip the export part", flag_values=fv)
    flags.DEFINE_bool("skip_generate", False, "skip the generate() part", flag_values=fv)
    flags.DEFINE_integer("torch_threads", 0, "torch.set_num_threads (0: torch's default)",
                         lower_bound=0, flag_values=fv)
    flags.DEFINE_string("json", None, "also write the results to this file", flag_values=fv)


def _generate(model, jids, args, results: dict) -> None:
    """Times ``sampling.generate`` (KV cache) on the first ≤ 32 tokens of ``jids``."""
    prompt = jids[:, : min(32, args.length)]
    kw = dict(key=jax.random.key(0), max_new_tokens=args.new_tokens, temperature=1.0)
    t0 = time.perf_counter()
    jax.block_until_ready(sampling.generate(model, prompt, **kw))
    results["generate_compile_s"] = time.perf_counter() - t0
    gen_s, _ = _median_s(lambda: jax.block_until_ready(sampling.generate(model, prompt, **kw)),
                         max(3, args.repeats // 2))
    new = args.batch * args.new_tokens
    results.update(generate_s=gen_s, generate_new_tokens_per_s=new / gen_s)
    print(f"generate flax  median {1e3 * gen_s:8.2f} ms  {new / gen_s:10.0f} new tok/s "
          f"(batch {args.batch}, prompt {prompt.shape[1]}, {args.new_tokens} new, KV cache)")


def _export(tmodel, rng, vocab: int, args, results: dict) -> None:
    """Times the teacher-logit export (``distill.export.export_logits``) of random
    sequences."""
    seqs = [rng.integers(0, vocab, args.length).tolist() for _ in range(args.export_seqs)]
    with tempfile.TemporaryDirectory() as tmp:
        stats = export_mod.export_logits(tmodel, [str(i) for i in range(len(seqs))], seqs, tmp,
                                         meta={"teacher": "synthetic"}, vocab_size=vocab,
                                         top_k=args.top_k,
                                         batch_tokens=args.batch * args.length,
                                         progress=False)
        index_bytes = os.path.getsize(os.path.join(tmp, "index.json"))
    results.update(export_tokens_per_s=stats["tokens_per_s"],
                   export_bytes_per_token=stats["bytes_per_token"],
                   export_index_bytes=index_bytes, export_tokens=stats["tokens"])
    print(f"export   torch {stats['tokens_per_s']:10.0f} tok/s  {stats['bytes_per_token']:.1f} "
          f"bytes/token in shards (top-k {args.top_k}; index.json {index_bytes} bytes for "
          f"{len(seqs)} sequences)")


def main(argv=None) -> dict:
    """``argv``: absl flags (``--new_tokens=32``); None = the command line."""
    args = cli.parse_local(_define, argv, "benchmarks.lm_forward", __doc__)
    cli.hub_offline()

    import torch  # lazy: torch is optional (the [torch] extra)
    import transformers  # lazy: heavy; only this comparison needs it

    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    vocab, hidden, inter, layers, heads, kv = PRESETS[args.preset]
    cfg = transformers.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                   num_hidden_layers=layers, num_attention_heads=heads,
                                   num_key_value_heads=kv, tie_word_embeddings=True,
                                   max_position_embeddings=4096)
    torch.manual_seed(0)
    tmodel = transformers.Qwen2ForCausalLM(cfg).eval()
    n_params = sum(p.numel() for p in tmodel.parameters())
    results = {"preset": args.preset, "params": n_params, "batch": args.batch,
               "length": args.length, "jax_backend": jax.default_backend(),
               "torch_threads": torch.get_num_threads(), "synthetic_weights": True}
    print(f"SYNTHETIC random weights; preset {args.preset}: {n_params / 1e6:.2f} M params, "
          f"batch {args.batch} x {args.length} tokens; JAX on {jax.default_backend()}, torch "
          f"{torch.get_num_threads()} threads")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (args.batch, args.length)).astype(np.int32)
    mask = np.ones_like(ids)
    tokens = ids.size

    with tempfile.TemporaryDirectory() as tmp:
        tmodel.save_pretrained(tmp)
        t0 = time.perf_counter()
        model, _ = hf.load_hf(tmp)
        results["load_hf_s"] = time.perf_counter() - t0

    graphdef, state = nnx.split(model)

    @jax.jit
    def fwd(state, ids, mask):
        return nnx.merge(graphdef, state)(ids, mask)

    jids, jmask = jnp.asarray(ids), jnp.asarray(mask)
    t0 = time.perf_counter()
    out = fwd(state, jids, jmask).block_until_ready()
    results["jax_compile_s"] = time.perf_counter() - t0
    jax_s, _ = _median_s(lambda: fwd(state, jids, jmask).block_until_ready(), args.repeats)

    tids, tmask = torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    with torch.inference_mode():
        ref = tmodel(tids, attention_mask=tmask).logits.numpy()
        torch_s, _ = _median_s(lambda: tmodel(tids, attention_mask=tmask), args.repeats)
    results.update(jax_forward_s=jax_s, torch_forward_s=torch_s,
                   jax_tokens_per_s=tokens / jax_s, torch_tokens_per_s=tokens / torch_s,
                   jax_over_torch_speed=torch_s / jax_s,
                   max_abs_logit_diff=float(np.abs(np.asarray(out) - ref).max()))
    print(f"forward  flax  median {1e3 * jax_s:8.2f} ms  {tokens / jax_s:10.0f} tok/s "
          f"(compile {results['jax_compile_s']:.2f} s)")
    print(f"forward  torch median {1e3 * torch_s:8.2f} ms  {tokens / torch_s:10.0f} tok/s")
    print(f"ratio flax/torch throughput {torch_s / jax_s:.2f}x; max |logit diff| "
          f"{results['max_abs_logit_diff']:.2e}")

    if not args.skip_generate:
        _generate(model, jids, args, results)
    if not args.skip_export:
        _export(tmodel, rng, vocab, args, results)
    save_json(args.json, results)
    return results


if __name__ == "__main__":
    cli.run_local(main)
