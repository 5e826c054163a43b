"""prada_jax.config_utils.parse_variants: the one variant parser of the three config files."""
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
