"""The one trace loader the trainers, the dual stage and the evaluations share.

``load_trace_set(spec)`` takes a trace folder (fully validated: ``meta.json``, array shapes,
content hash) or a synthetic preset name (``prada_jax.presets.BENCHMARKS``) and returns
``(TraceSet, info)``. Every failure is a ``TraceFormatError`` / ``errors.BadInput`` whose
message starts with ``name`` (the flag or config field the user set, e.g. ``--traces=DIR`` or
``config.env.trace_dir``), so commands print it as one line and exit 2.

``info`` (JSON-safe): ``source`` (folder path or ``synthetic:<preset>``), ``benchmark``,
``synthetic``, ``content_hash`` (folders) or ``trace_seed`` (presets), ``num_nodes``,
``num_problems``, ``feature_dim``, and ``split`` (``train``, ``validation``, ``test`` or
``all``) with ``split_problems`` (the selected problem indices of the whole set) and
``problems_total``.

``split`` selects one part of the set (``prada_jax.traces.splits``): a preset's split comes
with its generated ``meta["splits"]`` (one feature map for every part), a folder's from
``meta.json``; a folder without one, asked for a part, is refused (exit 2).
"""
from __future__ import annotations

import os
from pathlib import Path

from prada_jax.errors import BadInput
from prada_jax.presets import BENCHMARKS
from prada_jax.traces import format as tf
from prada_jax.traces import synthetic
from prada_jax.traces import splits as sp

__all__ = ["load_trace_set", "load_config_traces"]


def load_trace_set(spec: os.PathLike | str, *, problems: int | None = None, seed: int = 0,
                   name: str = "traces", prefer_folder: bool = True, split: str | None = None,
                   split_name: str = "--split"):
    """``(traces, info)`` of a trace folder or a synthetic preset.

    Args:
      spec: a folder with ``meta.json`` + ``nodes.safetensors``, or a preset name.
      problems: for a preset, the number of problems (None: the benchmark's count).
      seed: for a preset, the generator seed.
      name: how the user set ``spec`` (``--traces``, ``config.env.trace_dir``); starts every
        error message.
      prefer_folder: an existing path wins over a preset of the same name.
      split: ``train``, ``validation``, ``test``, or None / ``all`` (every problem).
      split_name: how the user set ``split`` (``--split``, ``config.env.split``).

    ``info`` names the source, benchmark, synthetic flag, split and sizes, and under
    ``stand_in`` the roles a folder's models fill only as stand-ins (``format.stand_in_roles``).
    """
    part = sp.check_split_name(split, split_name)
    spec = str(spec)
    path = Path(spec)
    if prefer_folder and path.exists() or (spec not in BENCHMARKS and os.sep in spec):
        try:
            traces = tf.load(path)
            meta = tf.read_meta(path)
        except tf.TraceFormatError as e:
            raise tf.TraceFormatError(e.path, e.field,
                                      f"{_strip(str(e), e.path, e.field)} "
                                      f"(invalid trace folder {name}={spec})") from None
        info = {"source": str(path), "benchmark": meta["benchmark"],
                "synthetic": bool(meta["synthetic"]), "content_hash": meta["content_hash"]}
        if tf.stand_in_roles(meta):   # rows that rest on a stand-in model are marked
            info["stand_in"] = tf.stand_in_roles(meta)
        if part is not None and "splits" not in meta:
            raise sp.SplitError(f"{split_name}={part}: {name}={spec} has no split metadata "
                                f"(meta.json 'splits'); add one with "
                                f"prada_jax.traces.format.write_splits, or pass "
                                f"{split_name}={sp.ALL}")
    elif spec in BENCHMARKS:
        try:
            traces, meta = synthetic.generate(spec, seed=int(seed), problems=problems)
        except BadInput as e:
            raise BadInput(f"{name}={spec}: {e}") from None
        info = {"source": f"synthetic:{spec}", "benchmark": spec, "synthetic": True,
                "trace_seed": int(seed)}
    else:
        raise BadInput(f"{name}={spec}: neither an existing trace folder nor a synthetic "
                       f"preset ({', '.join(BENCHMARKS)})")
    total = traces.num_problems
    if part is not None:
        ids = meta["splits"][part]
        if not ids:
            raise sp.SplitError(f"{split_name}={part}: {name}={spec} has no problem in that "
                                "split")
        traces = sp.subset_problems(traces, ids)
        info.update(split=part, split_problems=list(ids))
    else:
        info.update(split=sp.ALL)
    info.update(num_nodes=traces.num_nodes, num_problems=traces.num_problems,
                feature_dim=traces.feature_dim, problems_total=total)
    return traces, info


def load_config_traces(config):
    """The trace set of a launcher config: ``config.env.trace_dir`` if set, else the preset
    ``config.env.preset`` with ``env.trace_seed`` and ``env.problems`` (0: the benchmark's
    count), restricted to the part ``config.env.split`` (absent: every problem). Returns
    ``(traces, info)`` as ``load_trace_set``."""
    env = config.env
    split = env.get("split") or None
    if env.get("trace_dir"):
        d = str(env.trace_dir)
        if not Path(d).is_dir():
            raise BadInput(f"config.env.trace_dir={d}: no such trace folder")
        return load_trace_set(d, name="config.env.trace_dir", split=split,
                              split_name="config.env.split")
    return load_trace_set(str(env.preset), problems=int(env.get("problems", 0)) or None,
                          seed=int(env.get("trace_seed", 0)), name="config.env.preset",
                          prefer_folder=False, split=split, split_name="config.env.split")


def _strip(msg: str, path: str, field: str) -> str:
    prefix = f"{path}: field '{field}': "
    return msg[len(prefix):] if msg.startswith(prefix) else msg
