"""config_utils.REMOVED_FIELDS and ADDED_FIELDS: a stored config.json holding a removed field,
or lacking an added one, still resumes (an unknown extra field is still refused), and reads
back with the added fields at the table's values."""
import json

import pytest

from prada_jax import config_utils, run_state

NEW = {"seed": 0, "train": {"lr": 0.1, "steps": 10}, "log": {"every": 5}}


def _stored(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return tmp_path


def test_a_removed_field_resumes(tmp_path, monkeypatch):
    monkeypatch.setitem(config_utils.REMOVED_FIELDS, "train.old_knob", "always on; test")
    monkeypatch.setitem(config_utils.REMOVED_FIELDS, "gone", "a removed section; test")
    wd = _stored(tmp_path, {**NEW, "train": {**NEW["train"], "old_knob": True},
                            "gone": {"a": 1, "b": {"c": 2}}})
    check = run_state.check_resume(NEW, wd, observational=("log.*",))
    assert not check.fresh and check.changed == {}
    # observational changes are still reported next to the dropped field
    check = run_state.check_resume({**NEW, "log": {"every": 7}}, wd, observational=("log.*",))
    assert check.changed == {"log.every": (5, 7)}
    # and a computational change is still refused
    with pytest.raises(run_state.ConfigMismatch, match=r"train\.lr: 0\.1 → 0\.2"):
        run_state.check_resume({**NEW, "train": {"lr": 0.2, "steps": 10}}, wd, ("log.*",))


def test_an_unknown_extra_field_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(config_utils.REMOVED_FIELDS, "train.old_knob", "test")
    wd = _stored(tmp_path, {**NEW, "train": {**NEW["train"], "old_knobs": 1}})  # not registered
    with pytest.raises(run_state.ConfigMismatch, match=r"train\.old_knobs: 1 → <absent>"):
        run_state.check_resume(NEW, wd, observational=("log.*",))
    # without the registration the removed field itself is refused too
    monkeypatch.delitem(config_utils.REMOVED_FIELDS, "train.old_knob")
    _stored(tmp_path, {**NEW, "train": {**NEW["train"], "old_knob": True}})
    with pytest.raises(run_state.ConfigMismatch, match=r"train\.old_knob: true → <absent>"):
        run_state.check_resume(NEW, wd, observational=("log.*",))


def test_is_removed_matches_fields_and_sections(monkeypatch):
    monkeypatch.setitem(config_utils.REMOVED_FIELDS, "dual.x", "test")
    assert config_utils.is_removed("dual.x") and config_utils.is_removed("dual.x.y")
    assert not config_utils.is_removed("dual.xy") and not config_utils.is_removed("dual")


def test_an_added_field_reads_as_its_old_value(tmp_path, monkeypatch):
    """A stored config.json written before a field existed is read with the value that field
    has for the old behaviour: the run resumes if the new config keeps that value and is
    refused, naming the field, if it changes it (here env.split: old runs used every problem)."""
    assert config_utils.ADDED_FIELDS["env.split"].before == "all"
    monkeypatch.setitem(config_utils.ADDED_FIELDS, "train.new_knob",
                        config_utils.AddedField(3, ("dual",), "test"))
    wd = _stored(tmp_path, NEW)
    check = run_state.check_resume({**NEW, "train": {**NEW["train"], "new_knob": 3}}, wd,
                                   observational=("log.*",))
    assert not check.fresh and check.changed == {}
    with pytest.raises(run_state.ConfigMismatch, match=r"train\.new_knob: 3 → 4"):
        run_state.check_resume({**NEW, "train": {**NEW["train"], "new_knob": 4}}, wd, ("log.*",))
    # an added field the new config does not have is not invented
    assert run_state.check_resume(NEW, wd, ("log.*",)).changed == {}
    # without the registration the same stored run is refused (<absent> → 3)
    monkeypatch.delitem(config_utils.ADDED_FIELDS, "train.new_knob")
    with pytest.raises(run_state.ConfigMismatch, match=r"train\.new_knob: <absent> → 3"):
        run_state.check_resume({**NEW, "train": {**NEW["train"], "new_knob": 3}}, wd, ("log.*",))


def _today(kind: str) -> dict:
    from prada_jax.configs import distill, dual, ppo
    return config_utils.config_to_dict({"ppo": ppo, "dual": dual, "distill": distill}[kind]
                                       .get_config("smoke"))


def _without(tree: dict, fields) -> dict:
    out = json.loads(json.dumps(tree))
    for f in fields:
        *parents, leaf = f.split(".")
        node = out
        for p in parents:
            node = node[p]
        del node[leaf]
    return out


# Added fields whose default in today's config differs from the behaviour of a run stored
# before them (every other added field's default IS the old behaviour).
CHANGED_DEFAULTS = {"env.split", "env.hardware", "env.server_model", "eval.env_chunks",
                    "sampler.auto_gap_max"}


@pytest.mark.parametrize("kind", ["ppo", "dual", "distill"])
def test_an_old_config_json_reads_back_with_the_tables_values(tmp_path, kind):
    """A config.json written by today's config less every added field of its kind reads back
    (``read_config_json``) with each field at the table's value: today's config again, except
    the fields whose default has changed since, which read as their old value; fields of
    other kinds are not added, and a stored value is never overwritten."""
    today = _today(kind)
    assert config_utils.config_kind(today) == kind
    mine = [f for f, a in config_utils.ADDED_FIELDS.items() if kind in a.configs]
    assert mine   # every config kind has had fields added since its first runs
    old = _without(today, mine)
    (tmp_path / "config.json").write_text(json.dumps(old))
    back = config_utils.config_to_dict(config_utils.read_config_json(tmp_path))
    flat_back, flat_today = run_state.flatten(back), run_state.flatten(today)
    for f in mine:
        want = config_utils.ADDED_FIELDS[f].before
        assert flat_back[f] == want, f
        if f not in CHANGED_DEFAULTS:
            assert flat_today[f] == want, f"{f}: today's default is not the old behaviour"
    assert {f for f in mine if flat_today[f] != flat_back[f]} <= CHANGED_DEFAULTS
    assert set(flat_back) == set(flat_today)   # nothing of another kind was invented
    # a stored value is kept, and the caller's dict is not changed
    (tmp_path / "config.json").write_text(json.dumps(today))
    assert run_state.flatten(config_utils.config_to_dict(
        config_utils.read_config_json(tmp_path))) == flat_today
    assert config_utils.add_missing_fields(old) is not old and old == _without(today, mine)
