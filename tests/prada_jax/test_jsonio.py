"""jsonio.write_json: the text json.dumps gives, written atomically; json_default's fallbacks."""
import json
import math
import os

import numpy as np
import pytest

from prada_jax import jsonio, stats


def test_text_is_json_dumps_with_the_given_formatting(tmp_path):
    obj = {"b": [1, 2.5], "a": {"z": None, "y": "é"}}
    p = jsonio.write_json(tmp_path / "new" / "sub" / "x.json", obj)   # parents created
    assert p.read_text() == json.dumps(obj, indent=2) + "\n"
    jsonio.write_json(p, obj, indent=1, sort_keys=True, newline=False)
    assert p.read_text() == json.dumps(obj, indent=1, sort_keys=True)
    jsonio.write_json(p, obj, indent=None, sort_keys=True, separators=(",", ":"),
                      newline=False)
    assert p.read_text() == '{"a":{"y":"\\u00e9","z":null},"b":[1,2.5]}'
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_failure_while_encoding_leaves_the_old_file(tmp_path):
    p = tmp_path / "r.json"
    jsonio.write_json(p, {"old": 1})
    before = p.read_bytes()

    def boom(o):
        raise RuntimeError("cannot encode")

    with pytest.raises(RuntimeError):
        jsonio.write_json(p, {"new": object()}, default=boom)
    assert p.read_bytes() == before
    assert not (tmp_path / "r.json.tmp").exists()


def test_a_failure_mid_write_leaves_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    jsonio.write_json(p, {"old": 1})
    before = p.read_bytes()
    real_replace = os.replace

    def crash(src, dst):      # the process dies between writing the tmp file and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        jsonio.write_json(p, {"new": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    assert p.read_bytes() == before
    assert json.loads(p.read_text()) == {"old": 1}
    assert not (tmp_path / "r.json.tmp").exists()


def test_nan_handling(tmp_path):
    p = tmp_path / "n.json"
    jsonio.write_json(p, {"x": float("nan"), "y": float("inf")})
    assert p.read_text() == '{\n  "x": NaN,\n  "y": Infinity\n}\n'   # json's own tokens
    back = json.loads(p.read_text())
    assert math.isnan(back["x"]) and back["y"] == math.inf
    with pytest.raises(ValueError):                  # strict: refuses, writes nothing new
        jsonio.write_json(p, {"x": float("nan")}, allow_nan=False)
    assert math.isnan(json.loads(p.read_text())["x"]) and not (tmp_path / "n.json.tmp").exists()
    ci = stats.mean_ci([0.5])                        # undefined bounds -> null in strict JSON
    jsonio.write_json(p, ci.to_json_dict(), allow_nan=False)
    assert json.loads(p.read_text())["ci_low"] is None


def test_json_default():
    class Odd:
        def __str__(self):
            return "odd!"

    ci = stats.mean_ci([1.0, 2.0, 4.0])
    got = json.loads(json.dumps({"a": np.arange(3, dtype=np.int32), "f": np.float32(0.5),
                                 "ci": ci, "o": Odd()}, default=jsonio.json_default))
    assert got == {"a": [0, 1, 2], "f": 0.5, "ci": ci.to_dict(), "o": "odd!"}


def test_config_json_is_config_to_json_text(tmp_path):
    import ml_collections

    from prada_jax import config_utils
    c = ml_collections.ConfigDict({"b": (1, 2), "a": {"x": 0.1, "f": float("inf")}})
    p = config_utils.write_config_json(c, tmp_path / "wd")
    assert p.read_text() == config_utils.config_to_json(c) + "\n"
    assert not list((tmp_path / "wd").glob("*.tmp"))
