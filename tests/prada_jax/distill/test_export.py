"""Teacher-logit exporter: values vs a direct PyTorch computation, resume, tokenizer checks."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import importlib
import re
from pathlib import Path

from prada_jax.distill import export, logits_store, scoring
from prada_jax.distill.logits_store import TeacherLogits
from prada_jax.errors import BadInput

export_cli = importlib.import_module("prada_jax.distill.export.__main__")

WORDS = 62         # word-level vocabulary (+ <unk>, <pad>; transformers' Qwen2Tokenizer adds eos)
TEACHER_ROWS = 80  # teacher embedding rows: padding rows past the tokenizer
N_TOK = WORDS + 3  # tokenizer length as AutoTokenizer loads it from the teacher folder


def _tokenizer(permute=False):
    """A word-level tokenizer (synthetic vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = [f"w{i}" for i in range(WORDS)]
    if permute:
        words[0], words[1] = words[1], words[0]
    vocab = {"<unk>": 0, "<pad>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                pad_token="<pad>")


def _teacher(path, permute=False, seed=0):
    cfg = transformers.Qwen2Config(vocab_size=TEACHER_ROWS, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True,
                                   max_position_embeddings=128)
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():  # sharpen the distributions so top-k and tail both matter
            p.copy_(0.4 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(path)
    _tokenizer(permute).save_pretrained(path)
    return model


def _load_tokenizer(path):
    return transformers.AutoTokenizer.from_pretrained(path)


def _sequences(n=9, seed=0):
    rng = np.random.default_rng(seed)
    lens = [1, 5, 12, 7, 20, 3, 9, 16, 2][:n]
    return [rng.integers(0, WORDS + 2, size=l).tolist() for l in lens]


def _pool(path, seqs, tokenizer_dir):
    from prada_jax.distill import pool as pool_mod
    arrays = pool_mod.build_arrays(seqs, [[(0, len(s))] for s in seqs], [1] * len(seqs))
    meta = {"task": "synthetic-test", "synthetic": True,
            "tokenizer": pool_mod.tokenizer_meta(_load_tokenizer(tokenizer_dir), "synthetic")}
    pool_mod.save_pool(arrays, path, meta)
    return path


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    d = tmp_path_factory.mktemp("teacher")
    model = _teacher(d)
    assert len(_load_tokenizer(d)) == N_TOK
    return str(d), model


def _reference(model, seq, k):
    """Direct per-sequence computation (no batching/padding), float64 softmax over 64 tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([seq])).logits[0, :-1, :N_TOK].double()
    logp = torch.log_softmax(logits, -1).numpy()
    return logp, np.asarray(seq[1:])


def _check_against_reference(store, model, seqs, k):
    for i, s in enumerate(seqs):
        got = store.get(i)
        assert got["logp_actual"].shape == (max(len(s) - 1, 0),)
        if len(s) < 2:
            continue
        logp, target = _reference(model, s, k)
        order = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
        np.testing.assert_array_equal(got["topk_ids"], order)
        assert (got["topk_ids"] < N_TOK).all()  # padding rows never appear
        ref_top = np.take_along_axis(logp, order, -1)
        np.testing.assert_allclose(got["topk_logp"], ref_top, rtol=1e-3, atol=1e-3)  # float16
        np.testing.assert_allclose(got["logp_actual"], logp[np.arange(len(target)), target],
                                   atol=2e-5, rtol=0)
        np.testing.assert_allclose(got["tail_mass"], 1.0 - np.exp(ref_top).sum(-1), atol=2e-6,
                                   rtol=0)


def test_pool_export_matches_direct_pytorch(teacher, tmp_path):
    path, model = teacher
    seqs = _sequences()
    _pool(tmp_path / "pool", seqs, path)
    stats = export_cli.main(["--teacher", path, "--pool", str(tmp_path / "pool"), "--out",
                         str(tmp_path / "store"), "--top_k", "8", "--batch_tokens", "24",
                         "--shard_tokens", "10", "--noprogress"])
    assert stats["tokens"] == sum(len(s) - 1 for s in seqs)
    store = TeacherLogits.open(tmp_path / "store", require_complete=True)
    assert store.meta["teacher_vocab_rows"] == TEACHER_ROWS and store.meta["vocab_size"] == N_TOK
    assert len(store.index["shards"]) >= 3
    _check_against_reference(store, model, seqs, 8)
    assert stats["bytes_per_token"] == pytest.approx(logits_store.bytes_per_token(8), rel=0.5)


def test_score_sequences_full_vocab_tail_zero_and_alignment(teacher):
    _, model = teacher
    seqs = _sequences(4, seed=3)
    out = scoring.score_sequences(model, seqs, top_k=N_TOK, batch_tokens=30, vocab_size=N_TOK)
    for s, r in zip(seqs, out):
        assert r["topk_ids"].shape == (max(len(s) - 1, 0), N_TOK)
        np.testing.assert_allclose(r["tail_mass"], 0.0, atol=1e-7)
        np.testing.assert_allclose(np.exp(r["topk_logp"]).sum(-1), 1.0, atol=1e-5)
    # Temperature divides the logits before the softmax.
    hot = scoring.score_sequences(model, seqs[2:3], top_k=3, temperature=2.0, vocab_size=N_TOK)[0]
    logp, target = _reference(model, seqs[2], 3)
    ref = torch.log_softmax(torch.tensor(logp) / 2.0, -1).numpy()  # logp = logits + const
    np.testing.assert_allclose(hot["logp_actual"], ref[np.arange(len(target)), target], atol=2e-5)


def test_plan_batches():
    assert scoring.plan_batches([3, 3, 3, 10, 2, 2], 9) == [[0, 1, 2], [3], [4, 5]]
    assert scoring.plan_batches([], 5) == []
    with pytest.raises(ValueError, match="batch_tokens"):
        scoring.plan_batches([1], 0)


def test_resume_after_interrupt_gives_identical_shards(teacher, tmp_path):
    path, model = teacher
    seqs = _sequences(seed=5)
    ids = [f"s{i}" for i in range(len(seqs))]
    kw = dict(meta={"teacher": "t"}, vocab_size=N_TOK, top_k=6, batch_tokens=40,
              shard_tokens=15, progress=False)
    export.export_logits(model, ids, seqs, str(tmp_path / "a"), **kw)

    class Interrupt(Exception):
        pass

    def crash(n):
        if n == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        export.export_logits(model, ids, seqs, str(tmp_path / "b"), on_shard_written=crash, **kw)
    b = tmp_path / "b"
    assert len(TeacherLogits.open(b)) < len(seqs)
    (b / logits_store.shard_name(2)).write_bytes(b"partial")  # debris of a crash mid-shard
    stats = export.export_logits(model, ids, seqs, str(b), **kw)
    assert stats["skipped"] > 0
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(b)) and len(names) > 3
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (b / name).read_bytes(), name


def test_sequences_jsonl_cli(teacher, tmp_path):
    path, model = teacher
    seqs = _sequences(4, seed=7)
    f = tmp_path / "seqs.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"r{i}", "tokens": s}) for i, s in enumerate(seqs)))
    fp = scoring.tokenizer_fingerprint(_load_tokenizer(path))
    export_cli.main(["--teacher", path, "--sequences", str(f), "--out", str(tmp_path / "o"),
                 "--top_k", "5", "--tokenizer_fingerprint", fp, "--noprogress"])
    store = TeacherLogits.open(tmp_path / "o", require_complete=True)
    direct = scoring.score_sequences(model, seqs, top_k=5, vocab_size=N_TOK)
    for i, r in enumerate(direct):
        got = store.get(f"r{i}")
        np.testing.assert_array_equal(got["topk_ids"], r["topk_ids"])
        np.testing.assert_array_equal(got["logp_actual"], r["logp_actual"])
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        export_cli.main(["--teacher", path, "--sequences", str(f), "--out", str(tmp_path / "o2"),
                     "--tokenizer_fingerprint", "sha256:other", "--noprogress"])
    f.write_text('{"id": 1, "tokens": [1, 2]}\n{"id": 2, "tokens": "abc"}\n')
    with pytest.raises(ValueError, match=r"seqs\.jsonl:2"):
        export_cli.main(["--teacher", path, "--sequences", str(f), "--out", str(tmp_path / "o3")])


def test_teacher_with_other_tokenizer_is_refused(teacher, tmp_path):
    seqs = _sequences(3)
    _pool(tmp_path / "pool", seqs, teacher[0])
    other = tmp_path / "other_teacher"
    _teacher(other, permute=True)
    with pytest.raises(ValueError, match=r"tokenizer mismatch.*other_teacher.*pool\.json"):
        export_cli.main(["--teacher", str(other), "--pool", str(tmp_path / "pool"), "--out",
                     str(tmp_path / "s"), "--noprogress"])
    assert not (tmp_path / "s").exists()


def test_bad_flags(teacher, tmp_path):
    path, _ = teacher
    with pytest.raises(BadInput, match="nope: teacher folder not found"):
        export_cli.main(["--teacher", str(tmp_path / "nope"), "--sequences", "x", "--out", "y"])
    with pytest.raises(BadInput, match="--top_k"):
        export_cli.main(["--teacher", path, "--sequences", "x", "--out", "y", "--top_k", "0"])
    with pytest.raises(BadInput, match="exactly one of --pool and --sequences"):
        export_cli.main(["--teacher", path, "--out", "y"])
    assert not (tmp_path / "y").exists()


def test_out_of_range_token_names_sequence(teacher, tmp_path):
    _, model = teacher
    with pytest.raises(ValueError, match=r"'bad'.*token id 70"):
        export.export_logits(model, ["ok", "bad"], [[1, 2], [3, 70]], str(tmp_path), meta={},
                             vocab_size=N_TOK, top_k=2, progress=False)


def test_imports_do_not_pull_torch():
    code = ("import sys, prada_jax, prada_jax.distill, prada_jax.distill.logits_store, "
            "prada_jax.distill.scoring, prada_jax.distill.export, prada_jax.lm.hf, "
            "prada_jax.lm.sampling; bad = [m for m in ('torch', 'transformers') if m in "
            "sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ,
                                                                      JAX_PLATFORMS="cpu"))


# --------------------------------------------------------------------------- error contract
# Every exporter error past argument parsing is one BadInput line naming the file or flag
# (exit 2 under the entry wrapper); nothing is written.

def _bad_input_cases(teacher, tmp_path):
    """(name, argv, regex the message must match) for the exporter's bad inputs."""
    import shutil
    path, _ = teacher
    seqs = _sequences()
    _pool(tmp_path / "pool", seqs, path)
    pool = str(tmp_path / "pool")
    store = tmp_path / "store"
    export_cli.main(["--teacher", path, "--pool", pool, "--out", str(store), "--top_k", "4",
                     "--shard_tokens", "10", "--noprogress"])
    trunc = tmp_path / "store_trunc"
    shutil.copytree(store, trunc)
    shard = trunc / logits_store.shard_name(0)
    shard.write_bytes(shard.read_bytes()[:-7])
    broken = tmp_path / "teacher_trunc"
    shutil.copytree(path, broken)
    w = broken / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    notok = tmp_path / "teacher_notok"
    notok.mkdir()
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if (Path(path) / f).is_file():
            shutil.copy(Path(path) / f, notok / f)
    other = tmp_path / "other_teacher"
    _teacher(other, permute=True)
    base = ["--pool", pool, "--noprogress"]
    return [
        ("truncated store shard", ["--teacher", path, "--out", str(trunc), "--top_k", "4",
                                   "--shard_tokens", "10", *base],
         r"shard_00000\.safetensors: truncated"),
        ("top_k above the vocabulary", ["--teacher", path, "--out", str(tmp_path / "o1"),
                                        "--top_k", "999", *base], r"--top_k=999: must lie in"),
        ("tokenizer mismatch", ["--teacher", str(other), "--out", str(tmp_path / "o2"), *base],
         r"tokenizer mismatch.*other_teacher"),
        ("k changed on resume", ["--teacher", path, "--out", str(store), "--top_k", "5", *base],
         r"index\.json: existing store has top_k=4.*--top_k=5"),
        ("truncated teacher weight shard", ["--teacher", str(broken), "--out",
                                            str(tmp_path / "o3"), *base],
         r"teacher_trunc/model\.safetensors: truncated"),
        ("teacher folder without tokenizer files", ["--teacher", str(notok), "--out",
                                                    str(tmp_path / "o4"), *base],
         r"teacher_notok: no tokenizer files"),
    ]


def _tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
                  for p in Path(root).rglob("*"))


def test_exporter_bad_inputs_are_one_line_bad_input(teacher, tmp_path, monkeypatch):
    cases = _bad_input_cases(teacher, tmp_path)
    loads = []
    real = scoring.load_teacher
    monkeypatch.setattr(scoring, "load_teacher", lambda *a, **k: loads.append(a) or real(*a, **k))
    for name, argv, pattern in cases:
        before, n = _tree(tmp_path), len(loads)
        with pytest.raises(BadInput) as ei:
            export_cli.main(argv)
        msg = str(ei.value)
        assert "\n" not in msg and re.search(pattern, msg), (name, msg)
        assert _tree(tmp_path) == before, name
        if name in ("top_k above the vocabulary", "k changed on resume", "truncated store shard",
                    "teacher folder without tokenizer files", "tokenizer mismatch"):
            assert len(loads) == n, f"{name}: the teacher was loaded before the check"


@pytest.mark.slow
def test_exporter_bad_inputs_exit_2_one_line_as_a_command(teacher, tmp_path):
    """The same corpus through ``python -m prada_jax.distill.export``: exit 2, one stderr
    line, nothing written."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[3]
    for name, argv, pattern in _bad_input_cases(teacher, tmp_path):
        before = _tree(tmp_path)
        p = subprocess.run([sys.executable, "-m", "prada_jax.distill.export", *argv], cwd=root,
                           capture_output=True, text=True, timeout=300)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, (name, p.stderr[-1500:])
        assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), (name, lines)
        assert _tree(tmp_path) == before, name
