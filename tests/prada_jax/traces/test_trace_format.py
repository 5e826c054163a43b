"""Trace format: save/load round trip, and rejection of corrupted folders with a named field."""
import json
import pickle
import struct as pystruct

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from prada_jax.traces import format as fmt
from prada_jax.traces.format import TraceFormatError
from prada_jax.traces.synthetic import generate
from prada_jax.traces.testing import random_meta, random_traces


@pytest.fixture(scope="module")
def small():
    return generate("gsm8k", seed=3, problems=12)


def _write_raw(path, arrays, meta, fix_hash=True):
    """Writes a trace folder without any validation (to build corrupted sets)."""
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path / fmt.NODES_FILE))
    meta = dict(meta)
    if fix_hash:
        meta["content_hash"] = fmt.file_hash(path / fmt.NODES_FILE)
    (path / fmt.META_FILE).write_text(json.dumps(meta))
    return path


def test_round_trip_identical_arrays(tmp_path, small):
    traces, meta = small
    fmt.save(traces, tmp_path / "t", meta)
    loaded = fmt.load(tmp_path / "t")
    for k, v in traces.to_dict().items():
        got = getattr(loaded, k)
        assert got.dtype == v.dtype, k
        np.testing.assert_array_equal(got, v, err_msg=k)
    m = fmt.read_meta(tmp_path / "t")
    assert m["synthetic"] is True and m["format_version"] == fmt.FORMAT_VERSION
    assert m["counts"] == {"problems": 12, "nodes": traces.num_nodes}
    assert m["content_hash"] == fmt.file_hash(tmp_path / "t" / fmt.NODES_FILE)
    assert len(m["feature_names"]) == m["feature_dim"] == traces.feature_dim
    on_dev = jax.device_put(loaded)
    np.testing.assert_array_equal(np.asarray(on_dev.child), traces.child)


def test_round_trip_random_test_traces(tmp_path):
    traces = random_traces(seed=1, problems=5)
    fmt.save(traces, tmp_path, random_meta(traces))
    loaded = fmt.load(tmp_path)
    for k, v in traces.to_dict().items():
        np.testing.assert_array_equal(getattr(loaded, k), v, err_msg=k)


def _corrupt(name):
    """Returns a function (dir, arrays, meta) -> expected (file, field) after corrupting."""
    def drop_file(which):
        def f(d, a, m):
            _write_raw(d, a, m)
            (d / which).unlink()
            return which, "<file>"
        return f

    def arrays_edit(field, edit):
        def f(d, a, m):
            a = {k: v.copy() for k, v in a.items()}
            out = edit(a)
            _write_raw(d, out if out is not None else a, m)
            return fmt.NODES_FILE, field
        return f

    def meta_edit(field, edit, file=fmt.META_FILE):
        def f(d, a, m):
            m = json.loads(json.dumps(m))
            edit(m)
            _write_raw(d, a, m)
            return file, field
        return f

    def set_(key, idx, val):
        def e(a):
            a[key][idx] = val
        return e

    def nonterminal_node(a):
        return int(np.flatnonzero(a["terminal"][:, 0] == 0)[0])

    def cycle(a):
        n = int(np.flatnonzero((a["child"][:, 0] >= 0) & (a["depth"] == 1))[0])
        a["child"][n, 0] = a["root"][a["problem"][n]]      # back to its own root

    def no_end(a):
        n = nonterminal_node(a)
        a["child"][n] = -1
        a["fallback"][n] = -1

    def fallback_other_problem(a):
        n = int(np.flatnonzero(a["problem"] == 0)[0])
        a["child"][n, 1] = -1
        a["fallback"][n] = a["root"][1] + 1                  # a depth-1 node of problem 1

    def truncated(d, a, m):
        _write_raw(d, a, m)
        p = d / fmt.NODES_FILE
        p.write_bytes(p.read_bytes()[:-1000])
        m2 = json.loads((d / fmt.META_FILE).read_text())
        m2["content_hash"] = fmt.file_hash(p)            # so the parser, not the hash, must catch it
        (d / fmt.META_FILE).write_text(json.dumps(m2))
        return fmt.NODES_FILE, "<safetensors>"

    def truncated_hash(d, a, m):
        _write_raw(d, a, m)
        p = d / fmt.NODES_FILE
        p.write_bytes(p.read_bytes()[:-1000])
        return fmt.NODES_FILE, "content_hash"

    def hash_mismatch(d, a, m):
        _write_raw(d, a, m)
        p = d / fmt.NODES_FILE
        b = bytearray(p.read_bytes())
        b[-5] ^= 0xFF
        p.write_bytes(bytes(b))
        return fmt.NODES_FILE, "content_hash"

    def junk_header(header_bytes, declared=None):
        def f(d, a, m):
            _write_raw(d, a, m)
            p = d / fmt.NODES_FILE
            n = len(header_bytes) if declared is None else declared
            p.write_bytes(pystruct.pack("<Q", n) + header_bytes + b"\0" * 64)
            m2 = json.loads((d / fmt.META_FILE).read_text())
            m2["content_hash"] = fmt.file_hash(p)
            (d / fmt.META_FILE).write_text(json.dumps(m2))
            return fmt.NODES_FILE, "<safetensors>"
        return f

    def bad_json(d, a, m):
        _write_raw(d, a, m)
        (d / fmt.META_FILE).write_text("{not json")
        return fmt.META_FILE, "<json>"

    def prm_child_mismatch(a):
        n = int(np.flatnonzero(a["child"][:, 0] >= 0)[0])
        a["cand_prm"][n, 0] = np.float32((a["prm"][a["child"][n, 0]] + 0.5) % 1.0)

    table = {
        "missing_nodes_file": drop_file(fmt.NODES_FILE),
        "missing_meta_file": drop_file(fmt.META_FILE),
        "missing_field": arrays_edit("fallback", lambda a: {k: v for k, v in a.items()
                                                             if k != "fallback"}),
        "unknown_field": arrays_edit("extra", lambda a: {**a, "extra": np.zeros(3, np.float32)}),
        "wrong_dtype": arrays_edit("feat", lambda a: {**a, "feat": a["feat"].astype(np.float64)}),
        "wrong_shape": arrays_edit("feat", lambda a: {**a, "feat": a["feat"][:, :-1]}),
        "nan_prm": arrays_edit("prm", set_("prm", 3, np.nan)),
        "inf_feat": arrays_edit("feat", set_("feat", (2, 1), np.inf)),
        "prm_out_of_range": arrays_edit("cand_prm", set_("cand_prm", (4, 1), 1.5)),
        "child_out_of_range": arrays_edit("child", lambda a: set_("child", (nonterminal_node(a), 0),
                                                                  10 ** 6)(a)),
        "child_below_minus_one": arrays_edit("child", set_("child", (0, 0), -7)),
        "cycle": arrays_edit("child", cycle),
        "path_with_no_end": arrays_edit("fallback", no_end),
        "fallback_into_other_problem": arrays_edit("fallback", fallback_other_problem),
        "correct_on_nonterminal": arrays_edit("correct", lambda a: set_(
            "correct", (nonterminal_node(a), 0), 1)(a)),
        "zero_tokens": arrays_edit("cand_tokens", set_("cand_tokens", (0, 1), 0)),
        "prm_child_mismatch": arrays_edit("prm", prm_child_mismatch),
        "hash_mismatch": hash_mismatch,
        "truncated_safetensors": truncated,
        "truncated_safetensors_hash": truncated_hash,
        "junk_header": junk_header(b"__import__('os').system('touch PWNED')"),
        "header_object_dtype": junk_header(json.dumps(
            {"feat": {"dtype": "OBJECT", "shape": [8], "data_offsets": [0, 64]}}).encode()),
        "header_length_huge": junk_header(b"{}", declared=2 ** 40),
        "meta_version_future": meta_edit("format_version",
                                         lambda m: m.update(format_version=fmt.FORMAT_VERSION + 1)),
        "meta_missing_key": meta_edit("benchmark", lambda m: m.pop("benchmark")),
        "meta_feature_dim_wrong": meta_edit("feat", lambda m: m.update(
            feature_dim=m["feature_dim"] + 1, feature_names=m["feature_names"] + ["x"]),
            file=fmt.NODES_FILE),
        "meta_counts_wrong": meta_edit("counts.nodes", lambda m: m["counts"].update(nodes=1),
                                       file=fmt.NODES_FILE),
        "meta_bad_json": bad_json,
        "meta_models_not_dict": meta_edit("models", lambda m: m.update(models="slm")),
    }
    return table[name]


CASES = ["missing_nodes_file", "missing_meta_file", "missing_field", "unknown_field",
         "wrong_dtype", "wrong_shape", "nan_prm", "inf_feat", "prm_out_of_range",
         "child_out_of_range", "child_below_minus_one", "cycle", "path_with_no_end",
         "fallback_into_other_problem", "correct_on_nonterminal", "zero_tokens",
         "prm_child_mismatch", "hash_mismatch", "truncated_safetensors",
         "truncated_safetensors_hash", "junk_header", "header_object_dtype", "header_length_huge",
         "meta_version_future", "meta_missing_key", "meta_feature_dim_wrong", "meta_counts_wrong",
         "meta_bad_json", "meta_models_not_dict"]


@pytest.mark.parametrize("case", CASES)
def test_corrupted_folder_rejected_naming_file_and_field(tmp_path, small, case, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a junk header that somehow ran would drop PWNED here
    traces, meta = small
    good = tmp_path / "good"
    fmt.save(traces, good, meta)
    full_meta = json.loads((good / fmt.META_FILE).read_text())
    d = tmp_path / "bad"
    file, field = _corrupt(case)(d, traces.to_dict(), full_meta)
    with pytest.raises(TraceFormatError) as ei:
        fmt.load(d)
    assert ei.value.field == field, str(ei.value)
    msg = str(ei.value)
    assert f"'{field}'" in msg and file in msg, msg
    assert not (tmp_path / "PWNED").exists()


def test_meta_future_version_message_says_upgrade(tmp_path, small):
    traces, meta = small
    fmt.save(traces, tmp_path, meta)
    m = json.loads((tmp_path / fmt.META_FILE).read_text())
    m["format_version"] = 99
    (tmp_path / fmt.META_FILE).write_text(json.dumps(m))
    with pytest.raises(TraceFormatError, match="newer than this reader"):
        fmt.read_meta(tmp_path)


class _Boom:
    """Unpickling this creates a marker file: proves whether a pickle was ever loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_loading_never_unpickles(tmp_path, small, monkeypatch):
    traces, meta = small
    fmt.save(traces, tmp_path, meta)
    marker = tmp_path / "UNPICKLED"
    for name in ("nodes.pkl", "nodes.npy", "meta.pkl"):
        (tmp_path / name).write_bytes(pickle.dumps(_Boom(str(marker))))

    def refuse(*a, **k):
        raise AssertionError("loading must not unpickle")
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(np, "load", refuse)
    loaded = fmt.load(tmp_path)
    assert loaded.num_nodes == traces.num_nodes
    assert not marker.exists()


def test_save_rejects_invalid_arrays(tmp_path, small):
    traces, meta = small
    bad = traces.replace(prm=traces.prm.copy())
    bad.prm[0] = np.nan
    with pytest.raises(TraceFormatError, match="'prm'"):
        fmt.save(bad, tmp_path / "x", meta)
    assert not (tmp_path / "x" / fmt.NODES_FILE).exists()
