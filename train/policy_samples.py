"""Trains independent screening-policy samples (issue 33):
``python -m train.policy_samples --out=DIR --seeds=0,1,2 [--quick]``.

Each sample ``k`` is what ``make demo`` (``train.main``'s ``ppo`` and ``critic`` parts)
builds, with its seeds set to ``k`` (sample 0 is ``make demo``'s policy): a ``train.ppo``
run on the gsm8k synthetic set (trace generator seed 0, the train split; ``config.seed = k``,
the demo's 16 × 64 × 150 env slots), then its critic
refit on Monte-Carlo action values of the final actor (``train.critic``, judged
and early-stopped on the validation split, ``seed = k``; the demo's 20 000 / 2 000 states,
2 000 steps). Output::

    DIR/seed_<k>/ppo/      the train.ppo run
    DIR/seed_<k>/critic/   the refit policy: what ``studies.stage2_pooled --policies`` and
                           ``studies.capacity`` take

Reruns reuse finished parts (``train.ppo``'s config-checked resume; a refit with its report
``critic_check.json`` present is kept). ``--quick``: the smoke sizes (seconds; for tests). All
data is SYNTHETIC. Exit codes (``prada_jax.cli``): 2 bad input, 3 non-finite training, 1 a bug.

The clock's hardware pair (issue 33 item 5): a sample trains under one pair (``--hardware``)
and stores it in its ``policy_meta.json``; a folder trained under another pair is refused
(``evals.policy_pair.check_policy_pair``, which the verdicts apply to the policies they
evaluate).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from absl import flags

from evals.policy_pair import check_policy_pair
from prada_jax import cli, config_utils, latency
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json
from train import critic, pipeline

#: Sizes of one policy sample: (ppo.py variant, ppo overrides, critic refit settings).
SIZES = {
    "demo": ("", {"ppo.total_env_steps": 16 * 64 * 150},
             {"fit_states": 20000, "eval_states": 2000, "steps": 2000}),
    "quick": ("smoke", {}, {"fit_states": 200, "eval_states": 100, "steps": 50}),
}


def parse_seeds(text: str, flag: str = "--seeds") -> list[int]:
    """``"0,1,2"`` → [0, 1, 2]; BadInput naming ``flag`` unless non-negative distinct ints."""
    try:
        seeds = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise BadInput(f"{flag}={text}: not a comma-separated list of integers") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise BadInput(f"{flag}={text}: give distinct integers >= 0")
    return seeds


def train_sample(out: Path, seed: int, size: str = "demo", log=print,
                 hardware: str | None = None) -> Path:
    """Trains (or reuses) policy sample ``seed`` under ``out/seed_<seed>``; returns the refit
    policy folder. ``hardware``: the pair of the clock it trains under (default: the PPO
    config's ``env.hardware``); a folder trained under another pair is refused (BadInput)."""
    variant, overrides, refit = SIZES[size]
    d = Path(out) / f"seed_{int(seed)}"
    c = pipeline.ppo_config("gsm8k", variant, overrides)
    c.seed = int(seed)
    if hardware is not None:
        latency.check_pair(hardware, "--hardware")   # BadInput naming the flag
        c.env.hardware = str(hardware)
    meta_path = d / "critic" / "policy_meta.json"
    if meta_path.is_file():
        check_policy_pair(read_json(meta_path), c.env.hardware, str(d), flag="--hardware")
    log(f"  policy sample {seed}: train.ppo ({c.ppo.total_env_steps} env slots) in {d / 'ppo'}")
    pipeline.train_policy(c, d / "ppo")
    crit = d / "critic"
    if (crit / "critic_check.json").is_file() and (crit / "policy_meta.json").is_file():
        log(f"  policy sample {seed}: reusing the refit critic in {crit}")
        return crit
    if crit.exists():
        shutil.rmtree(crit)
    log(f"  policy sample {seed}: refitting the critic in {crit}")
    critic.check_and_refit(str(d / "ppo"), str(crit), seed=int(seed),
                                 split="validation", log=lambda m: log(f"    {m.strip()}"),
                                 **refit)
    return crit


def _define_flags():
    flags.DEFINE_string("out", None, "Folder of the policy samples (seed_<k>/ppo, /critic).")
    flags.DEFINE_string("seeds", "0,1,2", "Comma-separated PPO / refit seeds, one sample each.")
    flags.DEFINE_bool("quick", False, "Smoke sizes (seconds; the policies mean nothing).")
    flags.DEFINE_string("hardware", None, "Hardware pair of the clock the samples train under "
                        "(prada_jax.latency.PAIRS name or a pair JSON file; default: the PPO "
                        "config's env.hardware). A verdict evaluates a pair only with policies "
                        "trained under it (check_policy_pair).")


def main(argv):
    F = flags.FLAGS
    config_utils.reject_extra_argv(argv)
    config_utils.require_flag(F.out, "--out", "a folder for the policy samples")
    seeds = parse_seeds(F.seeds)
    if F.hardware is not None:
        latency.check_pair(F.hardware, "--hardware")
    out = Path(F.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out={F.out} exists and is not a folder")
    dirs = [train_sample(out, k, "quick" if F.quick else "demo", hardware=F.hardware)
            for k in seeds]
    print("policy samples (SYNTHETIC gsm8k): " + ",".join(str(d) for d in dirs))


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
