"""Hugging Face folder ⇄ :class:`CausalLM` weight conversion through an explicit key map.

A HF folder holds ``config.json`` and either ``model.safetensors`` or several shards listed in
``model.safetensors.index.json`` (``weight_map``: tensor name → shard file). Loading builds the
model abstractly (``nnx.eval_shape``: no random weights are materialised) and fills every
parameter from the memory-mapped shards, optionally placing each on a sharding.
"""
from __future__ import annotations

import json
import os
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax.lm import safetensors_io
from prada_jax.lm.config import LMConfig
from prada_jax.lm.model import CausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class KeyMapEntry(NamedTuple):
    """One HF tensor ↔ one model parameter.

    Attributes:
      hf_key: tensor name in the safetensors files
        (e.g. ``model.layers.0.self_attn.q_proj.weight``).
      path: the parameter's path in ``nnx.state(model)`` (e.g. ``('layers', 0, 'self_attn',
        'q_proj', 'kernel')``).
      transpose: HF stores linear weights ``[out, in]``; the model stores kernels ``[in, out]``.
    """

    hf_key: str
    path: tuple
    transpose: bool


def key_map(config: LMConfig) -> list[KeyMapEntry]:
    """The complete, ordered HF ↔ NNX parameter map for ``config`` (reviewable as a table)."""
    m = [KeyMapEntry("model.embed_tokens.weight", ("embed_tokens", "embedding"), False)]
    for i in range(config.num_layers):
        p, l = f"model.layers.{i}.", ("layers", i)
        m.append(KeyMapEntry(p + "input_layernorm.weight", l + ("input_layernorm", "weight"),
                             False))
        m.append(KeyMapEntry(p + "post_attention_layernorm.weight",
                             l + ("post_attention_layernorm", "weight"), False))
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            m.append(KeyMapEntry(p + f"self_attn.{proj}.weight", l + ("self_attn", proj, "kernel"),
                                 True))
            has_bias = config.attention_out_bias if proj == "o_proj" else config.attention_bias
            if has_bias:
                m.append(KeyMapEntry(p + f"self_attn.{proj}.bias", l + ("self_attn", proj, "bias"),
                                     False))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            m.append(KeyMapEntry(p + f"mlp.{proj}.weight", l + ("mlp", proj, "kernel"), True))
            if config.mlp_bias:
                m.append(KeyMapEntry(p + f"mlp.{proj}.bias", l + ("mlp", proj, "bias"), False))
    m.append(KeyMapEntry("model.norm.weight", ("norm", "weight"), False))
    if not config.tie_word_embeddings:
        m.append(KeyMapEntry("lm_head.weight", ("lm_head", "kernel"), True))
    return m


def _weight_files(path: str) -> dict[str, str]:
    """Tensor name → shard file path, from the index file or the single-file layout."""
    index_path = os.path.join(path, INDEX_FILE)
    single = os.path.join(path, SINGLE_FILE)
    if os.path.isfile(index_path):
        try:
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index_path}: not a safetensors index (needs a 'weight_map')") from e
        out = {}
        for name, shard in weight_map.items():
            shard_path = os.path.join(path, shard)
            if not os.path.isfile(shard_path):
                raise FileNotFoundError(f"{index_path}: tensor {name!r} points to missing shard "
                                        f"{shard_path}")
            out[name] = shard_path
        return out
    if os.path.isfile(single):
        return {name: single for name in safetensors_io.read_header(single)[0]}
    raise FileNotFoundError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors "
                            "checkpoints are read; pickled .bin files are refused)")


def _path_str(path) -> str:
    return ".".join(str(p) for p in path)


ShardingSpec = jax.sharding.Sharding | Callable[[str, tuple], jax.sharding.Sharding] | None


def load_hf(path: str | os.PathLike, *, dtype=jnp.float32, param_dtype=None,
            sharding: ShardingSpec = None) -> tuple[CausalLM, LMConfig]:
    """Loads a Hugging Face Qwen2/Llama folder into a :class:`CausalLM`.

    Args:
      path: folder with ``config.json`` and safetensors weights (single file or index + shards).
      dtype: activation dtype of the model.
      param_dtype: parameter dtype (default: ``dtype``); stored tensors are cast to it.
      sharding: ``None`` (default device), one ``jax.sharding.Sharding`` (e.g. a replicated
        ``NamedSharding``) used for every parameter, or a callable
        ``(param_path_str, shape) -> Sharding`` choosing per parameter.

    Returns:
      (model, config).

    Raises:
      FileNotFoundError / ValueError naming the file for missing tensors, shape mismatches,
      truncated shards and index entries pointing to missing shards.
    """
    path = os.fspath(path)
    config = LMConfig.from_hf(path)
    param_dtype = param_dtype or dtype
    files = _weight_files(path)
    abstract = nnx.eval_shape(lambda: CausalLM(config, rngs=nnx.Rngs(0), dtype=dtype,
                                               param_dtype=param_dtype))
    graphdef, state = nnx.split(abstract)
    pure = nnx.to_pure_dict(state)
    opened: dict[str, safetensors_io.SafetensorsFile] = {}
    filled = set()
    for entry in key_map(config):
        if entry.hf_key not in files:
            raise ValueError(f"{path}: tensor {entry.hf_key!r} is missing from the checkpoint")
        file = files[entry.hf_key]
        if file not in opened:
            opened[file] = safetensors_io.SafetensorsFile(file)
        st = opened[file]
        if entry.hf_key not in st:
            raise ValueError(f"{file}: the index lists tensor {entry.hf_key!r} in this shard "
                             "but the shard does not contain it")
        arr = st.get(entry.hf_key)
        if entry.transpose:
            arr = arr.T
        node = pure
        for p in entry.path[:-1]:
            node = node[p]
        target = node[entry.path[-1]]
        if tuple(arr.shape) != tuple(target.shape):
            raise ValueError(f"{file}: tensor {entry.hf_key!r} has shape {tuple(arr.shape)} "
                             f"(after transpose={entry.transpose}) but the config needs "
                             f"{tuple(target.shape)}")
        host = np.asarray(arr, dtype=target.dtype)
        if sharding is None:
            value = jnp.asarray(host)
        else:
            sh = sharding(_path_str(entry.path), host.shape) if callable(sharding) else sharding
            value = jax.device_put(host, sh)
        node[entry.path[-1]] = value
        filled.add(entry.path)
    missing = [_path_str(p) for p, _ in _flatten(pure) if p not in filled]
    if missing:
        raise ValueError(f"{path}: key map left model parameters unfilled: {missing}")
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state), config


def _flatten(tree, prefix=()):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, prefix + (k,))
    else:
        yield prefix, tree


def save_hf(model: CausalLM, config: LMConfig, path: str | os.PathLike, *,
            arch: str | None = None, dtype=np.float32) -> None:
    """Writes ``config.json`` + ``model.safetensors`` that ``transformers`` loads.

    Args:
      model: the model to save.
      config: its config.
      path: output folder (created).
      arch: ``"qwen2"`` or ``"llama"`` (default ``config.arch``).
      dtype: numpy storage dtype of the weights (float32 default; ``ml_dtypes.bfloat16`` allowed).
    """
    path = os.fspath(path)
    hf_config = config.to_hf_dict(arch)
    # transformers 5 reads "dtype", 4.x "torch_dtype".
    hf_config["torch_dtype"] = hf_config["dtype"] = np.dtype(dtype).name
    pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    tensors = {}
    for entry in key_map(config):
        node = pure
        for p in entry.path:
            node = node[p]
        arr = np.asarray(jax.device_get(node)).astype(dtype)
        tensors[entry.hf_key] = arr.T if entry.transpose else arr
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, SINGLE_FILE + ".tmp")
    safetensors_io.save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, SINGLE_FILE))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
