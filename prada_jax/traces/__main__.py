"""Command line for step traces: validate, synth, stats, build (absl flags, one per word).

    python -m prada_jax.traces validate DIR [DIR ...]
    python -m prada_jax.traces synth --preset=gsm8k --out=DIR [--seed=0] [--problems=N]
        [--prm_noise=X] [--prm_miscalibration=X] [--prm_miss=X] [--full_depth=D]
        [--node_budget=B]
    python -m prada_jax.traces stats DIR [DIR ...] [--preset=all|NAME ...] [--json=FILE]
    python -m prada_jax.traces build --slm=DIR --llm=DIR --prm=DIR --data=FILE ...
        ([torch] extra; flags in prada_jax/traces/builder/cli.py, docs/build_traces.md)
    python -m prada_jax.traces SUBCOMMAND --help

Flags are absl flags (``--name=value`` or ``--name value``); the older dash spellings
(``--prm-noise``) are accepted as aliases of the underscore names. Exit codes as every command
(README, "Errors and exit codes"): 2 for bad input — a bad flag, a malformed trace folder, an
invalid generator setting — with one line on stderr naming it and nothing written; 1 a bug.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time

from absl import flags

from prada_jax.cli import check_flag_values, hub_offline, is_help, one_line
from prada_jax.errors import EXIT_BAD_INPUT, BadInput
from prada_jax.presets import BENCHMARKS
from prada_jax.traces import stats, synthetic
from prada_jax.traces.format import load, read_meta, save, validate_notes

EXIT_BAD_DATA = EXIT_BAD_INPUT
SUBCOMMANDS = ("validate", "synth", "stats", "build")


# ----------------------------------------------------------------------------- subcommands

def _cmd_validate(fv, dirs) -> int:
    if not dirs:
        raise BadInput("validate: give at least one trace folder DIR")
    for d in dirs:
        meta = read_meta(d)
        load(d)
        notes = "".join(f"; {n}" for n in validate_notes(d, meta))
        print(f"{d}: OK ({meta['benchmark']}, {meta['counts']['problems']} problems, "
              f"{meta['counts']['nodes']} nodes, format v{meta['format_version']}"
              f"{', synthetic' if meta['synthetic'] else ''}){notes}")
    return 0


def _cmd_synth(fv, rest) -> int:
    if rest:
        raise BadInput(f"synth: unexpected arguments {' '.join(rest)}")
    if len(fv.preset) != 1 or fv.preset[0] == "all":
        raise BadInput(f"--preset: synth needs exactly one of {', '.join(BENCHMARKS)}")
    if not fv.out:
        raise BadInput("--out is required")
    preset = fv.preset[0]
    t0 = time.perf_counter()
    traces, meta = synthetic.generate(
        preset, seed=fv.seed, problems=fv.problems, prm_noise=fv.prm_noise,
        prm_miscalibration=fv.prm_miscalibration, prm_miss=fv.prm_miss,
        full_depth=fv.full_depth, node_budget=fv.node_budget)
    out = save(traces, fv.out, meta)
    print(f"wrote {out} (SYNTHETIC {preset}: {traces.num_problems} problems, "
          f"{traces.num_nodes} nodes, seed {fv.seed}) in {time.perf_counter() - t0:.2f} s")
    return 0


def _cmd_stats(fv, dirs) -> int:
    presets = []
    for name in fv.preset:
        presets.extend(BENCHMARKS if name == "all" else [name])
    if not dirs and not presets:
        raise BadInput("stats: give at least one DIR or --preset")
    if fv.json and os.path.isdir(fv.json):
        raise BadInput(f"--json={fv.json}: is a directory")
    rows = [stats.trace_stats(load(d), read_meta(d)) for d in dirs]
    for name in presets:
        traces, meta = synthetic.generate(name, seed=fv.seed)
        rows.append(stats.trace_stats(traces, meta))
    print(stats.summary_table(rows))
    if any(r["synthetic"] for r in rows):
        print("[synthetic] = synthetic data from prada_jax.traces.synthetic, not model outputs")
    if fv.json:
        with open(fv.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def _define(cmd: str, fv: flags.FlagValues) -> None:
    """The flags of one subcommand, on their own FlagValues (subcommands share names with
    different defaults, e.g. ``--node_budget``)."""
    if cmd in ("synth", "stats"):
        flags.DEFINE_multi_enum("preset", [], list(BENCHMARKS) + ["all"],
                                "synthetic preset (synth: exactly one; stats: repeatable, "
                                "'all' = every preset, generated in memory)", flag_values=fv)
        flags.DEFINE_integer("seed", 0, "generator seed", flag_values=fv)
    if cmd == "synth":
        flags.DEFINE_string("out", None, "output trace folder", flag_values=fv)
        flags.DEFINE_integer("problems", None, "number of problems (default: the published "
                             "count)", lower_bound=1, flag_values=fv)
        flags.DEFINE_float("prm_noise", None, "sd of the noise on the PRM logit (default 1.0)",
                           flag_values=fv)
        flags.DEFINE_float("prm_miscalibration", None, "m in sigmoid((1+m) logit(v)); "
                           "0 = calibrated (default 0)", flag_values=fv)
        flags.DEFINE_float("prm_miss", None, "probability the PRM overlooks an error "
                           "(default 0.2)", flag_values=fv)
        flags.DEFINE_integer("full_depth", None, "complete tree depth (default 4)",
                             flag_values=fv)
        flags.DEFINE_integer("node_budget", None, "per-problem node budget for optional "
                             "branches (default 64)", flag_values=fv)
    if cmd == "stats":
        flags.DEFINE_string("json", None, "also write the stats as JSON to this file",
                            flag_values=fv)
    if cmd == "build":
        _define_from_argparse(_build_parser(), fv)


# ----------------------------------------------------------------------------- build

def _build_parser() -> argparse.ArgumentParser:
    # Imported by name when the subcommand is chosen: without the [torch] extra an ImportError
    # here becomes one clear error line (main), not a failure of every subcommand.
    build = importlib.import_module("prada_jax.traces.builder.cli")
    p = argparse.ArgumentParser(prog="python -m prada_jax.traces build", add_help=False)
    build.add_arguments(p)
    return p


def _define_from_argparse(parser: argparse.ArgumentParser, fv: flags.FlagValues) -> None:
    """absl flags for the options of ``build.add_arguments`` (the builder's flag spec): one
    flag per option, named by its ``dest`` (``--node_budget``), same type, default, choices."""
    for a in parser._actions:  # noqa: SLF001  (argparse has no public action list)
        if not a.option_strings or isinstance(a, argparse._HelpAction):  # noqa: SLF001
            continue
        help_ = (a.help or a.dest) + (" (required)" if a.required else "")
        if isinstance(a, argparse._StoreTrueAction):  # noqa: SLF001
            flags.DEFINE_bool(a.dest, False, help_, flag_values=fv)
        elif a.choices:
            flags.DEFINE_enum(a.dest, a.default, list(a.choices), help_, flag_values=fv)
        elif a.type is int:
            flags.DEFINE_integer(a.dest, a.default, help_, flag_values=fv)
        elif a.type is float:
            flags.DEFINE_float(a.dest, a.default, help_, flag_values=fv)
        else:
            flags.DEFINE_string(a.dest, a.default, help_, flag_values=fv)


def _build_namespace(fv: flags.FlagValues) -> argparse.Namespace:
    parser = _build_parser()
    ns = argparse.Namespace()
    for a in parser._actions:  # noqa: SLF001
        if not a.option_strings or isinstance(a, argparse._HelpAction):  # noqa: SLF001
            continue
        value = fv[a.dest].value
        if a.required and value is None:
            raise BadInput(f"--{a.dest} is required")
        setattr(ns, a.dest, value)
    return ns


def _cmd_build(fv, rest) -> int:
    if rest:
        raise BadInput(f"build: unexpected arguments {' '.join(rest)}")
    build = importlib.import_module("prada_jax.traces.builder.cli")
    return build.run(_build_namespace(fv))


# ----------------------------------------------------------------------------- entry

_RUN = {"validate": _cmd_validate, "synth": _cmd_synth, "stats": _cmd_stats,
        "build": _cmd_build}


def _normalise(argv: list[str]) -> list[str]:
    """``--prm-noise=1`` → ``--prm_noise=1`` (dash spellings are aliases)."""
    out = []
    for a in argv:
        m = re.match(r"^(--?)([A-Za-z][\w-]*)(=.*)?$", a, re.S)
        out.append(f"{m.group(1)}{m.group(2).replace('-', '_')}{m.group(3) or ''}" if m else a)
    return out


def _error(msg: str) -> int:
    print(f"error: {one_line(msg)}", file=sys.stderr, flush=True)
    return EXIT_BAD_DATA


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the exit code (0 ok, 2 bad input)."""
    hub_offline()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] == "help" or is_help(argv[0]):
        print(__doc__)
        return 0 if argv else EXIT_BAD_DATA
    cmd, rest = argv[0], argv[1:]
    if cmd not in SUBCOMMANDS:
        return _error(f"unknown subcommand {cmd!r}; choose from {', '.join(SUBCOMMANDS)}")
    fv = flags.FlagValues()
    try:
        _define(cmd, fv)
    except ImportError as e:
        return _error(f"build: cannot import the real trace builder ({e}); install the [torch] "
                      "extra: pip install -e '.[torch]'")
    if any(is_help(a) for a in rest):
        print(f"python -m prada_jax.traces {cmd} ...\n")
        print(fv.get_help() or "(no flags)")
        return 0
    try:
        positional = fv([f"prada_jax.traces {cmd}", *_normalise(rest)])[1:]
    except flags.Error as e:
        return _error(re.sub(r"^flag (--)", r"\1", str(e)))
    try:
        check_flag_values(fv)
    except BadInput as e:
        return _error(str(e))
    try:
        return int(_RUN[cmd](fv, positional) or 0)
    except BadInput as e:
        return _error(str(e))


if __name__ == "__main__":
    sys.exit(main())
