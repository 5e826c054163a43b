"""Process reward model (PRM) scorers: a value head or a step tag on a Hugging Face causal LM.

Both read a score after every step of a solution in **one causal forward pass**: the input is
the question followed by each step and a marker after it, and the score of the prefix with
``j`` steps is read at the marker after step ``j`` (``j = 0`` reads the marker right after the
question: the "no step yet" score of the root). Because the model is causal, the score at a
marker depends only on the tokens before it, so one pass over a solution scores all of its
prefixes, exactly as scoring each prefix on its own would. Pieces are tokenised separately
and concatenated, so the ids of a prefix are a prefix of the ids of the whole solution.

A PRM folder is a Hugging Face causal-LM folder (``config.json``, safetensors weights,
tokenizer files) plus ``prm_config.json``:

* ``"style": "value-head"`` (Skywork-PRM style): ``value_head.safetensors`` beside the model,
  holding ``weight`` [1, H] and ``bias`` [1] (any float dtype); the score is
  ``sigmoid(weight · h + bias)`` with ``h`` the last-layer (post final norm) hidden state at
  the last token of the step separator. Optional fields: ``step_separator`` (text after every
  step, default ``"\\n"``), ``question_template`` (default ``"{question}"``).
  A missing or misshapen head, or backbone weights missing from the checkpoint, is an error:
  never a randomly initialised head.
* ``"style": "step-tag"`` (Math-Shepherd style): the LM's own head; the score is
  P(good | tag) = softmax over (``good_token``, ``bad_token``) logits at the last token of
  ``step_tag`` (over the full vocabulary if ``bad_token`` is null). Fields: ``step_tag``
  (default ``" ки"``), ``good_token`` (default ``"+"``), ``bad_token`` (default ``"-"``),
  ``question_template`` (default ``"{question} "``). Each label must be one token.

torch/transformers are imported inside functions only (the ``[torch]`` extra).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json

PRM_CONFIG = "prm_config.json"
VALUE_HEAD_FILE = "value_head.safetensors"
STYLES = ("value-head", "step-tag")


class PRMError(BadInput):
    """A PRM folder or config that cannot be used. The message names the file and field."""


class PRMScorer(Protocol):
    """Scores every prefix of step sequences (one causal pass each, batched)."""

    name: str

    def score(self, questions: Sequence[str], steps: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Returns, per sequence i, float32 [len(steps[i]) + 1] scores in [0, 1]:
        entry j = score of the question plus its first j steps."""
        ...


def read_prm_config(path: os.PathLike | str, style: str | None = None) -> dict:
    """Reads ``prm_config.json`` of a PRM folder (defaults when absent), checks it against the
    requested ``style`` (the ``--prm-style`` flag)."""
    path = Path(path)
    cfg_path = path / PRM_CONFIG
    cfg: dict = {}
    if cfg_path.is_file():
        cfg = read_json(cfg_path, error=PRMError)   # an object, or PRMError naming the file
    file_style = cfg.get("style")
    if file_style is not None and file_style not in STYLES:
        raise PRMError(f"{cfg_path}: field 'style': {file_style!r} is not one of {STYLES}")
    if style is not None and style not in STYLES:
        raise PRMError(f"--prm-style: {style!r} is not one of {STYLES}")
    if style and file_style and style != file_style:
        raise PRMError(f"{cfg_path}: field 'style' is {file_style!r} but --prm-style is {style!r}")
    style = style or file_style
    if style is None:
        raise PRMError(f"{cfg_path}: no 'style' and no --prm-style given")
    if style == "value-head":
        out = {"style": style, "step_separator": "\n", "question_template": "{question}"}
    else:
        out = {"style": style, "step_tag": " ки", "good_token": "+", "bad_token": "-",
               "question_template": "{question} "}
    for k, v in cfg.items():
        if k not in out:
            raise PRMError(f"{cfg_path}: unknown field '{k}' for style {style!r} "
                           f"(known: {sorted(out)})")
        if k == "bad_token" and v is None:
            out[k] = None
            continue
        if not isinstance(v, str) or (k != "question_template" and v == ""):
            raise PRMError(f"{cfg_path}: field '{k}' must be a non-empty string")
        out[k] = v
    if "{question}" not in out["question_template"]:
        raise PRMError(f"{cfg_path}: field 'question_template' must contain '{{question}}'")
    return out


def _torch_dtype(dtype: str):
    import torch  # lazy: torch is optional (the [torch] extra)

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in table:
        raise PRMError(f"--dtype: {dtype!r} is not one of {sorted(table)}")
    return table[dtype]


class _CausalPRM:
    """Shared machinery: piecewise tokenisation, right-padded batched passes, marker gather."""

    name: str

    def __init__(self, path: os.PathLike | str, cfg: dict, tokenizer, device: str,
                 max_batch: int):
        self.path = Path(path)
        self.name = self.path.name
        self.cfg = cfg
        self.tok = tokenizer
        self.device = device
        self.max_batch = max(1, int(max_batch))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (
            tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0)

    def _marker_ids(self) -> list[int]:
        raise NotImplementedError

    def _enc(self, text: str, special: bool = False) -> list[int]:
        return list(self.tok(text, add_special_tokens=special)["input_ids"])

    def encode(self, question: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """Token ids of question + marker + (step + marker)*, and the marker positions.

        Returns (ids [T], positions [len(steps) + 1]); position j is the last token of the
        marker after j steps.
        """
        marker = self._marker_ids()
        ids = self._enc(self.cfg["question_template"].format(question=question), special=True)
        ids = ids + marker
        pos = [len(ids) - 1]
        for s in steps:
            ids = ids + self._enc(s.strip()) + marker
            pos.append(len(ids) - 1)
        return ids, pos

    def _scores_at(self, input_ids, attention_mask, rows, cols):
        raise NotImplementedError

    def score(self, questions: Sequence[str], steps: Sequence[Sequence[str]]) -> list[np.ndarray]:
        import torch  # lazy: torch is optional (the [torch] extra)

        if len(questions) != len(steps):
            raise ValueError("questions and steps differ in length")
        encoded = [self.encode(q, s) for q, s in zip(questions, steps)]
        out: list[np.ndarray] = [None] * len(encoded)  # type: ignore[list-item]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            length = max(len(encoded[i][0]) for i in chunk)
            ids = torch.full((len(chunk), length), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), length), dtype=torch.long)
            rows, cols = [], []
            for r, i in enumerate(chunk):
                seq, pos = encoded[i]
                ids[r, :len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[r, :len(seq)] = 1
                rows += [r] * len(pos)
                cols += pos
            with torch.inference_mode():
                vals = self._scores_at(ids.to(self.device), mask.to(self.device),
                                       torch.tensor(rows, device=self.device),
                                       torch.tensor(cols, device=self.device))
            vals = vals.float().cpu().numpy().astype(np.float32)
            k = 0
            for i in chunk:
                n = len(encoded[i][1])
                out[i] = np.clip(vals[k:k + n], 0.0, 1.0)
                k += n
        return out


class ValueHeadPRM(_CausalPRM):
    """Sigmoid of a linear value head on the last hidden state at each step separator."""

    def __init__(self, path, cfg, tokenizer, backbone, weight, bias, device, max_batch):
        super().__init__(path, cfg, tokenizer, device, max_batch)
        self.backbone = backbone
        self.weight = weight  # [1, H] float32
        self.bias = bias  # [1] float32
        self._marker = self._enc(cfg["step_separator"])
        if not self._marker:
            raise PRMError(f"{self.path / PRM_CONFIG}: field 'step_separator' tokenises to "
                           "nothing")

    def _marker_ids(self):
        return self._marker

    def _scores_at(self, input_ids, attention_mask, rows, cols):
        import torch  # lazy: torch is optional (the [torch] extra)

        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        h = h[rows, cols].float()  # [K, H]
        return torch.sigmoid(h @ self.weight.T + self.bias)[:, 0]


class StepTagPRM(_CausalPRM):
    """P(good label) at the step tag, from the causal LM's own next-token head."""

    def __init__(self, path, cfg, tokenizer, model, device, max_batch):
        super().__init__(path, cfg, tokenizer, device, max_batch)
        self.model = model
        self._marker = self._enc(cfg["step_tag"])
        if not self._marker:
            raise PRMError(f"{self.path / PRM_CONFIG}: field 'step_tag' tokenises to nothing")
        self.good_id = self._single_token("good_token")
        self.bad_id = self._single_token("bad_token") if cfg["bad_token"] is not None else None

    def _single_token(self, field):
        ids = self._enc(self.cfg[field])
        if len(ids) != 1:
            raise PRMError(f"{self.path / PRM_CONFIG}: field '{field}' = {self.cfg[field]!r} is "
                           f"{len(ids)} tokens for this tokenizer; it must be exactly one")
        return ids[0]

    def _marker_ids(self):
        return self._marker

    def _scores_at(self, input_ids, attention_mask, rows, cols):
        import torch  # lazy: torch is optional (the [torch] extra)

        base = getattr(self.model, self.model.base_model_prefix)
        h = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.model.get_output_embeddings()(h[rows, cols]).float()  # [K, V]
        if self.bad_id is None:
            return torch.softmax(logits, dim=-1)[:, self.good_id]
        pair = logits[:, [self.good_id, self.bad_id]]
        return torch.softmax(pair, dim=-1)[:, 0]


def _check_loading_info(path: Path, info: dict):
    missing = list(info.get("missing_keys") or [])
    if missing:
        raise PRMError(f"{path}: weights missing from the checkpoint: {missing[:5]}"
                       f"{' ...' if len(missing) > 5 else ''} (refusing a randomly initialised "
                       "model)")
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        raise PRMError(f"{path}: weights of the wrong shape: {mismatched[:5]}")


def load_value_head(path: os.PathLike | str, hidden_size: int):
    """Reads ``value_head.safetensors`` -> (weight [1, H], bias [1]) float32 torch tensors."""
    import torch  # lazy: torch is optional (the [torch] extra)
    from safetensors.torch import load_file  # lazy: needs torch

    f = Path(path) / VALUE_HEAD_FILE
    if not f.is_file():
        raise PRMError(f"{f}: missing: a value-head PRM needs its head weights (weight [1, H], "
                       "bias [1]); refusing to use a randomly initialised head")
    try:
        t = load_file(str(f))
    except (SafetensorError, OSError) as e:
        raise PRMError(f"{f}: cannot parse ({e})") from None
    for key, shape in (("weight", (1, hidden_size)), ("bias", (1,))):
        if key not in t:
            raise PRMError(f"{f}: field '{key}' missing")
        if tuple(t[key].shape) != shape:
            raise PRMError(f"{f}: field '{key}' has shape {tuple(t[key].shape)}, expected "
                           f"{shape} (hidden size {hidden_size} from config.json)")
        if not torch.isfinite(t[key].float()).all():
            raise PRMError(f"{f}: field '{key}' has non-finite values")
    return t["weight"].float(), t["bias"].float()


def load_prm(path: os.PathLike | str, style: str | None = None, device: str = "cpu",
             dtype: str = "fp32", max_batch: int = 16) -> _CausalPRM:
    """Loads a local PRM folder (see the module docstring) as a ``PRMScorer``.

    Args:
      path: local folder (no hub download).
      style: ``value-head`` or ``step-tag``; must agree with ``prm_config.json`` if it names one.
      device: torch device string.
      dtype: ``fp32`` | ``bf16`` | ``fp16`` for the backbone (the head runs in float32).
      max_batch: sequences per forward pass.
    """
    # lazy: transformers is heavy (and loads torch); only a PRM needs it
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise PRMError(f"--prm: '{path}' is not a local model folder (no config.json)")
    cfg = read_prm_config(path, style)
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    tdtype = _torch_dtype(dtype)
    if cfg["style"] == "value-head":
        # The backbone is read from a causal-LM checkpoint: its LM head is expected to be left
        # over, so the load report is silenced; missing weights are checked below instead.
        # lazy: transformers is heavy (and loads torch); only a PRM needs it
        from transformers.utils import logging as hf_logging

        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            backbone, info = AutoModel.from_pretrained(str(path), dtype=tdtype,
                                                       local_files_only=True,
                                                       output_loading_info=True)
        finally:
            hf_logging.set_verbosity(level)
        _check_loading_info(path, info)
        weight, bias = load_value_head(path, backbone.config.hidden_size)
        backbone.to(device).eval()
        return ValueHeadPRM(path, cfg, tok, backbone, weight.to(device), bias.to(device),
                            device, max_batch)
    model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=tdtype,
                                                       local_files_only=True,
                                                       output_loading_info=True)
    _check_loading_info(path, info)
    model.to(device).eval()
    return StepTagPRM(path, cfg, tok, model, device, max_batch)


def export_value_head(folder: os.PathLike | str, prefix: str = "v_head.summary.",
                      step_separator: str = "\n", question_template: str = "{question}") -> Path:
    """Writes ``value_head.safetensors`` + ``prm_config.json`` into a PRM folder whose value
    head is stored inside its model weights (e.g. Skywork-o1-Open-PRM: ``v_head.summary.weight``
    [1, H] and ``v_head.summary.bias`` [1]).

    Scans every ``*.safetensors`` file of ``folder`` for ``prefix + "weight"`` and
    ``prefix + "bias"``; raises ``PRMError`` if either is absent. Returns the head file's path.
    """
    folder = Path(folder)
    found: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        if f.name == VALUE_HEAD_FILE:
            continue
        with safe_open(str(f), framework="numpy") as st:
            for name in ("weight", "bias"):
                if prefix + name in st.keys():
                    found[name] = st.get_tensor(prefix + name)
    for name in ("weight", "bias"):
        if name not in found:
            raise PRMError(f"{folder}: no tensor '{prefix}{name}' in any *.safetensors file")
    w = found["weight"].astype(np.float32).reshape(1, -1)
    b = found["bias"].astype(np.float32).reshape(1)
    out = folder / VALUE_HEAD_FILE
    save_file({"weight": w, "bias": b}, str(out))
    (folder / PRM_CONFIG).write_text(json.dumps(
        {"style": "value-head", "step_separator": step_separator,
         "question_template": question_template}, indent=2))
    return out
