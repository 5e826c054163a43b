"""``python -m prada_jax.lm.convert``: every bad input is one stderr line, exit 2, nothing
written. The successful conversion of the real model is exercised by the `real` tests
(``tests/helpers/real_model.py`` converts through :func:`prada_jax.lm.convert.convert`)."""
import importlib.util
import os

import numpy as np
import pytest

from prada_jax.errors import BadInput
from prada_jax.lm import convert

MOD = "prada_jax.lm.convert"
needs_gguf = pytest.mark.skipif(importlib.util.find_spec("gguf") is None,
                                reason="needs the [real] extra (gguf)")


def _tiny_gguf(path, arch):
    """A metadata-only GGUF file (one small tensor) written by the gguf package."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _bad(run_command, tmp_path, *args):
    out = tmp_path / "out"
    code, stdout, err = run_command(MOD, *args, f"--out={out}")
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]
    return lines[0]


def test_missing_file(run_command, tmp_path):
    assert "--gguf=" in _bad(run_command, tmp_path, f"--gguf={tmp_path / 'nope.gguf'}") \
        and "file not found" in _bad(run_command, tmp_path, f"--gguf={tmp_path / 'x.gguf'}")


def test_not_a_gguf_file(run_command, tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    line = _bad(run_command, tmp_path, f"--gguf={f}")
    assert "not a GGUF file" in line and str(f) in line


def test_flags(run_command, tmp_path):
    assert "exactly one of --gguf and --package" in _bad(run_command, tmp_path)
    assert "not installed" in _bad(run_command, tmp_path, "--package=no_such_pkg_xyz")
    code, _, err = run_command(MOD, "--gguf=x.gguf")
    assert code == 2 and err.strip() == "error: --out is required"
    code, _, err = run_command(MOD, "--gguf=x.gguf", "--out=o", "--bogus=1")
    assert code == 2 and "bogus" in err and len(err.strip().splitlines()) == 1


@pytest.mark.real
@needs_gguf
def test_unsupported_architecture(run_command, tmp_path):
    f = _tiny_gguf(tmp_path / "gpt2.gguf", "gpt2")
    assert convert.gguf_architecture(f) == "gpt2"
    line = _bad(run_command, tmp_path, f"--gguf={f}")
    assert "architecture 'gpt2' is not supported" in line and "llama, qwen2" in line


@pytest.mark.real
@needs_gguf
def test_out_must_be_new_or_empty(run_command, tmp_path):
    f = _tiny_gguf(tmp_path / "llama.gguf", "llama")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    code, _, err = run_command(MOD, f"--gguf={f}", f"--out={out}")
    assert code == 2 and "not empty" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(out) == ["keep.txt"]


@pytest.mark.real
@needs_gguf
def test_truncated_gguf_is_bad_input(tmp_path):
    f = _tiny_gguf(tmp_path / "llama.gguf", "llama")
    data = f.read_bytes()
    g = tmp_path / "cut.gguf"
    g.write_bytes(data[:40])
    with pytest.raises(BadInput, match="cut.gguf"):
        convert.convert(g, tmp_path / "out")
    assert not (tmp_path / "out").exists()
