"""The project's two error types, which every command maps to its exit code.

* ``BadInput`` (exit 2): the user gave something unusable: a flag, a config field or variant,
  a data folder, a checkpoint, a JSON file. The message is one line that names the flag, file
  or field; nothing was written before it was raised.
* ``NonFiniteTraining`` (exit 3): a training metric or state became NaN/inf; the last good
  checkpoint is kept and the message names the metric and the step.

Anything else that escapes a command is a bug (traceback, exit 1). Library code raises these
(or subclasses of them); only the entry modules catch them, once.
"""
from __future__ import annotations

__all__ = ["BadInput", "NonFiniteTraining", "EXIT_BAD_INPUT", "EXIT_NON_FINITE"]

EXIT_BAD_INPUT = 2
EXIT_NON_FINITE = 3


class BadInput(ValueError):
    """Unusable user input; the message names the flag, file or field (exit 2)."""


class NonFiniteTraining(FloatingPointError):
    """A training metric or state became non-finite (exit 3); the last good checkpoint stays."""
