"""Times loading a full synthetic trace set (default gsm8k): median of repeats, in milliseconds.

    python -m benchmarks.trace_load [--preset gsm8k] [--repeats 20] [--dir DIR]

Prints the median (and min/max) wall time of ``prada_jax.traces.load`` with full validation and
the sha256 content-hash check, without the hash check, and of ``jax.device_put`` of the loaded
set; also the one-off generation + save time. Data: SYNTHETIC (``prada_jax.traces.synthetic``).
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import jax
from absl import flags

from prada_jax import cli
from prada_jax.presets import BENCHMARKS
from prada_jax.traces import format as fmt
from prada_jax.traces import synthetic


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _fmt(name: str, ts: list[float]) -> str:
    ms = [1e3 * t for t in ts]
    return (f"{name:<34} median {statistics.median(ms):8.2f} ms   "
            f"min {min(ms):8.2f}   max {max(ms):8.2f}   (n={len(ms)})")


def main(argv: list[str] | None = None) -> int:
    """``argv``: absl flags (``--preset=gsm8k``); None = the command line."""
    def define(fv):
        flags.DEFINE_enum("preset", "gsm8k", list(BENCHMARKS), "synthetic preset",
                          flag_values=fv)
        flags.DEFINE_integer("repeats", 20, "timed loads (median)", lower_bound=1,
                             flag_values=fv)
        flags.DEFINE_string("dir", None, "cache folder (default: a temporary one)",
                            flag_values=fv)

    args = cli.parse_local(define, argv, "benchmarks.trace_load", __doc__)

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.dir) if args.dir else Path(tmp)
        t0 = time.perf_counter()
        path = synthetic.get_or_make(args.preset, cache)
        t_make = time.perf_counter() - t0
        meta = fmt.read_meta(path)
        size_mb = (path / fmt.NODES_FILE).stat().st_size / 2 ** 20
        print(f"SYNTHETIC {args.preset}: {meta['counts']['problems']} problems, "
              f"{meta['counts']['nodes']} nodes, {size_mb:.1f} MiB nodes.safetensors; "
              f"generate/check + save {t_make:.2f} s (once)")
        fmt.load(path)   # warm the page cache and imports
        print(_fmt("load (validate + sha256)", _time(lambda: fmt.load(path), args.repeats)))
        print(_fmt("load (validate, no hash)",
                   _time(lambda: fmt.load(path, check_hash=False), args.repeats)))
        traces = fmt.load(path)
        put = lambda: jax.block_until_ready(jax.device_put(traces))  # noqa: E731
        put()
        print(_fmt(f"jax.device_put ({jax.default_backend()})", _time(put, args.repeats)))
    return 0


if __name__ == "__main__":
    cli.run_local(main)
