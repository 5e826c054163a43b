"""The entry wrapper every command uses: absl flags, quiet logs, one error contract.

A command module is thin::

    from prada_jax import cli

    def _define_flags():                 # only when run as a program
        flags.DEFINE_string("workdir", None, "run directory")

    def main(argv):
        ...                              # library code raises errors.BadInput & co.

    if __name__ == "__main__":
        cli.run(main, define_flags=_define_flags)

``run`` maps what escapes ``main`` (and flag parsing) to the exit code of the contract
(README, "Errors and exit codes"):

* bad input → one line ``error: ...`` on stderr, exit 2: ``errors.BadInput`` and its
  subclasses (ConfigError, TraceFormatError, EvalError, ...), ``app.UsageError``, every absl
  flag error (unknown flag, bad value, missing value), every ml_collections config error (an
  unknown config field ``--config.ppo.lrr``, an unknown variant ``ppo.py:smok``, a missing
  config file, a value of the wrong type), a float config field or float flag that is not
  finite or that float32 cannot hold, a seed outside the PRNG's range
  (``config_utils.check_float32``, ``check_flag_values``: ``--config.dual.step_size=1e300``,
  ``--config.dual.step_size=inf``, ``--budget=1e-320``, ``--seed0=9223372036854775807``);
* ``errors.NonFiniteTraining`` → one line, exit 3;
* anything else → the traceback, exit 1 (a bug).

``--help`` (``--helpshort``, ``--helpfull``, ``--helpxml``) prints the help on stdout and exits 0
(absl itself exits 1 there).

Logging: library INFO lines (orbax logs 100+ per run through absl; absl; JAX) are hidden unless
``--verbosity`` is given (``--verbosity=0`` brings them back); this project's own INFO lines
(runtime, "resumed ... at update N") and every warning are kept, except orbax's complaints about
a damaged step's ``_CHECKPOINT_METADATA`` (``prada_jax.checkpointing`` names that damage in its
own one line). Commands with a config-file
flag also get ``--helpconfig``: print the resolved config (defaults plus overrides) and exit.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

from absl import app, flags
from absl import logging as absl_logging
from ml_collections.config_flags import config_flags

from prada_jax import config_utils
from prada_jax.errors import (
    EXIT_BAD_INPUT, EXIT_NON_FINITE, BadInput, NonFiniteTraining)

__all__ = ["run", "run_local", "parse_local", "one_line", "fail", "is_help", "HELP_ARGS",
           "check_flag_values",
           "EXIT_BAD_INPUT", "EXIT_NON_FINITE"]

FLAGS = flags.FLAGS
_TRACEBACK = "Traceback (most recent call last)"


# Every spelling of "print the help and exit 0" that any command accepts: absl's own four and
# the conventional short ``-h`` (absl knows only ``-?``). Commands with subcommands and
# ``parse_local`` commands test their argv with ``is_help``, so all commands agree.
HELP_ARGS = ("-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml")


def is_help(arg: str) -> bool:
    """Whether one argv item asks for the help (``HELP_ARGS``, also as ``--help=true``)."""
    return arg in HELP_ARGS or arg.split("=")[0] in HELP_ARGS[2:] and \
        arg.split("=", 1)[1].lower() in ("true", "1")


def one_line(e: BaseException | str) -> str:
    """The message of ``e`` on one line (whitespace runs collapsed); an embedded traceback is
    replaced by its final ``Type: message`` line without the type."""
    text = str(e)
    if isinstance(e, KeyError) and len(e.args) == 1 and isinstance(e.args[0], str):
        text = e.args[0]
    if _TRACEBACK in text:
        head, _, tb = text.partition(_TRACEBACK)
        last = [ln for ln in tb.splitlines() if ln.strip()][-1].strip()
        last = re.sub(r"^[\w.]+(Error|Exception): ", "", last)
        head = head.strip().rstrip(":").strip()
        head = re.sub(r":?\s*Error whilst parsing config file$", "", head)
        text = f"{head}: {last}" if head else last
    text = " ".join(text.split())
    return text or type(e).__name__


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    """Prints ``error: <message>`` (one line) on stderr and exits with ``code``."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(code)


def _config_flag_names() -> list[str]:
    return [name for name, fl in FLAGS._flags().items()
            if config_flags.is_config_flag(fl) and name == fl.name]


def _failing_flag(tb) -> str | None:
    """The ``--name=value`` of the absl flag whose parse raised (innermost Flag.parse frame)."""
    found = None
    while tb is not None:
        loc = tb.tb_frame.f_locals
        obj = loc.get("self")
        if isinstance(obj, flags.Flag):
            if isinstance(loc.get("field_path"), str):   # ml_collections: one config override
                found = f"--{obj.name}.{loc['field_path']}"
            else:
                arg = loc.get("argument")
                found = f"--{obj.name}" + (f"={arg}" if isinstance(arg, str) else "")
        tb = tb.tb_next
    return found


def _field_message(flag: str | None, e: BaseException, argv: Sequence[str]) -> str:
    """A misspelt/unknown config field (KeyError/AttributeError out of ml_collections); names
    the override flag as typed when the failing frame did not say which one."""
    msg = one_line(e.args[0] if e.args else e).strip("'\"")
    msg = msg.replace("\\'", "'").replace("\\n", " ")
    key = re.match(r"^'?(\w+)", msg)
    if flag and key and "." not in flag.split("=")[0]:
        base = flag.split("=")[0] + "."
        typed = [a.split("=")[0] for a in argv if a.startswith(base)
                 and re.search(rf"\.{key.group(1)}(\.|$)", a.split("=")[0])]
        if typed:
            flag = typed[0]
    msg = re.sub(r"^'?(\w+)'?\s*", r"no config field '\1'; ", msg, count=1).rstrip("; ")
    return f"{flag}: {msg}" if flag else msg


def _help_exit(tb) -> bool:
    """Whether a ``SystemExit`` came from absl's ``--help``/``--helpshort``/``--helpfull``/
    ``--helpxml`` flag (absl exits 1 after printing the help; the contract says 0)."""
    kinds = (app.HelpFlag, app.HelpfullFlag, app.HelpXMLFlag)
    while tb is not None:
        if isinstance(tb.tb_frame.f_locals.get("self"), kinds):
            return True
        tb = tb.tb_next
    return False


def _parse_flags(argv: Sequence[str]) -> list[str]:
    """absl's parser with every flag or config error turned into one line and exit 2; the
    help flags exit 0."""
    try:
        rest = FLAGS(list(argv))
    except SystemExit as e:
        if e.code == 1 and _help_exit(e.__traceback__):
            sys.stdout.flush()
            sys.exit(0)
        raise
    except flags.Error as e:
        fail(re.sub(r"^flag (--)", r"\1", one_line(e)))
    except (AttributeError, KeyError) as e:   # ml_collections: no such config field
        fail(_field_message(_failing_flag(e.__traceback__), e, argv))
    except (ValueError, TypeError, OSError) as e:
        flag = _failing_flag(e.__traceback__)
        fail(f"{flag}: {one_line(e)}" if flag else one_line(e))
    for name in _config_flag_names():
        value = FLAGS[name].value
        err = getattr(value, "_error", None) if type(value).__name__ == "_ErrorConfig" else None
        if err is not None:
            path = FLAGS[name].config_filename if hasattr(FLAGS[name], "config_filename") \
                else None
            if path and not os.path.exists(path.split(":")[0]):
                fail(f"--{name}={path.split(':')[0]}: config file not found")
            fail(f"--{name}: cannot load the config file ({one_line(err)})")
    _check_config_floats()
    try:
        check_flag_values(FLAGS)
    except BadInput as e:
        fail(one_line(e))
    return rest


def _check_config_floats() -> None:
    """Every config flag's float fields are finite and fit float32, and its seed fields fit the
    PRNG's range (``config_utils.check_float32``), checked before ``main`` runs: a value like
    ``--config.dual.step_size=1e300`` or ``=inf`` is one line, exit 2, instead of a run that
    writes files and then stops non-finite."""
    for name in _config_flag_names():
        value = FLAGS[name].value
        if value is None or type(value).__name__ == "_ErrorConfig":
            continue
        try:
            config_utils.check_float32(value, f"--{name}")
        except BadInput as e:
            fail(one_line(e))


def check_flag_values(fv: flags.FlagValues) -> None:
    """The same rule for plain flags: every float flag (and each item of a multi-float flag)
    finite and representable in float32, every seed flag (``seed``, ``seed0``, ``*_seed``) and
    seed count (``seeds``, ``*_seeds``) inside the PRNG's range (``config_utils.SEED_MAX``).
    Generic over the flags defined, so a new float flag of any command is covered.

    Raises:
      BadInput: ``--<flag>=<value>: <why>`` for the first such flag.
    """
    for name, fl in sorted(fv._flags().items()):
        if name != fl.name or fl.value is None or config_flags.is_config_flag(fl):
            continue
        values = fl.value if isinstance(fl.value, list) else [fl.value]
        for v in values:
            if isinstance(v, float):
                why = config_utils.float32_problem(v)
            else:
                why = config_utils.seed_problem(name, v)
            if why:
                raise BadInput(f"--{name}={v!r}: {why}")


_OWN_DIRS = tuple(str(Path(__file__).resolve().parents[1] / d) + os.sep
                  for d in ("prada_jax", "train", "evals", "envs", "benchmarks"))


# orbax's complaints about a step's metadata file (``_CHECKPOINT_METADATA``: missing, unreadable,
# not JSON), logged while it lists the steps. prada_jax.checkpointing reports the same damage in
# its own line (the step's manifest names the file), so at the default verbosity they are
# dropped: the user sees one line, not an ``E...`` line before it.
_ORBAX_DUPLICATES = ("Metadata file does not exist", "Failed to read Metadata file",
                     "Failed to json parse Metadata file")


class _OwnInfoOnly(logging.Filter):
    """Passes WARNING and above from anyone (except orbax's step-metadata complaints, which
    ``prada_jax.checkpointing`` reports itself), INFO and below only from this project's code
    (by source file): orbax's, absl's and JAX's INFO lines are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}orbax{os.sep}" in str(record.pathname) and \
                str(record.msg).startswith(_ORBAX_DUPLICATES):
            return False
        return record.levelno >= logging.WARNING or \
            str(record.pathname).startswith(_OWN_DIRS)


def _quiet_logging() -> None:
    """Unless the user gave ``--verbosity``: library INFO lines (orbax, absl, JAX) are hidden,
    this project's own INFO lines (resumed at update N, runtime, mesh) and every warning stay."""
    if "verbosity" in FLAGS and FLAGS["verbosity"].present:
        return
    absl_logging.set_verbosity(absl_logging.INFO)
    flt = _OwnInfoOnly()
    for h in logging.getLogger().handlers:
        h.addFilter(flt)
    absl_logging.get_absl_handler().addFilter(flt)


def _under_contract(main: Callable, argv) -> object:
    """``main(argv)`` with the contract's errors mapped to one line and their exit code:
    ``BadInput`` and ``app.UsageError`` → 2, ``NonFiniteTraining`` → 3; anything else
    propagates (a bug: traceback, exit 1)."""
    try:
        return main(argv)
    except (BadInput, app.UsageError) as e:
        fail(one_line(e), EXIT_BAD_INPUT)
    except NonFiniteTraining as e:
        fail(one_line(e), EXIT_NON_FINITE)


def _wrap(main: Callable[[list[str]], object]) -> Callable[[list[str]], None]:
    def wrapped(argv: list[str]) -> None:
        _quiet_logging()
        if "helpconfig" in FLAGS and FLAGS.helpconfig:
            try:
                _print_configs()
                sys.stdout.flush()
            except BrokenPipeError:   # ``--helpconfig | head``: the reader left, not an error
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        rc = _under_contract(main, argv)
        if isinstance(rc, int) and not isinstance(rc, bool) and rc:
            sys.exit(rc)
    return wrapped


def _print_configs() -> None:
    for name in _config_flag_names():
        value = FLAGS[name].value
        if value is None:
            print(f"--{name}: not given (e.g. --{name}=prada_jax/configs/<name>.py)")
            continue
        print(f"# --{name} (resolved: defaults, variant and --{name}.<field> overrides)")
        print(config_utils.config_to_json(value))


def hub_offline() -> None:
    """Hugging Face offline for this process: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE``
    = 1 unless already set (a model is always a local folder here; a hub name would otherwise
    cost ~50 s of retries before failing). The one place they are set: commands that may load
    a transformers model or tokenizer call this at the start of ``main``, before any lazy
    transformers import (huggingface_hub reads them once, at import)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def run(main: Callable[[list[str]], object], *,
        define_flags: Callable[[], None] | None = None,
        argv: Sequence[str] | None = None) -> None:
    """Runs ``main(argv)`` under absl with the project's error contract (module docstring).

    ``define_flags`` (optional) defines the command's flags first, so that importing the
    command module defines none. ``main`` may return an int exit code (0/None: success).
    """
    if define_flags is not None:
        define_flags()
    argv = list(sys.argv if argv is None else argv)
    # absl's short help flag is ``-?``; ``-h`` (which absl rejects as an unknown flag) means
    # the same here, as in every other command of the project
    argv = [argv[0], *("--help" if a == "-h" else a for a in argv[1:])]
    if _config_flag_names() and "helpconfig" not in FLAGS:
        flags.DEFINE_flag(flags.BooleanFlag(
            "helpconfig", False, "print the resolved config (fields with their default or "
            "overridden values) and exit"), module_name=sys.argv[0])   # listed by --help
    app.run(_wrap(main), argv=argv, flags_parser=_parse_flags)


# ----------------------------------------------------------------------------- local flags
# Commands that are also called in-process with an argv list (benchmarks: ``main(["--x=1"])``
# from the suite runner and the tests) parse into their own ``FlagValues`` instead of the
# global one, so calling them twice in one process never redefines a flag.

def parse_local(define: Callable[[flags.FlagValues], None], argv: Sequence[str] | None,
                prog: str, doc: str | None = None) -> flags.FlagValues:
    """Defines flags with ``define(fv)`` on a fresh ``FlagValues``, parses ``argv`` (default
    ``sys.argv[1:]``) and returns it. ``--help`` prints ``doc`` and the flags, then exits 0;
    a bad flag, a bad value or a positional argument raises ``BadInput`` naming it."""
    fv = flags.FlagValues()
    define(fv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(is_help(a) for a in argv):
        print(f"{doc.strip()}\n" if doc else f"python -m {prog}\n")
        print(fv.get_help() or "(no flags)")
        sys.exit(0)
    try:
        rest = fv([prog, *argv])[1:]
    except flags.Error as e:
        raise BadInput(re.sub(r"^flag (--)", r"\1", one_line(e))) from None
    if rest:
        raise BadInput(f"unexpected command-line arguments: {' '.join(rest)}")
    check_flag_values(fv)
    return fv


def run_local(main: Callable[[list[str] | None], object]) -> None:
    """``sys.exit`` of ``main(None)`` under the error contract, for ``parse_local`` commands.
    An int result is the exit code; anything else (a results dict) means success."""
    rc = _under_contract(main, None)
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)
