"""One PRADA pipeline: the configs of a run's screening policy (PPO) and multipliers (stage-2
learner), built in one place, and the calls that train them.

``train.main``'s parts (``train.parts``: the demo) and the stage-2 studies both build their
PPO and dual configs here, so they cannot drift apart: a config is a
``prada_jax/configs/{ppo,dual}.py`` variant plus dotted fields set through
``prada_jax.config_utils.set_field`` (:func:`set_fields`), with the trace generator's seed 0
(the one generated set whose train / validation / test splits every table uses).
"""
from __future__ import annotations

from pathlib import Path

from envs import stage1, stage2
from prada_jax import config_utils
from train import critic
from prada_jax.rl import trainer as ppo_trainer
from prada_jax.dual import trainer as dual_trainer
from prada_jax.configs import dual as dual_cfg
from prada_jax.configs import ppo as ppo_cfg


def _variant(variant: str, preset: str) -> str:
    """``"smoke,gsm8k"``: the config file's variant followed by the benchmark preset."""
    return ",".join(v for v in (variant, preset) if v)


def _cast(current, value):
    """``value`` as the type of the field's ``current`` value (a bool from "1", "1.0", "true"
    or a bool; numbers and strings by the type's constructor)."""
    if isinstance(current, bool):
        return value if isinstance(value, bool) else str(value).strip().lower() in (
            "1", "1.0", "true")
    return type(current)(value)


def set_fields(config, fields: dict | None, cast: bool = True) -> None:
    """Sets each dotted field of ``fields`` (``{"env.num_users": 16}``) through
    ``config_utils.set_field``, converted to the type of the field's current value when
    ``cast`` (a float field stays a float when given an int); a missing field raises
    ``ConfigError`` naming it."""
    for field, value in (fields or {}).items():
        if cast:
            value = _cast(config_utils.get_field(config, field), value)
        config_utils.set_field(config, field, value)


def ppo_config(preset: str, variant: str = "", overrides: dict | None = None, *,
               problems: int | None = None, progress: bool = False):
    """The screening policy's config: ``prada_jax/configs/ppo.py:<variant>,<preset>`` with
    ``overrides`` (dotted fields, set as given), generator seed 0, ``problems`` problems in
    the generated set (None: the variant's count) and the progress bar on or off."""
    c = ppo_cfg.get_config(_variant(variant, preset))
    set_fields(c, overrides, cast=False)
    c.env.preset = preset
    c.env.trace_seed = 0
    if problems:
        c.env.problems = int(problems)
    c.log.progress = bool(progress)
    return c


def dual_config(preset: str, variant: str = "", fields: dict | None = None):
    """The multiplier learner's config: ``prada_jax/configs/dual.py:<variant>,<preset>`` with
    ``fields`` (dotted, each converted to the field's type; :func:`set_fields`)."""
    c = dual_cfg.get_config(_variant(variant, preset))
    set_fields(c, fields)
    return c


def train_policy(config, workdir: str | Path) -> dict:
    """Trains (or resumes) the screening policy of ``config`` in ``workdir``
    (``prada_jax.rl.trainer``); returns its result dict."""
    return ppo_trainer.train_and_evaluate(config, Path(workdir), stage1.build_setup(config))


def learn_multipliers(config, workdir: str | Path):
    """Runs (or resumes) the stage-2 learner of ``config`` in ``workdir``; returns
    ``(result, dcfg, env_params)``: the trainer's result dict, the learner's validated
    ``DualConfig`` and the env params it trained on (their scheduler and value accounting
    are what the PRADA rows of an evaluation run)."""
    dcfg = dual_trainer.validate_config(config)
    setup = stage2.build_setup(config)
    env_params = setup.env_params
    result = dual_trainer.train_and_evaluate(config, Path(workdir), setup)
    return result, dcfg, env_params


def refit_critic(policy_dir: str | Path, out_dir: str | Path, settings: dict, split: str,
                 log=print) -> dict:
    """Refits the critic of the PPO run in ``policy_dir`` for its final actor into ``out_dir``
    (``train.critic``; ``settings``: ``fit_states``, ``eval_states``, ``steps``,
    ``seed``), judged on the ``split`` split of its trace set; returns the report's greedy-rule
    summary ``{"before" | "after": {"pearson", "nom_critic_positive", "nom_mc_mean",
    "rule_gain"}}``."""
    rep = critic.check_and_refit(
        str(policy_dir), str(out_dir), fit_states=int(settings["fit_states"]),
        eval_states=int(settings["eval_states"]), steps=int(settings["steps"]),
        seed=int(settings["seed"]), log=log, split=split)
    return {k: {m: rep[k]["greedy"][m] for m in ("pearson", "nom_critic_positive",
                                                 "nom_mc_mean", "rule_gain")}
            for k in ("before", "after")}
