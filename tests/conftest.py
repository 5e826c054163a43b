"""Shared test set-up: offline Hugging Face, CPU JAX, one persistent compilation cache for the
session, and ``run_command`` (a command line run in this process)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One JAX persistent compilation cache for the whole session, shared by the xdist workers and
# by every subprocess a test starts (they inherit the environment). Set before JAX is imported
# (JAX reads these variables when it defines its options). Only programs that took at least
# half a second to compile are written (the trainers' chunks, which resume tests and
# subprocesses compile again): writing each of the thousands of millisecond programs cost more
# than it saved. The size cap turns on JAX's file lock, so two workers never read an entry the
# other is still writing.
_CACHE = Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax_compilation_cache"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
if importlib.util.find_spec("filelock") is not None:
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

# The tests compile hundreds of small programs and run each for milliseconds: compilation, not
# execution, is their cost, so LLVM's optimisation passes are skipped (JAX's
# ``jax_disable_most_optimizations``: backend optimisation level 0, no expensive LLVM passes;
# XLA's HLO passes, which decide fusion, still run). Low bits may differ from an optimised
# build; every comparison between two programs uses a tolerance or compiles both in this mode.
# Set as JAX's own option (inherited by subprocesses), so a test that switches it on for itself
# compiles the same programs, with the same cache keys, as the rest of the session.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


@pytest.fixture
def fast_compile():
    """Fewer XLA optimisations for a compile-bound test even when the session runs without
    them (``JAX_DISABLE_MOST_OPTIMIZATIONS=0``); the previous setting is restored after."""
    import jax
    old = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


@pytest.fixture
def run_command(capfd):
    """``run_command(module, *args, cwd=None) -> (exit code, stdout, stderr)``: runs
    ``python -m module args`` in this process (``runpy``, ``__name__ == "__main__"``), for
    command-line cases where a subprocess adds nothing but start-up time. The flags the run
    defines on absl's global ``FLAGS`` are removed afterwards, so a command may run again; the
    logging filters and level a command installs are undone."""
    import logging
    import runpy
    import traceback
    import warnings

    from absl import app, flags  # noqa: F401  (absl.app defines its flags on import)
    from absl import logging as absl_logging

    def run(module: str, *args: str, cwd=None):
        FLAGS = flags.FLAGS
        defined = set(FLAGS)
        root = logging.getLogger()
        handlers = list(root.handlers) + [absl_logging.get_absl_handler()]
        filters = {h: list(h.filters) for h in handlers}
        level = absl_logging.get_verbosity()
        # absl's handler keeps the stream it was created with: point it at this run's stderr
        py_handler = absl_logging.get_absl_handler().python_handler
        stream = py_handler.stream
        mp = pytest.MonkeyPatch()
        mp.setattr(sys, "argv", [module, *args])
        if cwd is not None:
            mp.chdir(cwd)
        capfd.readouterr()
        py_handler.stream = sys.stderr
        code = 0
        try:
            with warnings.catch_warnings():
                # runpy's note that the module was imported before (by another test)
                warnings.filterwarnings("ignore", message=".*found in sys.modules",
                                        category=RuntimeWarning)
                runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:   # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        finally:
            for name in set(FLAGS) - defined:
                delattr(FLAGS, name)
            for h, f in filters.items():
                h.filters[:] = f
            absl_logging.set_verbosity(level)
            py_handler.stream = stream
            mp.undo()
        out, err = capfd.readouterr()
        return code, out, err

    return run
