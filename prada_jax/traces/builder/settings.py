"""The settings that fix a trace set's content, validated from the build's parsed flags."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from prada_jax.errors import BadInput

__all__ = ["BuildError", "Settings", "settings_from_args", "local_model_dir",
           "DEFAULT_SYSTEM_PROMPT", "STATS_FEATURES"]

DEFAULT_SYSTEM_PROMPT = ("Please reason step by step, and put your final answer within "
                         "\\boxed{}.")
STATS_FEATURES = ("logp_mean", "logp_min", "entropy_mean", "step_index", "ctx_tokens")


class BuildError(BadInput):
    """Bad input to the builder: the message names the flag, file or field."""


def _decode_escapes(s: str) -> str:
    return s.encode("utf-8").decode("unicode_escape") if "\\" in s else s


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that determines the content of a trace set (the resume fingerprint)."""
    benchmark: str
    node_budget: int
    full_depth: int
    max_steps: int
    behaviour: str
    behaviour_llm_prob: float
    behaviour_threshold: float
    behaviour_temp: float
    behaviour_eps: float
    step_delimiter: str
    max_step_tokens: int
    temperature: float
    system_prompt: str
    feature_dim: int
    seed: int
    batch_size: int
    prm_style: str
    device: str
    dtype: str
    check_timeout: float


def settings_from_args(args: argparse.Namespace, prm_style: str, device: str, dtype: str
                       ) -> Settings:
    """Validates the numeric flags; raises ``BuildError`` naming the flag."""
    def positive(name, v):
        if v is None or v < 1:
            raise BuildError(f"--{name.replace('_', '-')} must be >= 1, got {v}")

    for name in ("node_budget", "max_steps", "max_step_tokens", "batch_size", "prm_batch_size"):
        positive(name, getattr(args, name))
    if args.full_depth < 0:
        raise BuildError(f"--full-depth must be >= 0, got {args.full_depth}")
    if args.feature_dim < len(STATS_FEATURES) + 1:
        raise BuildError(f"--feature-dim must be >= {len(STATS_FEATURES) + 1} "
                         f"({len(STATS_FEATURES)} statistics + at least one projected dim)")
    if args.limit is not None and args.limit < 1:
        raise BuildError(f"--limit must be >= 1, got {args.limit}")
    if args.max_batches is not None and args.max_batches < 1:
        raise BuildError(f"--max-batches must be >= 1, got {args.max_batches}")
    if not 0.0 <= args.behaviour_llm_prob <= 1.0:
        raise BuildError("--behaviour-llm-prob must lie in [0, 1]")
    if not 0.0 <= args.behaviour_eps <= 0.5:
        raise BuildError("--behaviour-eps must lie in [0, 0.5]")
    if args.behaviour_temp <= 0:
        raise BuildError("--behaviour-temp must be > 0")
    if args.temperature < 0:
        raise BuildError("--temperature must be >= 0")
    if args.check_timeout <= 0:
        raise BuildError("--check-timeout must be > 0")
    delim = _decode_escapes(args.step_delimiter)
    if not delim:
        raise BuildError("--step-delimiter must not be empty")
    return Settings(benchmark=args.benchmark, node_budget=args.node_budget,
                    full_depth=args.full_depth, max_steps=args.max_steps,
                    behaviour=args.behaviour, behaviour_llm_prob=args.behaviour_llm_prob,
                    behaviour_threshold=args.behaviour_threshold,
                    behaviour_temp=args.behaviour_temp, behaviour_eps=args.behaviour_eps,
                    step_delimiter=delim, max_step_tokens=args.max_step_tokens,
                    temperature=args.temperature, system_prompt=args.system_prompt,
                    feature_dim=args.feature_dim, seed=args.seed, batch_size=args.batch_size,
                    prm_style=prm_style, device=device, dtype=dtype,
                    check_timeout=args.check_timeout)


def local_model_dir(path: str, flag: str) -> Path:
    """A local Hugging Face model folder, or ``BuildError`` at once (no hub download)."""
    p = Path(path).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p
    if p.is_dir():
        raise BuildError(f"{flag}: '{path}' has no config.json (not a Hugging Face model folder)")
    raise BuildError(
        f"{flag}: '{path}' is not a local folder. Hub names are never downloaded here; fetch "
        f"it first (e.g. `huggingface-cli download {path} --local-dir models/{p.name}`) and "
        "pass the folder.")
