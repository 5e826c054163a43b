"""Teacher-logit store: round trip, resume, validation errors (synthetic arrays, no torch)."""
import json
import os

import numpy as np
import pytest

from prada_jax.distill import logits_store
from prada_jax.distill.logits_store import LogitStoreError, LogitStoreWriter, TeacherLogits

K = 4


def _synthetic(seed, n):
    """Synthetic per-token arrays of one sequence with n scored tokens."""
    rng = np.random.default_rng(seed)
    logp = np.sort(rng.uniform(-9, 0, (n, K)).astype(np.float32), axis=1)[:, ::-1]
    return {"logp_actual": rng.uniform(-12, 0, n).astype(np.float32),
            "topk_ids": rng.integers(0, 150000, (n, K)).astype(np.int32),
            "topk_logp": np.ascontiguousarray(logp),
            "tail_mass": rng.uniform(0, 1, n).astype(np.float32)}


LENGTHS = [3, 0, 7, 5, 9, 2, 6]
META = {"teacher": "synthetic", "tokenizer_fingerprint": "sha256:abc", "vocab_size": 150000}


def _write(out, ids=None, stop_after=None, shard_tokens=8):
    w = LogitStoreWriter(out, K, META, shard_tokens=shard_tokens)
    for i, n in enumerate(LENGTHS):
        if ids is not None and i not in ids:
            continue
        if w.done(i):
            continue
        w.add(i, _synthetic(i, n))
        w.maybe_flush()
        if stop_after is not None and len(w.index["shards"]) >= stop_after:
            return w  # "crash": buffer lost, no close()
    w.close()
    return w


def test_round_trip_values(tmp_path):
    _write(tmp_path)
    store = TeacherLogits.open(tmp_path, require_complete=True)
    assert len(store) == len(LENGTHS) and store.top_k == K and store.meta == META
    assert len(store.index["shards"]) > 2
    for i, n in enumerate(LENGTHS):
        got, ref = store.get(i), _synthetic(i, n)
        np.testing.assert_array_equal(got["topk_ids"], ref["topk_ids"])
        np.testing.assert_array_equal(got["logp_actual"], ref["logp_actual"])
        np.testing.assert_array_equal(got["tail_mass"], ref["tail_mass"])
        # 16-bit storage: exactly the float16 rounding of the input.
        np.testing.assert_array_equal(got["topk_logp"],
                                      ref["topk_logp"].astype(np.float16).astype(np.float32))
        assert got["topk_ids"].dtype == np.int32 and got["topk_logp"].shape == (n, K)


def test_bytes_per_token(tmp_path):
    _write(tmp_path, shard_tokens=10 ** 6)
    total = sum(LENGTHS)
    size = os.path.getsize(tmp_path / logits_store.shard_name(0))
    assert logits_store.bytes_per_token(K) == K * 6 + 8
    assert 0 <= size - total * logits_store.bytes_per_token(K) < 1024  # header only


def test_resume_after_crash_gives_identical_files(tmp_path):
    _write(tmp_path / "a")
    _write(tmp_path / "b", stop_after=2)
    b = tmp_path / "b"
    assert not TeacherLogits.open(b).complete
    with pytest.raises(LogitStoreError, match="complete=false"):
        TeacherLogits.open(b, require_complete=True)
    # Crash debris: a renamed shard the index never listed, and a half-written temp file.
    (b / logits_store.shard_name(2)).write_bytes(b"\x00" * 37)
    (b / "shard_00003.safetensors.tmp").write_bytes(b"junk")
    _write(b)
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(b))
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (b / name).read_bytes(), name


def test_resume_refuses_other_settings(tmp_path):
    _write(tmp_path, stop_after=1)
    with pytest.raises(LogitStoreError, match=r"index\.json.*meta\.teacher"):
        LogitStoreWriter(tmp_path, K, dict(META, teacher="other"))
    with pytest.raises(LogitStoreError, match=r"index\.json.*top_k"):
        LogitStoreWriter(tmp_path, K + 1, META)


def test_duplicate_and_bad_shapes(tmp_path):
    w = LogitStoreWriter(tmp_path, K, META)
    w.add("x", _synthetic(0, 3))
    with pytest.raises(LogitStoreError, match="already stored"):
        w.add("x", _synthetic(0, 3))
    bad = _synthetic(1, 3)
    bad["topk_ids"] = bad["topk_ids"][:, :2]
    with pytest.raises(ValueError, match="topk_ids"):
        w.add("y", bad)


def test_truncated_shard_names_file(tmp_path):
    _write(tmp_path)
    shard = tmp_path / logits_store.shard_name(1)
    data = shard.read_bytes()
    shard.write_bytes(data[:-5])
    with pytest.raises(LogitStoreError, match="shard_00001.safetensors.*truncated"):
        TeacherLogits.open(tmp_path)
    with pytest.raises(LogitStoreError, match="shard_00001.safetensors"):
        LogitStoreWriter(tmp_path, K, META)  # resume refuses too


def test_truncated_shard_consistent_index_names_file(tmp_path):
    """Truncation that the recorded byte size would not catch is caught by the header check."""
    _write(tmp_path)
    shard = tmp_path / logits_store.shard_name(0)
    data = shard.read_bytes()[:-5]
    shard.write_bytes(data)
    index = json.loads((tmp_path / "index.json").read_text())
    index["shards"][0]["bytes"] = len(data)
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(LogitStoreError, match="shard_00000.safetensors: truncated"):
        TeacherLogits.open(tmp_path)


def test_index_past_shard_end_names_file(tmp_path):
    _write(tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    shard, offset, length = index["sequences"]["4"]
    index["sequences"]["4"] = [shard, offset + 3, length + 20]
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(LogitStoreError, match=r"'4'.*past the end of .*shard_0000\d\.safetensors"):
        TeacherLogits.open(tmp_path)
    index["sequences"]["4"] = [99, 0, 1]
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(LogitStoreError, match="shard 99"):
        TeacherLogits.open(tmp_path)


def test_missing_shard_and_bad_index(tmp_path):
    _write(tmp_path)
    os.remove(tmp_path / logits_store.shard_name(0))
    with pytest.raises(LogitStoreError, match="shard_00000.safetensors.*missing"):
        TeacherLogits.open(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(LogitStoreError, match=r"index\.json: not valid JSON"):
        TeacherLogits.open(tmp_path)
    with pytest.raises(FileNotFoundError, match="index.json"):
        TeacherLogits.open(tmp_path / "nowhere")
