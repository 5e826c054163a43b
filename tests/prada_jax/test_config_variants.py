"""prada_jax.config_utils.parse_variants and apply_variants: the one variant parser and applier
of the three config files."""
import pytest

from prada_jax import config_utils
from prada_jax.configs import distill, dual, ppo


def test_split_strip_and_order():
    assert config_utils.parse_variants(" smoke, ,gsm8k ", ("gsm8k", "smoke"), "f.py") == [
        "smoke", "gsm8k"]
    assert config_utils.parse_variants(None, ("a",), "f.py") == []
    assert config_utils.parse_variants("", ("a",), "f.py") == []


@pytest.mark.parametrize("module,path", [(ppo, "prada_jax/configs/ppo.py"),
                                         (dual, "prada_jax/configs/dual.py"),
                                         (distill, "prada_jax/configs/distill.py")],
                         ids=["ppo", "dual", "distill"])
def test_every_config_file_rejects_an_unknown_variant_the_same_way(module, path):
    with pytest.raises(ValueError, match=rf"^{path}: unknown variant 'smok'; choose from \("):
        module.get_config("smoke,smok")
    # a known variant after a blank still applies (``smoke`` shrinks every file's sizes)
    assert module.get_config(" ,smoke").to_dict() == module.get_config("smoke").to_dict()
    assert module.get_config("smoke").to_dict() != module.get_config("").to_dict()


def test_apply_variants_sets_dotted_fields_left_to_right():
    import ml_collections

    c = ml_collections.ConfigDict({"lr": 1.0, "env": {"users": 8, "name": "edge"}})
    table = {"small": {"env.users": 4, "lr": 0.5}, "toy": {"env.name": "toy", "lr": 0.1},
             "noop": {}}
    out = config_utils.apply_variants(c, "small,noop,toy", table, "f.py")
    assert out is c
    assert c.to_dict() == {"lr": 0.1, "env": {"users": 4, "name": "toy"}}   # toy's lr wins
    with pytest.raises(ValueError, match=r"^f\.py: unknown variant 'big'"):
        config_utils.apply_variants(c, "big", table, "f.py")


def test_ppo_smoke_variant_field_by_field():
    # written out independently of the variant table: what ``smoke`` changes from the defaults
    base, smoke = ppo.get_config().to_dict(), ppo.get_config("smoke").to_dict()
    changed = {(s, k): v for s in smoke if isinstance(smoke[s], dict)
               for k, v in smoke[s].items() if base[s][k] != v}
    assert changed == {("env", "problems"): 300, ("env", "num_users"): 4,
                       ("net", "hidden"): (32, 32), ("ppo", "num_envs"): 4,
                       ("ppo", "rollout_len"): 16, ("ppo", "num_epochs"): 2,
                       ("ppo", "minibatch_size"): 64, ("ppo", "updates_per_chunk"): 2,
                       ("ppo", "total_env_steps"): 256, ("ppo", "decision_capacity"): 0.375,
                       ("log", "checkpoint_every"): 2, ("log", "progress"): False}
