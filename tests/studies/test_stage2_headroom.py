"""studies.stage2_pooled.headroom (issue 33 item 5): candidate parsing, the pooled MDE floor against
scipy's t quantiles, and the verdict's one-clock check (evals.policy_pair)."""
import math

import pytest
from scipy import stats as sps

from evals import policy_pair as pairs
from studies.stage2_pooled import headroom
from prada_jax.errors import BadInput


def test_parse_candidates():
    c = headroom.parse_candidates("nominal; nominal:num_servers=4,arrival_rate_hz=2.5;"
                                  "outage_burst:num_servers=4")
    assert c[0] == ("nominal", "nominal", {})
    assert c[1] == ("nominal:num_servers=4,arrival_rate_hz=2.5", "nominal",
                    {"num_servers": 4, "arrival_rate_hz": 2.5})
    assert isinstance(c[1][2]["num_servers"], int)
    assert c[2][1] == "outage_burst"


@pytest.mark.parametrize("text,needle", [
    ("nope", "unknown scenario"), ("nominal:beta=0.1", "KEY=VALUE"),
    ("nominal:num_servers=x", "not a number"), ("nominal:arrival_rate_hz=-1", "> 0"),
    ("nominal;nominal", "twice"), (";", "no candidate"),
    ("nominal:num_servers=1e12", "integer <= 1048576"),      # int32 overflow (issue 43)
    ("nominal:num_users=2.5", "integer"), ("nominal:arrival_rate_hz=1e39", "float32")])
def test_parse_candidates_refuses_bad_specs(text, needle):
    with pytest.raises(BadInput, match=f"--candidates.*{needle}|{needle}"):
        headroom.parse_candidates(text)


def test_pooled_mde_floor_is_the_t_mde_over_policy_means():
    sd, P, L, S = 0.03, 3, 2, 8
    sd_mean = sd / math.sqrt(L * S)
    want = (sps.t.ppf(0.975, P - 1) + sps.t.ppf(0.8, P - 1)) * sd_mean / math.sqrt(P)
    assert headroom.pooled_mde_floor(sd, P, L, S) == pytest.approx(want, rel=1e-6)
    # more policies, smaller floor
    assert headroom.pooled_mde_floor(sd, 5, L, S) < headroom.pooled_mde_floor(sd, P, L, S)


def test_policy_pair_check():
    assert pairs.policy_pair({}) == "paper"              # stored before pairs existed
    assert pairs.policy_pair({"hardware": "a100_orin_int4"}) == "a100_orin_int4"
    pairs.check_policy_pair({"hardware": "a100_orin_int4"}, "a100_orin_int4", "p")
    with pytest.raises(BadInput, match=r"--hardware=paper: p was trained under hardware "
                                       r"'a100_orin_int4'"):
        pairs.check_policy_pair({"hardware": "a100_orin_int4"}, "paper", "p")
    with pytest.raises(BadInput, match="'paper'"):
        pairs.check_policy_pair({}, "a100_orin_int4", "p")


def test_the_command_runs_end_to_end(tmp_path, monkeypatch, run_command):
    """``python -m studies.stage2_pooled.headroom`` on a valid policy writes its JSON (the split of
    evals/stage2 left the command calling a name the package no longer had: every valid run
    was a traceback). A stand-in policy (``evals.testing.oracle_apply`` with the smoke
    config, paper clock) and a tiny size keep it to two short rollouts."""
    import json

    from studies import stage2_verdict as s2
    from evals import suite
    from evals.testing import oracle_apply
    from prada_jax.configs import ppo as ppo_cfg
    from prada_jax.rl.policy import LoadedPolicy

    cfg = ppo_cfg.get_config("smoke")
    cfg.env.hardware = "paper"
    pol = tmp_path / "pol"
    pol.mkdir()
    fake = LoadedPolicy(oracle_apply, None, {"seeds": []}, cfg, str(pol))
    monkeypatch.setattr(suite, "load_policy", lambda *a, **k: fake)
    monkeypatch.setitem(s2.SIZES, "quick", dict(s2.SIZES["quick"], slots=40, warmup=5,
                                                scenario_length=40, num_users=4))
    out = tmp_path / "h.json"
    code, _, err = run_command("studies.stage2_pooled.headroom", f"--policy={pol}", "--size=quick",
                               "--seeds=2", f"--out={out}")
    assert code == 0, err
    res = json.loads(out.read_text())
    rep = res["candidates"]["nominal"]
    assert len(rep["headroom_per_seed"]) == 2
    assert set(rep["rows"]) == {s2.ROW_ZERO, s2.ROW_NOLIM}
    # the policy by its path relative to the results and by content, never an absolute path
    assert res["meta"]["policy"] == "pol"
    assert res["meta"]["policy_sha256"] == suite.params_sha256(None)


def test_policy_record_names_a_policy_by_content_and_relative_path(tmp_path, monkeypatch):
    import jax.numpy as jnp

    from evals import suite
    from prada_jax.rl.policy import LoadedPolicy

    params = {"actor": {"w": jnp.arange(6.0).reshape(2, 3)}, "critic": {"b": jnp.ones(2)}}
    stored = {"p": params}
    monkeypatch.setattr(suite, "load_policy", lambda d, *a, **k: LoadedPolicy(
        None, stored["p"], {}, None, str(d)))
    inside = suite.policy_record(tmp_path / "study" / "ppo", tmp_path / "study")
    outside = suite.policy_record(tmp_path / "elsewhere" / "pol", tmp_path / "study")
    assert inside["policy"] == "ppo" and outside["policy"] is None
    assert inside["policy_sha256"] == outside["policy_sha256"]          # same content
    stored["p"] = {"actor": {"w": jnp.arange(6.0).reshape(3, 2)}, "critic": {"b": jnp.ones(2)}}
    assert suite.policy_record(tmp_path / "x", tmp_path)["policy_sha256"] != \
        inside["policy_sha256"]                                          # another shape


def test_committed_stage2_results_hold_no_machine_paths():
    """Committed stage-2 JSON names policies and cells relative to the study (or by content
    hash), never by a temporary folder of the machine that ran them (issue 43)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "docs" / "results"
    bad = []
    for f in sorted(root.rglob("*.json")):
        if not f.relative_to(root).parts[0].startswith("stage2"):
            continue
        bad += [f"{f.relative_to(root)}: {m}" for m in
                re.findall(r'"((?:/tmp/|/var/folders/|/home/|/root/)[^"]*)"', f.read_text())]
    assert not bad, "\n".join(bad[:20])
