"""train.pipeline: the PPO and dual configs of a run, built once, equal the configs written out
field by field (the way train.main and studies.stage2_verdict each built them before)."""
import pytest

from train import pipeline
from prada_jax.configs import dual as dual_cfg
from prada_jax.configs import ppo as ppo_cfg
from prada_jax.config_utils import ConfigError


def test_ppo_config_matches_a_hand_built_one():
    got = pipeline.ppo_config("mmlu_stem", "smoke", {"ppo.total_env_steps": 512,
                                                     "env.hardware": "paper"},
                              problems=60, progress=True)
    ref = ppo_cfg.get_config("smoke")
    ref.env.preset = "mmlu_stem"
    ref.ppo.total_env_steps = 512
    ref.env.hardware = "paper"
    ref.env.trace_seed = 0
    ref.env.problems = 60
    ref.log.progress = True
    assert got.to_dict() == ref.to_dict()
    # no problem count: the variant's own
    assert pipeline.ppo_config("gsm8k", "smoke").env.problems == ppo_cfg.get_config(
        "smoke").env.problems


def test_dual_config_casts_each_field_to_its_type():
    c = pipeline.dual_config("gsm8k", "smoke", {"env.num_users": 16.0, "env.beta": 1,
                                                "dual.conditioned": "true",
                                                "policy_dir": "/x"})
    assert c.env.num_users == 16 and type(c.env.num_users) is int
    assert c.env.beta == 1.0 and type(c.env.beta) is float
    assert c.dual.conditioned is True and c.policy_dir == "/x"
    ref = dual_cfg.get_config("smoke,gsm8k")
    for k in ("num_servers", "bandwidth_hz", "scenario"):
        assert c.env[k] == ref.env[k]
    assert pipeline.dual_config("gsm8k", "", {"dual.conditioned": "0"}).dual.conditioned is False


def test_a_missing_field_is_named():
    with pytest.raises(ConfigError, match="config.env.no_such_field"):
        pipeline.dual_config("gsm8k", "", {"env.no_such_field": 1})
