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
