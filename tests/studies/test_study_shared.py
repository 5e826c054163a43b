"""studies/_shared.py, the machinery the study commands share: seed ranges, cache folders, part
prerequisites, the parts loop (what it writes, what a reused part leaves alone) and the report's
number cells, each against a hand-computed expectation."""
import json
import math

import pytest
from absl import flags

from prada_jax.errors import BadInput
from studies import _shared


def test_seed_range_accepts_ranges_and_refuses_the_rest():
    assert _shared.seed_range("3-6", "seeds") == (3, 4, 5, 6)
    assert _shared.seed_range("7", "seeds") == (7,)
    for text, says in (("a-b", "expected 'a-b'"), ("5-2", "0 <= a <= b"),
                       ("0-99999999", "at most"), ("-1", "expected")):
        with pytest.raises(BadInput, match=rf"^--pilot_seeds: .*{says}"):
            _shared.seed_range(text, "pilot_seeds")
    n = _shared.MAX_STUDY_SEEDS
    assert len(_shared.seed_range(f"0-{n - 1}", "seeds")) == n


def test_check_cache_names_the_missing_folder_and_the_builder(tmp_path):
    for sub in ("pool", "logits"):
        (tmp_path / sub).mkdir()
    with pytest.raises(BadInput, match=r"^--teacher_cache: .*teacher not found \(build one "
                                       r"with python -m x\.y\)$"):
        _shared.check_cache(tmp_path, "teacher_cache", hint="x.y")
    (tmp_path / "teacher").mkdir()
    _shared.check_cache(tmp_path)   # complete: no error


def test_check_prereqs_counts_earlier_parts_and_stored_ones(tmp_path):
    prereq = {"b": ("a",), "c": ("a", "b")}
    _shared.check_prereqs(("a", "b", "c"), prereq, set(), tmp_path)
    _shared.check_prereqs(("c",), prereq, {"a": 1, "b": 2}, tmp_path)   # a dict's keys
    with pytest.raises(BadInput, match=r"^--parts: c needs the b part's results"):
        _shared.check_prereqs(("c", "b"), prereq, {"a"}, tmp_path)   # b runs only after c


def test_run_parts_merges_stamps_logs_writes_and_skips_a_reused_part(tmp_path):
    log = _shared.Log()
    done = []

    def one(part):
        done.append(part)
        log.log.append(f"ran {part}")
        return None if part == "reused" else {"value": len(done)}

    res = {"log": ["old"], "reused": {"kept": True}}
    path, report = tmp_path / "study.json", tmp_path / "report.md"
    out = _shared.run_parts(res, ("x", "reused", "y"), one, log, path, report,
                            lambda r: f"{sorted(k for k in r if k != 'log')}\n")
    assert out is res and done == ["x", "reused", "y"]
    assert res["reused"] == {"kept": True}   # None: the part's results stay as they were
    assert res["x"]["value"] == 1 and res["y"]["value"] == 3
    for part in ("x", "y"):
        assert res[part]["part_wall_s"] >= 0 and len(res[part]["started_utc"]) == 19
    # the reused part's log line joins with the next part that writes
    assert res["log"] == ["old", "ran x", "ran reused", "ran y"] and log.log == []
    assert json.loads(path.read_text()) == res
    assert report.read_text() == "['reused', 'x', 'y']\n"


def test_number_cells():
    assert _shared.fmt(0.12345) == "0.123" and _shared.fmt(2, 1) == "2.0"
    assert _shared.fmt(None) == _shared.fmt(math.nan) == _shared.fmt(math.inf) == "n/a"
    assert _shared.mean_cell([0.1, None, 0.4]) == "0.250"
    assert _shared.mean_cell([None]) == _shared.mean_cell([]) == "n/a"


def test_parse_requires_out_and_at_least_one_refuses_zero():
    def define(fv):
        flags.DEFINE_string("out", "", "", flag_values=fv)
        flags.DEFINE_integer("updates", 1, "", flag_values=fv)

    with pytest.raises(BadInput, match=r"^--out: required$"):
        _shared.parse(define, [], "prog", None)
    a = _shared.parse(define, ["--out=o", "--updates=0"], "prog", None)
    with pytest.raises(BadInput, match=r"^--updates: must be >= 1, got 0$"):
        _shared.at_least_one(a, "updates")
