"""``config.eval.before`` acts at update 0 only: a workdir whose stored config predates the
field (or holds the other value) resumes, while a field that changes the computation is still
refused."""
import json

import pytest

from prada_jax import config_utils, run_state
from prada_jax.distill.trainer import OBSERVATIONAL


def test_eval_before_may_differ_on_resume(tmp_path):
    from prada_jax.configs.distill import get_config
    stored = config_utils.config_to_dict(get_config("smoke"))
    del stored["eval"]["before"]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    c = get_config("smoke")
    assert run_state.check_resume(c, tmp_path, OBSERVATIONAL).fresh is False
    c.eval.before = False
    run_state.check_resume(c, tmp_path, OBSERVATIONAL)
    c.train.batch_size += 1
    with pytest.raises(run_state.ConfigMismatch, match="train.batch_size"):
        run_state.check_resume(c, tmp_path, OBSERVATIONAL)


def test_workdirs_from_before_the_opd_gate_carry_and_bucket_fields_resume(tmp_path):
    """A stored config without ``opd``, ``gate``, ``optim.carry_from`` and
    ``train.prompt_bucket`` resumes while those fields hold their inert defaults; switching one
    on (OPD mode, a gate, bucketing) changes the computation and is refused."""
    from prada_jax.distill.trainer import observational_fields
    from prada_jax.configs.distill import get_config
    stored = config_utils.config_to_dict(get_config("smoke"))
    for group, key in (("optim", "carry_from"), ("train", "prompt_bucket")):
        del stored[group][key]
    del stored["opd"], stored["gate"]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    c = get_config("smoke")
    run_state.check_resume(c, tmp_path, observational_fields(c))
    for field, value in (("gate.every", 5), ("train.prompt_bucket", 16)):
        c = get_config("smoke")
        config_utils.set_field(c, field, value)
        with pytest.raises(run_state.ConfigMismatch, match=field.replace(".", r"\.")):
            run_state.check_resume(c, tmp_path, observational_fields(c))
    c = get_config("smoke,opd")
    with pytest.raises(run_state.ConfigMismatch, match="mode"):
        run_state.check_resume(c, tmp_path, observational_fields(c))
