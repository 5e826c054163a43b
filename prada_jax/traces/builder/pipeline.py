"""One build run, from parsed flags to the assembled trace set, resuming from staged batches."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save
from tqdm import tqdm

from prada_jax import cli
from prada_jax.jsonio import read_json
from prada_jax.traces import answers as answers_lib
from prada_jax.traces import datasets as datasets_lib
from prada_jax.traces import prm as prm_lib
from prada_jax.traces.builder.assembly import assemble
from prada_jax.traces.builder.generation import HFStepGenerator, StepGenerator
from prada_jax.traces.builder.settings import (BuildError, Settings, local_model_dir,
                                              settings_from_args)
from prada_jax.traces.builder.staging import (PROJECTION_FILE, atomic_write_bytes, batch_name,
                                             file_sha256, model_fingerprint, prepare_staging,
                                             write_batch)
from prada_jax.traces.builder.tree import build_trees, feature_names, make_projection

__all__ = ["build"]


def _resolve_device(device: str | None, dtype: str | None) -> tuple[str, str]:
    import torch  # lazy: torch is optional (the [torch] extra)

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
        raise BuildError(f"--device must be cuda or cpu, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BuildError("--device cuda: no CUDA device is available (use --device cpu)")
    if dtype is None:
        dtype = "bf16" if device.startswith("cuda") else "fp32"
    return device, dtype


@dataclasses.dataclass(frozen=True)
class _Inputs:
    """The checked inputs of a build: model folders, PRM config, settings, problems and the
    resume fingerprint of all of them."""
    slm_dir: Path
    llm_dir: Path
    prm_dir: Path
    prm_cfg: dict
    st: Settings
    data: Path
    problems: list
    fingerprint: dict
    role_notes: dict


_ROLES = ("slm", "llm", "prm")


def _role_notes(text: str | None) -> dict:
    """``--role-notes``: a JSON object of role → note (roles slm, llm, prm), or {}."""
    if text is None:
        return {}
    try:
        notes = json.loads(text)
    except json.JSONDecodeError as e:
        raise BuildError(f"--role-notes: not JSON ({e.msg})") from None
    if not isinstance(notes, dict) or not all(
            k in _ROLES and isinstance(v, str) and v.strip() for k, v in notes.items()):
        raise BuildError(f"--role-notes: must be a JSON object mapping some of {', '.join(_ROLES)}"
                         " to non-empty strings")
    return notes


def _check_inputs(args: argparse.Namespace) -> _Inputs:
    """Checks the model folders, PRM config, device, numeric flags and data file; raises
    ``BuildError`` naming the flag or file. Loads no model."""
    role_notes = _role_notes(getattr(args, "role_notes", None))
    slm_dir = local_model_dir(args.slm, "--slm")
    llm_dir = local_model_dir(args.llm, "--llm")
    prm_dir = local_model_dir(args.prm, "--prm")
    try:
        prm_cfg = prm_lib.read_prm_config(prm_dir, args.prm_style)
    except prm_lib.PRMError as e:
        raise BuildError(str(e)) from None
    device, dtype = _resolve_device(args.device, args.dtype)
    st = settings_from_args(args, prm_cfg["style"], device, dtype)
    data = Path(args.data)
    try:
        problems = datasets_lib.load_problems(data, args.benchmark, args.limit)
    except datasets_lib.DatasetError as e:
        raise BuildError(f"--data: {e}") from None
    fingerprint = {
        "settings": dataclasses.asdict(st),
        "models": {"slm": model_fingerprint(slm_dir), "llm": model_fingerprint(llm_dir),
                   "prm": model_fingerprint(prm_dir)},
        "prm_config": prm_cfg,
        "data_sha256": file_sha256(data),
    }
    return _Inputs(slm_dir=slm_dir, llm_dir=llm_dir, prm_dir=prm_dir, prm_cfg=prm_cfg, st=st,
                   data=data, problems=problems, fingerprint=fingerprint,
                   role_notes=role_notes)


def _load_models(args: argparse.Namespace, inp: _Inputs, slm, llm, prm):
    """``(slm, llm, prm)``: the given ones, the others loaded from their folders (seeds torch
    and sets its thread count first)."""
    import torch  # lazy: torch is optional (the [torch] extra)

    st = inp.st
    if args.threads is not None:
        if args.threads < 1:
            raise BuildError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    torch.manual_seed(st.seed)
    if slm is None:
        slm = HFStepGenerator(inp.slm_dir, st, want_hidden=True)
    if llm is None:
        llm = HFStepGenerator(inp.llm_dir, st, want_hidden=False)
    if prm is None:
        try:
            prm = prm_lib.load_prm(inp.prm_dir, st.prm_style, st.device, st.dtype,
                                   args.prm_batch_size)
        except prm_lib.PRMError as e:
            raise BuildError(str(e)) from None
    return slm, llm, prm


def _projection(proj_path: Path, slm, inp: _Inputs) -> np.ndarray:
    """The staged feature projection [H, F - 5], drawn (and staged) on the first run."""
    if proj_path.is_file():
        return load_file(str(proj_path))["projection"]
    hidden = getattr(slm, "hidden_size", None) or read_json(
        inp.slm_dir / "config.json", error=BuildError).get("hidden_size")
    if not isinstance(hidden, int):
        raise BuildError(f"{inp.slm_dir / 'config.json'}: field 'hidden_size' must be an integer")
    projection = make_projection(int(hidden), inp.st.feature_dim, inp.st.seed)
    atomic_write_bytes(proj_path, save({"projection": projection}))
    return projection


def _stage_batches(args: argparse.Namespace, inp: _Inputs, staging: Path,
                   todo: list[tuple[int, int]], slm, llm, prm,
                   projection: np.ndarray) -> dict | None:
    """Grows and stages the ``todo`` batches in order; ``{"incomplete": True, ...}`` when
    ``--max-batches`` stops it early, else None."""
    st, problems = inp.st, inp.problems
    bar = None
    if not getattr(args, "no_progress", False) and todo:
        bar = tqdm(total=len(problems), initial=len(problems) - sum(e - s for s, e in todo),
                   unit="problem", desc=f"build {st.benchmark}", dynamic_ncols=True,
                   file=sys.stderr)
    done_now = 0
    try:
        for s, e in todo:
            if args.max_batches is not None and done_now >= args.max_batches:
                return {"incomplete": True, "batches_left": len(todo) - done_now}
            t0 = time.perf_counter()
            stats = answers_lib.CheckStats()
            trees = build_trees(problems[s:e], slm, llm, prm, st, projection, stats)
            extra = {"seconds": time.perf_counter() - t0, "checks": stats.checks,
                     "timeouts": stats.timeouts,
                     "fallback_other_branch": sum(t.n_fallback_other_branch for t in trees),
                     "fallback_same_depth": sum(t.n_fallback_same_depth for t in trees),
                     "max_prm_rescore_diff": max(t.max_prm_rescore_diff for t in trees)}
            write_batch(staging, s, e, trees, extra)
            done_now += 1
            if bar is not None:
                bar.update(e - s)
    finally:
        if bar is not None:
            bar.close()
    return None


def _trace_meta(inp: _Inputs) -> dict:
    """``meta.json`` of the trace set before assembly adds the counts."""
    st = inp.st
    dirs = {"slm": inp.slm_dir, "llm": inp.llm_dir, "prm": inp.prm_dir}
    roles = {"roles": {r: {"model": dirs[r].name, "note": note}
                       for r, note in inp.role_notes.items()}} if inp.role_notes else {}
    return {
        "benchmark": st.benchmark,
        "synthetic": False,
        "models": {"slm": inp.slm_dir.name, "llm": inp.llm_dir.name, "prm": inp.prm_dir.name},
        **roles,
        "prm_style": st.prm_style,
        "feature_names": feature_names(st.feature_dim),
        "generator": {
            "kind": "hf_build",
            "data_file": inp.data.name,
            "data_sha256": inp.fingerprint["data_sha256"],
            "projection": "seeded gaussian [H, F-5] / sqrt(H), projection.safetensors",
            "answer_checker": {"rel_tol": answers_lib.REL_TOL,
                               "sympy": answers_lib.SYMPY_AVAILABLE},
            **{k: v for k, v in dataclasses.asdict(st).items() if k != "device"},
        },
    }


def build(args: argparse.Namespace, *, slm: StepGenerator | None = None,
          llm: StepGenerator | None = None, prm=None) -> dict:
    """Builds (or resumes) a trace set from parsed flags; returns the final ``meta.json``,
    or ``{"incomplete": True, ...}`` when stopped early by ``--max-batches``.

    ``slm``/``llm``/``prm`` replace the models loaded from the flags (tests use scripted
    ones); the folders are still checked and fingerprinted.
    """
    cli.hub_offline()
    if getattr(args, "no_progress", False):
        # lazy: transformers is slow to import; importing the builder must not load it
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    inp = _check_inputs(args)
    out = Path(args.out)
    staging = prepare_staging(out, inp.fingerprint)
    b = inp.st.batch_size
    n = len(inp.problems)
    batches = [(s, min(s + b, n)) for s in range(0, n, b)]
    todo = [(s, e) for s, e in batches if not (staging / batch_name(s, e)).is_file()]
    if todo:
        slm, llm, prm = _load_models(args, inp, slm, llm, prm)
    proj_path = staging / PROJECTION_FILE
    projection = _projection(proj_path, slm, inp)
    stopped = _stage_batches(args, inp, staging, todo, slm, llm, prm, projection)
    if stopped is not None:
        return stopped
    if proj_path.is_file():
        shutil.copyfile(proj_path, out / (PROJECTION_FILE + ".tmp"))
        os.replace(out / (PROJECTION_FILE + ".tmp"), out / PROJECTION_FILE)
    return assemble(out, inp.problems, batches, _trace_meta(inp))
