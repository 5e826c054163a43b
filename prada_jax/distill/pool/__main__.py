"""``python -m prada_jax.distill.pool``: trajectory pool tools.

    python -m prada_jax.distill.pool convert --jsonl=data.jsonl --tokenizer=TOK_DIR \\
        --out=POOL_DIR [--task=NAME]
    python -m prada_jax.distill.pool validate --pool=POOL_DIR

``convert``: chat-formatted JSONL (one ``{"messages": [...], "success": 0/1}`` a line) → pool
folder; ``validate``: checks a pool folder (library: :mod:`prada_jax.distill.pool`). Bad input
is one line on stderr, exit 2.
"""
from __future__ import annotations

import sys
from typing import Sequence

from absl import flags

from prada_jax import cli
from prada_jax.distill import pool as pool_lib
from prada_jax.distill.scoring import load_tokenizer
from prada_jax.errors import BadInput

PROG = "prada_jax.distill.pool"
COMMANDS = ("convert", "validate")


def _define_convert(fv) -> None:
    flags.DEFINE_string("jsonl", None, "input JSONL, one {'messages': [...]} a line",
                        flag_values=fv)
    flags.DEFINE_string("tokenizer", None, "local tokenizer folder (with chat template)",
                        flag_values=fv)
    flags.DEFINE_string("out", None, "output pool folder", flag_values=fv)
    flags.DEFINE_string("task", None, "task name stored in pool.json", flag_values=fv)


def _define_validate(fv) -> None:
    flags.DEFINE_string("pool", None, "pool folder to check", flag_values=fv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and cli.is_help(argv[0]):
        print(__doc__)
        return 0
    if not argv or argv[0] not in COMMANDS:
        got = argv[0] if argv else "nothing"
        raise BadInput(f"expected a command, one of {list(COMMANDS)}; got {got!r}")
    cmd, rest = argv[0], argv[1:]
    if cmd == "validate":
        if len(rest) == 1 and not rest[0].startswith("-"):   # the former positional form
            rest = [f"--pool={rest[0]}"]
        fv = cli.parse_local(_define_validate, rest, f"{PROG} validate", __doc__)
        if not fv.pool:
            raise BadInput("--pool is required")
        pool = pool_lib.validate_pool(fv.pool)
        print(f"{fv.pool}: OK {pool.meta['counts']}")
        return 0
    fv = cli.parse_local(_define_convert, rest, f"{PROG} convert", __doc__)
    for name in ("jsonl", "tokenizer", "out"):
        if not fv[name].value:
            raise BadInput(f"--{name} is required")
    tok = load_tokenizer(fv.tokenizer)
    out = pool_lib.convert_jsonl(fv.jsonl, tok, fv.out, task=fv.task,
                                 tokenizer_name=fv.tokenizer)
    pool = pool_lib.load_pool(out)
    print(f"wrote {out}: {pool.meta['counts']}")
    return 0


if __name__ == "__main__":
    cli.run_local(main)
