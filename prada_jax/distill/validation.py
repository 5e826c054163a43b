"""The checks of a distillation config (prada_jax/configs/distill.py); each error names its field.

:func:`validate_config` is called once, by :func:`prada_jax.distill.trainer.build_setup`, before
anything is loaded or written.
"""
from __future__ import annotations

import numpy as np

from prada_jax import config_utils as cu
from prada_jax import parallel
from prada_jax.distill.evaluation import gate_on
from prada_jax.distill.learner import RKL_ESTIMATORS
from prada_jax.distill.sampler import SCHEDULES, check_kappa

# Adaptive turn weightings (prada_jax/distill/ratio/), re-estimated from the current student
# every ``sampler.refresh_every`` updates: "auto" = κ^t with κ = exp(−c̄), "exact-ratio" =
# clipped per-prefix likelihood ratio br_{i,t}.
ADAPTIVE = ("auto", "exact-ratio")

# "offline": teacher tokens; "onpolicy": ReOPD (student samples turn t after the replayed
# teacher prefix); "opd": online OPD (student episodes with the tool, prada_jax/distill/opd.py)
MODES = ("offline", "onpolicy", "opd")


def validate_config(config) -> None:
    """Checks every field once; errors name the field (``config.sampler.kappa ...``)."""
    cu.check_choice(config, "mode", MODES)
    cu.check_choice(config, "loss.kind", ("fkl", "jsd", "sft", "rkl"))
    cu.check_choice(config, "loss.rkl_estimator", RKL_ESTIMATORS)
    if config.mode == "offline":
        cu.check(config.loss.kind != "rkl", "loss.kind",
                 "'rkl' needs config.mode=onpolicy or opd (it scores student samples)")
    else:
        cu.check(config.loss.kind == "rkl", "loss.kind",
                 f"config.mode={config.mode} uses 'rkl'")
    if "opd" in config:
        cu.check_int(config, "opd.episodes", "opd.context_len", minimum=1)
        lat = config.opd.tool_latency_s
        cu.check(isinstance(lat, (int, float)) and not isinstance(lat, bool)
                 and np.isfinite(lat) and lat >= 0, "opd.tool_latency_s",
                 f"must be a finite number of seconds >= 0, got {lat!r}")
    elif config.mode == "opd":
        raise cu.ConfigError("config.opd is missing (config.mode=opd needs its fields)")
    try:
        check_kappa(config.sampler.kappa)
    except ValueError:
        raise cu.ConfigError(f"config.sampler.kappa must lie in (0, 1], got "
                             f"{config.sampler.kappa!r}") from None
    cu.check_choice(config, "sampler.schedule", SCHEDULES + ADAPTIVE)
    cu.check_int(config, "sampler.refresh_every", minimum=0)
    cu.check_range(config, "sampler.kappa_min", 0.0, 1.0, low_open=True)
    cu.check(float(config.sampler.auto_gap_max) > 0.0,
             "sampler.auto_gap_max", "must be > 0 (nats per turn; inf = never hold κ)")
    cu.check_range(config, "sampler.ratio_min", 0.0, 1.0, low_open=True)
    cu.check(config.sampler.ratio_max >= 1.0, "sampler.ratio_max",
             f"must be >= 1 (the first turn's ratio), got {config.sampler.ratio_max!r}")
    cu.check_positive(config, "loss.temperature", "optim.lr", "optim.clip_norm",
                      "onpolicy.temperature", "onpolicy.top_p")
    cu.check_range(config, "loss.beta", 0.0, 1.0, low_open=True, high_open=True)
    cu.check_nonnegative(config, "loss.rkl_coef", "loss.fkl_coef", "optim.weight_decay")
    cu.check_int(config, "train.steps", "train.batch_size", "optim.grad_accum",
                 "log.every", "log.ckpt_every", "log.keep", "onpolicy.max_new_tokens",
                 "student.hidden_size", "student.num_layers", "student.num_heads",
                 "student.num_kv_heads", "student.intermediate_size", minimum=1)
    cu.check_int(config, "optim.warmup_steps", "eval.n_problems", minimum=0)
    cu.check_int(config, "train.num_seeds", minimum=1)
    cu.check_int(config, "train.prompt_bucket", minimum=0)
    cu.check_int(config, "eval.every", minimum=0)
    cu.check(isinstance(config.eval.before, bool), "eval.before",
             f"must be true or false, got {config.eval.before!r}")
    cu.check(config.student.hidden_size % config.student.num_heads == 0, "student.hidden_size",
             "must be divisible by config.student.num_heads")
    cu.check(config.student.num_heads % config.student.num_kv_heads == 0,
             "student.num_heads", "must be divisible by config.student.num_kv_heads")
    cu.check_choice(config, "train.compute_dtype", ("float32", "bfloat16"))
    cu.check(config.onpolicy.top_p <= 1.0, "onpolicy.top_p", "must be <= 1")
    if "gate" in config:
        cu.check_int(config, "gate.every", minimum=0)
        cu.check_range(config, "gate.success_min", 0.0, 1.0)
        cu.check_nonnegative(config, "gate.gap_max")
    if gate_on(config):
        cu.check(int(config.train.num_seeds) == 1, "gate.every",
                 "a gate needs config.train.num_seeds = 1 (one student per gated run)")
        cu.check(int(config.eval.n_problems) > 0, "gate.every",
                 "a gate needs task success: config.eval.n_problems > 0")
    if "mesh" in config:
        try:
            parallel.validate_mesh_config(config.mesh)
        except ValueError as e:
            raise cu.ConfigError(str(e)) from e
