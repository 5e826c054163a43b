"""The clock's hardware pair travels from the config to the env, the run's records and the
evaluation env (docs/latency.md); the configs default to ``a100_orin_int4`` (issue 32), ``paper``
leaves the records as before."""
import pytest

from envs import stage1, stage2
from evals import suite
from prada_jax import latency
from prada_jax.configs import dual as dual_cfg
from prada_jax.configs import ppo as ppo_cfg
from prada_jax.errors import BadInput
from prada_jax.rl import policy
from prada_jax.dual import trainer as dual_trainer


def test_defaults_and_paper_records_nothing_new():
    """The configs default to the A100 + Orin INT4 pair (issue 32); the library's default and
    a run stored without a pair are the paper clock, which leaves the records as before."""
    assert latency.DEFAULT_PAIR == "paper" and latency.CONFIG_PAIR == "a100_orin_int4"
    assert ppo_cfg.get_config("smoke").env.hardware == latency.CONFIG_PAIR
    assert dual_cfg.get_config("smoke").env.hardware == latency.CONFIG_PAIR
    assert suite.env_kwargs_from(None, {})["hardware"] == latency.CONFIG_PAIR
    c = ppo_cfg.get_config("smoke")
    c.env.hardware = "paper"
    setup = stage1.build_setup(c)
    assert not setup.env_params.latency.roofline
    assert "hardware" not in policy.policy_meta(c, setup)
    assert suite.env_kwargs_from(c, {})["hardware"] == "paper"
    del c.env["hardware"]   # a run stored before pairs existed
    assert suite.env_kwargs_from(c, {})["hardware"] == "paper"


def test_a_roofline_pair_reaches_env_meta_and_evaluation(capsys):
    c = ppo_cfg.get_config("smoke")
    c.env.hardware = "a100_phone_int4"
    setup = stage1.build_setup(c)
    lp = setup.env_params.latency
    assert lp.roofline
    assert float(lp.edge_hw.mem_bw) == pytest.approx(76.8e9)
    assert float(lp.server_hw.peak_flops) == pytest.approx(312e12)
    assert policy.policy_meta(c, setup)["hardware"] == "a100_phone_int4"
    kw = suite.env_kwargs_from(c, {})
    assert kw["hardware"] == "a100_phone_int4"
    assert capsys.readouterr().err == ""
    kw = suite.env_kwargs_from(c, {"hardware": "a100_orin_bf16"})
    assert kw["hardware"] == "a100_orin_bf16"
    assert "trained under hardware a100_phone_int4" in capsys.readouterr().err


def test_dual_config_builds_the_pair_env():
    from prada_jax.traces import synthetic

    c = dual_cfg.get_config("smoke")
    c.env.hardware = "a100_orin_int4"
    dual_trainer.validate_config(c)
    stage2.validate_env_config(c)
    traces, _ = synthetic.generate("gsm8k", seed=0, problems=20)
    assert stage2.build_env_params(c, traces).latency.roofline
    c.env.hardware = "tpu9"
    with pytest.raises(BadInput, match=r"config\.env\.hardware=tpu9"):
        dual_trainer.validate_config(c)


def test_multipliers_learned_under_another_pair_are_a_scenario_mismatch():
    base = {"num_users": 16, "num_servers": 4, "bandwidth_hz": 20e6, "arrival_rate_hz": 4.0,
            "beta": 0.2, "tau_s": 0.05}
    env = dict(base, hardware="paper")
    # a multipliers.json from before pairs existed: paper, no mismatch
    assert suite.scenario_mismatch({"scenario": dict(base)}, env, {}, None) is None
    line = suite.scenario_mismatch({"scenario": dict(base)}, dict(base, hardware="a100_orin_int4"),
                                   {}, None)
    assert line is not None and "hardware paper" in line and "hardware a100_orin_int4" in line
    same = {"scenario": dict(base, hardware="a100_orin_int4")}
    assert suite.scenario_mismatch(same, dict(base, hardware="a100_orin_int4"), {}, None) is None
