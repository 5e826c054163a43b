"""Architecture hyper-parameters of a Qwen2/Llama-family decoder, convertible to/from HF configs."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping

import numpy as np

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
_ARCHS = ("qwen2", "llama")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Hyper-parameters of a decoder-only LM (Qwen2 / Llama family).

    Attributes:
      vocab_size: rows of the embedding / columns of the LM head (may exceed the tokenizer size
        by padding rows, e.g. 151936 vs 152064 for Qwen2.5).
      hidden_size: model width D.
      intermediate_size: SwiGLU hidden width F.
      num_layers: decoder blocks.
      num_heads: query heads H.
      num_kv_heads: key/value heads K (H % K == 0; grouped-query attention when K < H).
      head_dim: width of one head (not necessarily D / H).
      rope_theta: rotary base θ.
      rope_scaling: ``None`` or a tuple of sorted ``(name, value)`` pairs holding the HF
        ``rope_scaling`` / ``rope_parameters`` entries (``rope_type`` in default, linear, llama3,
        yarn); a tuple so the config stays hashable. Use :meth:`rope_scaling_dict` to read it.
      rms_norm_eps: RMSNorm ε.
      tie_word_embeddings: LM head shares the embedding matrix.
      attention_bias: q/k/v projections have a bias (always true for Qwen2).
      attention_out_bias: the output projection has a bias (Llama's ``attention_bias`` sets both).
      mlp_bias: the SwiGLU projections have biases (Llama ``mlp_bias``).
      max_position_embeddings: context length the model was configured for (informational, used
        by yarn).
      bos_token_id, eos_token_id, pad_token_id: special ids from the HF config (may be None;
        ``eos_token_id`` may be a tuple).
      arch: ``"qwen2"`` or ``"llama"``: the HF family this config came from / saves as.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    attention_out_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    arch: str = "qwen2"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"LMConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LMConfig.num_heads ({self.num_heads}) must be a multiple of "
                             f"LMConfig.num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LMConfig.head_dim must be even for rotary embeddings, "
                             f"got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"LMConfig.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"LMConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if self.arch not in _ARCHS:
            raise ValueError(f"LMConfig.arch must be one of {_ARCHS}, got {self.arch!r}")
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", _freeze(self.rope_scaling))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        rope_type = self.rope_type
        if rope_type not in _SUPPORTED_ROPE_TYPES:
            raise ValueError(f"LMConfig.rope_scaling rope_type {rope_type!r} is not supported "
                             f"(supported: {_SUPPORTED_ROPE_TYPES})")

    # --- derived ------------------------------------------------------------------------------
    def rope_scaling_dict(self) -> dict[str, Any]:
        """The rope scaling entries as a plain dict (empty for plain RoPE)."""
        return dict(self.rope_scaling or ())

    @property
    def rope_type(self) -> str:
        d = self.rope_scaling_dict()
        return d.get("rope_type", d.get("type", "default"))

    def rope_inv_freq(self) -> tuple[np.ndarray, float]:
        """Inverse frequencies [head_dim/2] (float32, rad/position) and the cos/sin scale factor.

        Transcribes the Hugging Face definitions of the default, linear, llama3 and yarn schemes.
        """
        dim = self.head_dim
        exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
        base = np.float32(self.rope_theta)
        inv_freq = (1.0 / (base ** exponent)).astype(np.float32)
        params = self.rope_scaling_dict()
        rope_type = self.rope_type
        if rope_type == "default":
            return inv_freq, 1.0
        factor = float(params["factor"]) if params.get("factor") is not None else None
        if rope_type == "linear":
            return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
        if rope_type == "llama3":
            low_ff = float(params["low_freq_factor"])
            high_ff = float(params["high_freq_factor"])
            old_len = float(params["original_max_position_embeddings"])
            wavelen = 2 * math.pi / inv_freq
            low_wl, high_wl = old_len / low_ff, old_len / high_ff
            scaled = np.where(wavelen > low_wl, inv_freq / factor, inv_freq)
            smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= high_wl) & (wavelen <= low_wl)
            return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
        # yarn
        orig = float(params["original_max_position_embeddings"])
        if factor is None:
            factor = self.max_position_embeddings / orig
        attention_factor = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")

        def _mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim)
            else:
                attention_factor = _mscale(factor)
        beta_fast = params.get("beta_fast") or 32
        beta_slow = params.get("beta_slow") or 1
        theta = float(self.rope_theta)

        def _corr_dim(rotations):
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = _corr_dim(beta_fast), _corr_dim(beta_slow)
        if params.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
        extrap = (1 - ramp).astype(np.float32)
        pos_freqs = base ** exponent
        inv_extra = 1.0 / pos_freqs
        inv_inter = 1.0 / (np.float32(factor) * pos_freqs)
        inv = inv_inter * (1 - extrap) + inv_extra * extrap
        return inv.astype(np.float32), float(attention_factor)

    # --- Hugging Face conversion --------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | str | os.PathLike) -> "LMConfig":
        """Builds a config from a HF ``config.json`` dict, a folder holding one, or a file path.

        Raises:
          ValueError: naming the file and field for unsupported or missing settings.
        """
        source = "<dict>"
        if not isinstance(config, Mapping):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            source = path
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no Hugging Face config at {path}")
            try:
                with open(path) as f:
                    config = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from e
        cfg = dict(config)
        model_type = cfg.get("model_type")
        if model_type not in _ARCHS:
            raise ValueError(f"{source}: model_type {model_type!r} is not supported "
                             f"(supported: {_ARCHS})")

        def _get(name, default=dataclasses.MISSING):
            if name in cfg and cfg[name] is not None:
                return cfg[name]
            if default is dataclasses.MISSING:
                raise ValueError(f"{source}: required field {name!r} is missing")
            return default

        act = _get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{source}: hidden_act {act!r} is not supported (only 'silu')")
        if cfg.get("use_sliding_window"):
            raise ValueError(f"{source}: use_sliding_window=true is not supported")
        if float(cfg.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
            raise ValueError(f"{source}: partial_rotary_factor != 1 is not supported")
        num_heads = int(_get("num_attention_heads"))
        hidden = int(_get("hidden_size"))
        head_dim = int(_get("head_dim", hidden // num_heads))
        # transformers 5 keeps θ and scaling in `rope_parameters`; 4.x: rope_theta/rope_scaling.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope.pop("partial_rotary_factor", None)
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        rope.pop("type", None)
        rope_scaling = None if rope.get("rope_type", "default") == "default" else _freeze(rope)
        if model_type == "qwen2":
            attention_bias, out_bias, mlp_bias = True, False, False
        else:
            attention_bias = out_bias = bool(cfg.get("attention_bias", False))
            mlp_bias = bool(cfg.get("mlp_bias", False))
        eos = cfg.get("eos_token_id")
        try:
            return cls(
                vocab_size=int(_get("vocab_size")),
                hidden_size=hidden,
                intermediate_size=int(_get("intermediate_size")),
                num_layers=int(_get("num_hidden_layers")),
                num_heads=num_heads,
                num_kv_heads=int(_get("num_key_value_heads", num_heads)),
                head_dim=head_dim,
                rope_theta=theta,
                rope_scaling=rope_scaling,
                rms_norm_eps=float(_get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=attention_bias,
                attention_out_bias=out_bias,
                mlp_bias=mlp_bias,
                max_position_embeddings=int(_get("max_position_embeddings", 32768)),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
                pad_token_id=cfg.get("pad_token_id"),
                arch=model_type,
            )
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e

    def to_hf_dict(self, arch: str | None = None) -> dict[str, Any]:
        """A HF ``config.json`` dict for ``Qwen2ForCausalLM`` or ``LlamaForCausalLM``.

        Args:
          arch: ``"qwen2"`` or ``"llama"``; defaults to ``self.arch``.

        Raises:
          ValueError: if the bias layout cannot be expressed in that family (Qwen2 always has q/k/v
            bias and no output bias; Llama's ``attention_bias`` covers q/k/v/o together).
        """
        arch = arch or self.arch
        if arch not in _ARCHS:
            raise ValueError(f"arch must be one of {_ARCHS}, got {arch!r}")
        rope = {"rope_theta": float(self.rope_theta), **self.rope_scaling_dict()}
        rope.setdefault("rope_type", "default")
        out = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_theta": float(self.rope_theta),
            "rope_parameters": rope,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                            else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "use_cache": True,
            "torch_dtype": "float32",
        }
        if self.rope_scaling:
            out["rope_scaling"] = dict(rope)
        if arch == "qwen2":
            if not self.attention_bias or self.attention_out_bias or self.mlp_bias:
                raise ValueError("arch='qwen2' needs attention_bias=True, "
                                 "attention_out_bias=False, mlp_bias=False; use arch='llama' "
                                 "for this config")
            out.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                       use_sliding_window=False, sliding_window=None,
                       max_window_layers=self.num_layers)
        else:
            if self.attention_bias != self.attention_out_bias:
                raise ValueError("arch='llama' needs attention_bias == attention_out_bias (HF "
                                 "attention_bias covers q/k/v/o); use arch='qwen2' for "
                                 "q/k/v-only bias")
            out.update(model_type="llama", architectures=["LlamaForCausalLM"],
                       attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        return out

    def num_params(self) -> int:
        """Total parameter count (embedding and head counted once when tied)."""
        d, f, h, k, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                          self.num_kv_heads, self.head_dim)
        attn = d * h * hd + 2 * d * k * hd + h * hd * d
        if self.attention_bias:
            attn += h * hd + 2 * k * hd
        if self.attention_out_bias:
            attn += d
        mlp = 3 * d * f + ((2 * f + d) if self.mlp_bias else 0)
        per_layer = attn + mlp + 2 * d
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + d


def _freeze(d: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    items = []
    for k, v in sorted(d.items()):
        if isinstance(v, list):
            v = tuple(v)
        items.append((k, v))
    return tuple(items)
