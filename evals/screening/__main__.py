"""``python -m evals.screening``: the oracle's ceiling and PRADA vs random at equal offload share.

    python -m evals.screening --policy=POLICY_DIR [--seeds=16] [--arrival_rate_hz=4]
        [--shares=0.05,0.1,0.2,0.4,0.6,0.8] [--out=DIR]

At light load (default λ = 4 users/s, the policy's env otherwise), on the test split, over
``--seeds`` paired seeds: All-SLM, the LLM alone, the oracle screening (unlimited and each
budget k) and, for each θ of the critic's grid, PRADA (ΔQ > θ; and the actor's logit margin
> m, through the policy's own operating point) against random screening matched to its
measured offload share, with the share of the SLM→LLM accuracy gap each
recovers (:mod:`evals.screening`). Prints the table; with ``--out`` also writes
``screening.json`` (per-seed metrics and the summary). A synthetic trace set's numbers are
labelled SYNTHETIC. Bad input: one stderr line naming the flag, exit 2, nothing written.
"""
from __future__ import annotations

import sys
from pathlib import Path

from absl import flags

from evals import evaluate as ev
from evals import command_flags, knobs, screening, suite
from evals.sweep import parse_grid
from prada_jax import cli, config_utils
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json


def _define_flags():
    command_flags.define_input_flags()
    command_flags.define_window_flags(16, "paired seeds (≥ 16 for the light-load comparison).",
                              slots=2000, warmup_slots=200)
    flags.DEFINE_integer("seed0", 0, "first seed, an offset inside the split's seed range "
                         "(prada_jax.traces.splits).", lower_bound=0)
    flags.DEFINE_list("shares", [f"{x:g}" for x in screening.DEFAULT_SHARES],
                      "offload shares the PRADA θ points aim at (evals.knobs.theta_grid).")
    flags.DEFINE_string("out", None, "folder for screening.json (default: print only).")


def light_load_env(env_kw: dict, num_servers, num_users, drain_slots: int) -> dict:
    """The env of the comparison: the policy's, with a serving engine's batch (M =
    ``edge.DEFAULT_MAX_NUM_SEQS``) unless ``--num_servers`` is given, and U sized so arrivals
    are not blocked while a user stays up to the timeout (``suite.users_for``) unless
    ``--num_users`` is given: at the default 4 users/s no row then contends, so accuracy is
    the screen's alone (each row's ρ is printed)."""
    kw = dict(env_kw)
    if num_servers is None and kw.get("server_model") == "serving":
        kw["num_servers"] = ev.edge.DEFAULT_MAX_NUM_SEQS
    if num_users is None:
        kw["num_users"] = suite.users_for(kw["arrival_rate_hz"],
                                          drain_slots * float(kw.get("tau_s", 0.05)))
    print(f"note: M = {kw['num_servers']} server sequences, U = {kw['num_users']} user slots "
          "(--num_servers, --num_users override)", file=sys.stderr, flush=True)
    return kw


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.policy, "--policy", "a screening policy folder (train.ppo "
                              "run or its critic refit, e.g. train.policy_samples' seed_0/critic)")
    if F.warmup_slots >= F.slots:
        raise BadInput(f"--warmup_slots ({F.warmup_slots}) must be < --slots ({F.slots})")
    shares = parse_grid(F.shares, "shares")
    if not shares or any(not 0.0 < s < 1.0 for s in shares):
        raise BadInput(f"--shares={','.join(F.shares)}: give offload shares in (0, 1)")
    out = config_utils.check_output_dir(Path(F.out), "--out") if F.out else None
    policy, _, _, traces, env_kw = command_flags.inputs_from_flags(F)
    env_kw = light_load_env(env_kw, F.num_servers, F.num_users, F.drain_slots)
    suite.check_fits(F.seeds, env_kw["num_users"])
    seed0 = suite.evaluation_seed0(traces.info, policy, F.seeds, F.seed0)
    params = ev.edge.make_params(traces.traces, **env_kw)
    evaluator = ev.Evaluator(params, F.seeds, F.slots, F.warmup_slots, policy.apply_fn,
                             policy.params, seed0=seed0, drain_slots=F.drain_slots)
    scores = {m: knobs.node_scores(policy.apply_fn, policy.params, params, m)
              for m in ("prada", "prada_actor")}
    comp = screening.compare(evaluator, scores, shares,
                             progress=lambda m: print(m, file=sys.stderr, flush=True))
    summary = screening.summarize(comp)
    synthetic = bool(traces.info.get("synthetic", False))
    title = (f"{'SYNTHETIC traces: ' if synthetic else ''}{traces.info['benchmark']}, "
             f"{suite.split_label(traces.info, policy)}; U={env_kw['num_users']} "
             f"M={env_kw['num_servers']} λ={env_kw['arrival_rate_hz']:g}/s "
             f"hardware={env_kw['hardware']} server={env_kw['server_model']}; {F.seeds} seeds "
             f"from {seed0}, window [{F.warmup_slots}, {F.slots}) slots, timeout "
             f"{evaluator.timeout_s:g} s; policy {policy.workdir}")
    text = screening.format_report(summary, title)
    print(text)
    if out is not None:
        meta = {"traces": traces.info, "env": env_kw, "seeds": F.seeds, "seed0": seed0,
                "slots": F.slots, "warmup_slots": F.warmup_slots, "drain_slots": F.drain_slots,
                "policy": str(policy.workdir), "synthetic": synthetic, "shares": shares}
        per_seed = {k: {m: [float(x) for x in v] for m, v in row.items()}
                    for k, row in comp.per_seed.items()}
        write_json(out / "screening.json", {"meta": meta, "summary": summary,
                                            "per_seed": per_seed, "text": text})
        print(f"results: {out / 'screening.json'}")


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
