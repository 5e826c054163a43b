"""``python -m prada_jax.distill.export``: teacher top-k log-probs of a pool or of JSONL sequences.

    python -m prada_jax.distill.export --teacher=TEACHER_DIR --pool=POOL_DIR --out=STORE_DIR \\
        [--top_k=64] [--batch_tokens=4096] [--shard_tokens=65536] [--device=cpu] \\
        [--dtype=float32] [--value_dtype=float16] [--temperature=1.0] [--tokenizer=TOK_DIR] \\
        [--noprogress]
    python -m prada_jax.distill.export --teacher=TEACHER_DIR --sequences=FILE.jsonl --out=DIR \\
        [--tokenizer_fingerprint=sha256:...] ...

Rerunning the same command on the same ``--out`` resumes. Bad input of any kind (flags, a
damaged teacher folder or store, a tokenizer mismatch, ``--top_k`` above the vocabulary, a
changed ``--top_k`` on resume) is one line on stderr and exit 2. Library:
:mod:`prada_jax.distill.export`.
"""
from __future__ import annotations

import json
from typing import Sequence

from absl import flags

from prada_jax import cli
from prada_jax.distill import entry
from prada_jax.distill.export import TORCH_DTYPES, export_store
from prada_jax.errors import BadInput

PROG = "prada_jax.distill.export"


def _define(fv) -> None:
    flags.DEFINE_string("teacher", None, "local Hugging Face causal LM folder", flag_values=fv)
    flags.DEFINE_string("pool", None, "trajectory pool folder (prada_jax.distill.pool)",
                        flag_values=fv)
    flags.DEFINE_string("sequences", None, 'JSONL file of {"id": ..., "tokens": [...]} lines',
                        flag_values=fv)
    flags.DEFINE_string("out", None, "output store folder (resumed if present)", flag_values=fv)
    flags.DEFINE_integer("top_k", 64, "candidates per token", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("batch_tokens", 4096, "rows × padded length per teacher forward",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("shard_tokens", 1 << 16, "scored tokens per shard file",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_string("device", "cpu", "torch device, e.g. cpu, cuda, cuda:1", flag_values=fv)
    flags.DEFINE_enum("dtype", "float32", list(TORCH_DTYPES),
                      "teacher compute dtype (log-softmax is always float32)", flag_values=fv)
    flags.DEFINE_enum("value_dtype", "float16", ["float16", "bfloat16"],
                      "storage dtype of the top-k log-probs", flag_values=fv)
    flags.DEFINE_float("temperature", 1.0, "teacher softmax temperature (> 0)", flag_values=fv)
    flags.DEFINE_string("tokenizer", None, "tokenizer folder if not stored with the teacher",
                        flag_values=fv)
    flags.DEFINE_string("tokenizer_fingerprint", None,
                        "with --sequences: refuse a teacher whose tokenizer fingerprint differs",
                        flag_values=fv)
    flags.DEFINE_bool("progress", True, "show the progress bar (--noprogress hides it)",
                      flag_values=fv)



def main(argv: Sequence[str] | None = None) -> dict:
    """Parses ``argv`` (default ``sys.argv[1:]``), exports, prints and returns the statistics.
    Bad input raises :class:`~prada_jax.errors.BadInput` (exit 2 under :func:`cli.run_local`)."""
    fv = entry.parse(_define, argv, PROG, __doc__)
    for name in ("teacher", "out"):
        if not fv[name].value:
            raise BadInput(f"--{name} is required")
    if (fv.pool is None) == (fv.sequences is None):
        raise BadInput("exactly one of --pool and --sequences is required")
    if not fv.temperature > 0:
        raise BadInput(f"--temperature must be > 0, got {fv.temperature}")
    stats = export_store(fv.teacher, fv.out, pool=fv.pool, sequences=fv.sequences,
                         top_k=fv.top_k, batch_tokens=fv.batch_tokens,
                         shard_tokens=fv.shard_tokens, device=fv.device, dtype=fv.dtype,
                         value_dtype=fv.value_dtype, temperature=fv.temperature,
                         tokenizer=fv.tokenizer, tokenizer_fingerprint=fv.tokenizer_fingerprint,
                         progress=fv.progress)
    print(json.dumps({"out": fv.out, **stats}))
    return stats


if __name__ == "__main__":
    cli.run_local(main)
