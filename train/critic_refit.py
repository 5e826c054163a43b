"""Stage-1 critic calibration and refit (issue 14): Monte-Carlo ΔQ of the frozen actor.

    python -m train.critic_refit --policy=PPO_DIR --out=NEW_DIR [--fit_states=40000]
        [--eval_states=6000] [--sampling_replicates=0] [--steps=4000] [--seed=0]
        [--measure_only] [--split=validation]

Writes ``NEW_DIR/critic_check.json`` (the critic's ΔQ against Monte-Carlo policy evaluation,
before and after the refit) and, unless ``--measure_only``, makes ``NEW_DIR`` a policy folder
(the same actor, the critic refit for it) that every ``--policy`` flag loads. The library is
``train.critic``. Exit codes (``prada_jax.cli``): 2 bad input (one line naming the
flag or file, nothing written), 1 a bug.
"""
from __future__ import annotations

from absl import flags

from prada_jax import cli, config_utils
from prada_jax.errors import BadInput


def _define_flags():
    flags.DEFINE_string("policy", None, "train.ppo run directory (one seed, per-user MDP).")
    flags.DEFINE_string("out", None, "Output folder: critic_check.json and the refit policy.")
    flags.DEFINE_integer("fit_states", 40000, "Decision states whose MC Q(s,0), Q(s,1) the "
                         "critic is regressed on.")
    flags.DEFINE_integer("eval_states", 6000, "Decision states for the before/after comparison.")
    flags.DEFINE_integer("sampling_replicates", 0, "Also compare with the MC ΔQ of the sampling "
                         "policy (the one PPO trained the critic on), R replicates; 0 = skip.")
    flags.DEFINE_integer("steps", 4000, "Minibatch steps of the critic regression.")
    flags.DEFINE_integer("seed", 0, "Seed of the state samples, MC keys and the regression.")
    flags.DEFINE_bool("measure_only", False, "Only measure the critic (no refit, no policy).")
    flags.DEFINE_string("split", "validation", "Part of the trace set the critic is judged on "
                        "and early stopping chooses on (validation, the default; test; train; "
                        "all). The regression targets come from the policy's training "
                        "problems.")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.policy, "--policy", "a train.ppo run directory")
    config_utils.require_flag(F.out, "--out", "a folder for critic_check.json and the policy")
    for name in ("fit_states", "eval_states", "steps"):
        if getattr(F, name) < 2:
            raise BadInput(f"--{name} must be >= 2, got {getattr(F, name)}")
    if F.sampling_replicates < 0 or F.sampling_replicates == 1:
        raise BadInput(f"--sampling_replicates must be 0 or >= 2, got {F.sampling_replicates}")
    if F.seed < 0:
        raise BadInput(f"--seed must be >= 0, got {F.seed}")
    from train import critic as critic_refit  # lazy: pulls in orbax and chex (absl flags)

    critic_refit.check_and_refit(F.policy, F.out, fit_states=F.fit_states,
                                 eval_states=F.eval_states,
                                 sampling_replicates=F.sampling_replicates, seed=F.seed,
                                 steps=F.steps, measure_only=F.measure_only, split=F.split)
    print(f"wrote {F.out}/{critic_refit.REPORT_FILE} (judged on the {F.split} split)"
          + ("" if F.measure_only else f" and the refit policy {F.out}"))


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
