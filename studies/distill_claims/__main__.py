"""``python -m studies.distill_claims``: the multi-seed ReOPD claims report (registration and
records: studies/distill_claims/README.md; absl flags, input checks, printing). The library
(plan, runs, summary; its docstring lists the methods) is :mod:`studies.distill_claims`; bad
input raises ``BadInput`` (one stderr line, exit 2 under ``prada_jax.cli.run_local``).
"""
from __future__ import annotations

from pathlib import Path

import studies.distill_claims as _lib
from studies.distill_claims import (PLAN, claims, claims_markdown, heldout_diagnostics,
                                    parse_seeds, plot_success, read_json_object, run,
                                    success_curves, summarize, to_markdown)
from absl import flags

from prada_jax import cli
from prada_jax.distill.entry import undash
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json


def _define(fv) -> None:
    flags.DEFINE_string("out", "checkpoints/distill_report", "report folder", flag_values=fv)
    flags.DEFINE_string("cache", "checkpoints/task_cache/seed0",
                        "task cache (pool/, logits/, teacher/)", flag_values=fv)
    flags.DEFINE_string("seeds", "0-9", "consecutive student seeds, '0,1,2' or '0-9' (one "
                        "vmapped run per method, config.train.num_seeds)", flag_values=fv)
    flags.DEFINE_integer("eval_points", 0, "task evaluations inside each run (besides before "
                         "and after) for the success-vs-updates curves", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_float("margin", 0.02, "smallest difference in task success that matters "
                       "(claim verdicts)", lower_bound=0.0, flag_values=fv)
    flags.DEFINE_integer("steps", 1000, "offline updates from random init", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("warm_steps", 300,
                         "offline updates of the warm starts (warm_k0.6, warm_k1)",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("cont_steps", 300, "offline updates continuing a warm start (cont_*)",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("onpolicy_steps", 100, "on-policy updates (reopd_*)", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("batch_size", 64, "(trajectory, turn) pairs per update, every method",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("wall_steps", 0, "updates of cont_k0.6_wall; 0 = onpolicy_steps × the "
                         "measured median update time of reopd_k0.6 / cont_k0.6", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_integer("n_eval", 256, "task episodes per evaluation", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_string("methods", "fkl_k0.6,fkl_k1,fkl_late,sft,fkl_auto,warm_k0.6,"
                        "cont_k0.6,cont_auto,reopd_k0.6,cont_k0.6_wall",
                        f"comma-separated, in run order; from {', '.join(PLAN)}", flag_values=fv)
    flags.DEFINE_enum("warm", "warm_k0.6", list(_lib.WARM_STARTS),
                      "warm start of the continuations and on-policy runs (cont_*, reopd_k0.6, "
                      "reopd_auto, cont_k0.6_wall); warm_k1 on tasks where κ = 0.6 from "
                      "scratch stays near 0", flag_values=fv)
    flags.DEFINE_string("merge_from", "",
                        "comma-separated report folders whose runs.json are merged in first "
                        "(e.g. one folder per seed run in parallel)", flag_values=fv)


def main(argv=None) -> int:
    """``python -m studies.distill_claims`` (absl flags; bad input raises ``BadInput``)."""
    cli.hub_offline()
    names = flags.FlagValues()
    _define(names)
    args = cli.parse_local(_define, undash(argv, list(names)), "studies.distill_claims", _lib.__doc__)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError:
        raise BadInput(f"--seeds={args.seeds}: expected consecutive integers, '0,1,2' or "
                       "'0-9'") from None
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in PLAN]
    if unknown:
        raise BadInput(f"--methods: unknown {unknown}; choose from {sorted(PLAN)}")
    sources = [Path(d) / "runs.json" for d in args.merge_from.split(",") if d]
    merged = {}
    for f in sources:
        merged.update(read_json_object(f, "--merge_from"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if sources:
        if (out / "runs.json").is_file():
            merged.update(read_json_object(out / "runs.json", "--out"))
        write_json(out / "runs.json", merged, newline=False)
    budgets = {"steps": args.steps, "warm": args.warm_steps, "cont": args.cont_steps,
               "onpolicy": args.onpolicy_steps, "wall": args.wall_steps}
    try:
        runs = run(out, args.cache, seeds, budgets, args.n_eval, methods, args.eval_points,
                   batch_size=args.batch_size, warm=args.warm)
    except FileNotFoundError as e:
        raise BadInput(str(e)) from None
    roots = [out] + [Path(d) for d in args.merge_from.split(",") if d]
    if heldout_diagnostics(runs, roots, args.cache):
        write_json(out / "runs.json", runs, newline=False)
    table = summarize(runs, args.cache)
    cl = claims(runs, args.margin)
    curves = success_curves(runs)
    write_json(out / "report.json", {**table, "claims": cl, "curves": curves},
               newline=False)
    png = plot_success(curves, out / "success_vs_updates.png", table["task"])
    md = to_markdown(table)
    if cl:
        md = claims_markdown(cl) + "\n## All runs\n\n" + md
    if png is not None:
        md += f"\n![task success vs updates]({png.name})\n"
    (out / "report.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    from prada_jax import cli as _cli
    _cli.run_local(main)
