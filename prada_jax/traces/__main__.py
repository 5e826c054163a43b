"""Command line for step traces: validate, synth, stats, build.

    python -m prada_jax.traces validate DIR [DIR ...]
    python -m prada_jax.traces synth --preset gsm8k --out DIR [--seed 0] [--problems N]
        [--prm-noise X] [--prm-miscalibration X] [--prm-miss X] [--full-depth D]
        [--node-budget B]
    python -m prada_jax.traces stats DIR [DIR ...] [--preset all|NAME ...] [--json FILE]
    python -m prada_jax.traces build ...        (needs the [torch] extra; see build.py)

Bad data (a malformed trace folder, an invalid generator setting) prints one line on stderr and
exits with code 2, without a traceback. Bad flags are argparse errors (also code 2).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

from prada_jax.traces.format import TraceFormatError, load, read_meta, save

EXIT_BAD_DATA = 2


def _cmd_validate(args) -> int:
    for d in args.dirs:
        meta = read_meta(d)
        load(d)
        print(f"{d}: OK ({meta['benchmark']}, {meta['counts']['problems']} problems, "
              f"{meta['counts']['nodes']} nodes, format v{meta['format_version']}"
              f"{', synthetic' if meta['synthetic'] else ''})")
    return 0


def _cmd_synth(args) -> int:
    from prada_jax.traces import synthetic

    t0 = time.perf_counter()
    traces, meta = synthetic.generate(
        args.preset, seed=args.seed, problems=args.problems, prm_noise=args.prm_noise,
        prm_miscalibration=args.prm_miscalibration, prm_miss=args.prm_miss,
        full_depth=args.full_depth, node_budget=args.node_budget)
    out = save(traces, args.out, meta)
    print(f"wrote {out} (SYNTHETIC {args.preset}: {traces.num_problems} problems, "
          f"{traces.num_nodes} nodes, seed {args.seed}) in {time.perf_counter() - t0:.2f} s")
    return 0


def _cmd_stats(args) -> int:
    from prada_jax.traces import stats, synthetic

    rows = []
    for d in args.dirs:
        rows.append(stats.trace_stats(load(d), read_meta(d)))
    presets = []
    for name in args.preset or []:
        presets.extend(sorted(synthetic.PRESETS) if name == "all" else [name])
    for name in presets:
        traces, meta = synthetic.generate(name, seed=args.seed)
        rows.append(stats.trace_stats(traces, meta))
    if not rows:
        print("stats: give at least one DIR or --preset", file=sys.stderr)
        return EXIT_BAD_DATA
    print(stats.summary_table(rows))
    if any(r["synthetic"] for r in rows):
        print("[synthetic] = synthetic data from prada_jax.traces.synthetic, not model outputs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def _cmd_build(args) -> int:
    return args.build_run(args)


def _add_build(sub) -> None:
    """Adds the ``build`` subcommand; its module is imported only when ``build`` is asked for."""
    p = sub.add_parser("build", help="build real traces with Hugging Face models ([torch] extra)",
                       add_help=False)
    p.set_defaults(func=_cmd_build)


def _parser() -> argparse.ArgumentParser:
    from prada_jax.traces.synthetic import PRESETS

    ap = argparse.ArgumentParser(prog="python -m prada_jax.traces", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("validate", help="check trace folders; exit 0 if all are valid")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("synth", help="write a calibrated synthetic trace set")
    p.add_argument("--preset", required=True, choices=sorted(PRESETS))
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--problems", type=int, default=None,
                   help="number of problems (default: the published count)")
    p.add_argument("--prm-noise", type=float, default=None,
                   help="sd of the noise on the PRM logit (default 1.0)")
    p.add_argument("--prm-miscalibration", type=float, default=None,
                   help="m in sigmoid((1+m) logit(v)); 0 = calibrated (default 0)")
    p.add_argument("--prm-miss", type=float, default=None,
                   help="probability the PRM overlooks an error (default 0.2)")
    p.add_argument("--full-depth", type=int, default=None, help="complete tree depth (default 4)")
    p.add_argument("--node-budget", type=int, default=None,
                   help="per-problem node budget for optional branches (default 64)")
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("stats", help="print the summary table of trace folders / presets")
    p.add_argument("dirs", nargs="*", metavar="DIR")
    p.add_argument("--preset", action="append", choices=sorted(PRESETS) + ["all"],
                   help="also generate this synthetic preset in memory (repeatable; 'all')")
    p.add_argument("--seed", type=int, default=0, help="seed for --preset")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the stats as JSON")
    p.set_defaults(func=_cmd_stats)

    _add_build(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    if argv and argv[0] == "build":
        try:
            build = importlib.import_module("prada_jax.traces.build")
        except ImportError as e:
            print(f"build: cannot import the real trace builder ({e}); install the [torch] extra: "
                  "pip install -e '.[torch]'", file=sys.stderr)
            return EXIT_BAD_DATA
        bp = argparse.ArgumentParser(prog="python -m prada_jax.traces build")
        build.add_arguments(bp)
        args = bp.parse_args(argv[1:])
        args.build_run = build.run
        return _run(_cmd_build, args, catch_value_errors=False)
    args = ap.parse_args(argv)
    return _run(args.func, args)


def _run(fn, args, catch_value_errors: bool = True) -> int:
    try:
        return int(fn(args) or 0)
    except TraceFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_DATA
    except ValueError as e:   # invalid generator settings and the like, named in the message
        if not catch_value_errors:
            raise
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_DATA


if __name__ == "__main__":
    sys.exit(main())
