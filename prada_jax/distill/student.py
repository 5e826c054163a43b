"""The Flax student of a distillation run: build it, initialise its train state, export it.

A student is a Qwen2-style :class:`prada_jax.lm.model.CausalLM`, either random (from
``config.student`` and a seed) or loaded from a Hugging Face folder (``config.student.init``;
a multi-seed run's folder holds ``seed_<s>/student_hf`` per seed). Its train state
(parameters, optimiser state, PRNG key) is :class:`prada_jax.distill.learner.TrainState`,
stacked on a leading seed axis when a run trains N > 1 students at once. Nothing here reads
or writes a run directory except :func:`carry_optimizer_state` (reads a finished one) and
:func:`save_student` (writes the exported folder).
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from prada_jax import config_utils as cu
from prada_jax.checkpointing import Checkpointer
from prada_jax.distill import task_registry as tasks_lib
from prada_jax.distill.learner import init_state, stack_states
from prada_jax.lm.config import LMConfig
from prada_jax.lm.hf import load_hf, save_hf
from prada_jax.lm.model import CausalLM


def seeds_of(config) -> list[int]:
    """The student seeds of a run: ``[config.seed + i for i in range(train.num_seeds)]``."""
    return [int(config.seed) + i for i in range(int(config.train.num_seeds))]


def init_dir(config, seed: int) -> str:
    """The HF folder seed ``seed`` starts from: ``<student.init>/seed_<seed>/student_hf`` when a
    multi-seed run's folder is given, else ``student.init`` itself ("" = random init)."""
    init = config.student.init
    if init and int(config.train.num_seeds) > 1:
        per = Path(init) / f"seed_{seed}" / "student_hf"
        if per.is_dir():
            return str(per)
    return init


def build_student(config, vocab_size: int, task: tasks_lib.Task, seed: int | None = None):
    """``(model, LMConfig)``: the Flax student of ``config.student.init`` (HF folder,
    :func:`init_dir`) or a random Qwen2-style model initialised from ``seed`` (default
    ``config.seed``) with ``vocab_size`` tokens."""
    seed = int(config.seed if seed is None else seed)
    dtype = jnp.bfloat16 if config.train.compute_dtype == "bfloat16" else jnp.float32
    init = init_dir(config, seed)
    if init:
        model, cfg = load_hf(init, dtype=dtype, param_dtype=jnp.float32)
        return model, cfg
    s = config.student
    cfg = LMConfig(vocab_size=vocab_size, hidden_size=s.hidden_size,
                   intermediate_size=s.intermediate_size, num_layers=s.num_layers,
                   num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                   head_dim=s.hidden_size // s.num_heads, tie_word_embeddings=True,
                   max_position_embeddings=256, pad_token_id=task.pad_id,
                   eos_token_id=task.eos_id, arch="qwen2")
    model = CausalLM(cfg, rngs=nnx.Rngs(params=seed), dtype=dtype,
                     param_dtype=jnp.float32)
    return model, cfg


def init_students(config, vocab_size: int, task: tasks_lib.Task, tx, seeds: list[int]):
    """``(graphdef, LMConfig, TrainState)`` of every seed's fresh student (N = 1: the state of
    ``seeds[0]``; N > 1: stacked on a leading seed axis); ConfigError when a loaded student's
    vocabulary is smaller than ``vocab_size`` (the pool's tokenizer)."""
    states = []
    for seed in seeds:
        model, cfg = build_student(config, vocab_size, task, seed)
        if cfg.vocab_size < vocab_size:
            raise cu.ConfigError(f"config.student.init: vocabulary {cfg.vocab_size} is smaller "
                                 f"than the pool's tokenizer ({vocab_size})")
        graphdef, st = init_state(model, tx, jax.random.key(seed))
        states.append(st)
        del model
    return graphdef, cfg, (states[0] if len(seeds) == 1 else stack_states(states))


def as_f32(model, cfg):
    """``model`` (any compute dtype) as a float32-compute model with the same parameters."""
    f32 = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    gd, _ = nnx.split(f32)
    return nnx.merge(gd, nnx.state(model))


def reset_schedule_counts(opt_state):
    """``opt_state`` with every learning-rate schedule's step count set to 0 (Adam's moments and
    its bias-correction count are kept)."""
    is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)   # noqa: E731
    return jax.tree.map(lambda x: x._replace(count=jnp.zeros_like(x.count)) if is_sched(x)
                        else x, opt_state, is_leaf=is_sched)


def stored_results(workdir) -> dict | None:
    """``<workdir>/results.json`` of a finished distillation run, or None (absent, unreadable,
    no "after" / "per_seed")."""
    try:
        res = json.loads((Path(workdir) / "results.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return res if isinstance(res, dict) and ("after" in res or "per_seed" in res) else None


def carry_optimizer_state(config, state):
    """``state`` with the optimiser state of the finished distillation workdir
    ``config.optim.carry_from`` (its final checkpoint): the warm start's AdamW moments continue
    and this run's learning-rate schedule starts over (:func:`reset_schedule_counts`).

    The warm start's final student must be ``config.student.init`` (its parameters are compared
    exactly) and its optimiser must have the same structure (same ``optim.grad_accum``, same
    number of seeds). Raises ConfigError (nothing written) otherwise."""
    src = Path(config.optim.carry_from)
    field = f"config.optim.carry_from {src}"
    if not config.student.init:
        raise cu.ConfigError("config.optim.carry_from needs config.student.init (the warm "
                             "start's student)")
    if stored_results(src) is None or not (src / "checkpoints").is_dir():
        raise cu.ConfigError(f"{field}: not a finished distillation workdir (no results.json "
                             "or checkpoints/)")
    ck = Checkpointer(src / "checkpoints", create=False)
    try:
        got, _ = ck.restore(state)
    finally:
        ck.close()
    same = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a),
                                                                          np.asarray(b))),
                                        got.params, state.params))
    if not all(same):
        raise cu.ConfigError(f"{field}: its final student is not config.student.init "
                             f"({config.student.init})")
    return state.replace(opt_state=reset_schedule_counts(got.opt_state))


def save_student(graphdef, params, cfg, out_dir: Path, task: tasks_lib.Task | None = None
                 ) -> Path:
    """Saves the student as a Hugging Face folder (float32 safetensors + config + the task's
    tokenizer when the task has one); returns ``out_dir``."""
    model = nnx.merge(graphdef, params)
    save_hf(model, cfg, out_dir, arch=cfg.arch)
    if task is not None and task.build_tokenizer is not None:
        try:
            task.build_tokenizer().save_pretrained(out_dir)
        except Exception as e:  # noqa: BLE001 - the tokenizer is a convenience, weights suffice
            print(f"note: tokenizer not saved next to the student ({e})")
    return out_dir
