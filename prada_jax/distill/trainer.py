"""Host training loop of ``python -m train.distill``: data, student, checkpoints, curves, eval.

``train_and_evaluate(config, workdir)`` (config: ``prada_jax/configs/distill.py``):

1. loads the pool (``config.data.pool_dir``) and, for offline fkl/jsd (and for logging the
   teacher KL in every offline run), the exported teacher logits (``config.data.logits_dir``);
2. builds the Flax student from ``config.student`` (or loads ``config.student.init``);
3. restores ``<workdir>/checkpoints`` if present, else evaluates the untrained student on the
   task ("before distillation");
4. runs ``config.train.steps`` optimizer updates (× ``config.optim.grad_accum`` micro-steps),
   writing TensorBoard curves to ``<workdir>/tb`` (``distill/loss``, ``distill/kl``,
   ``distill/kl_turn_<t>``, ``distill/turn_frac_<t>`` — the sampled-turn histogram —,
   ``distill/tokens_per_s``, ``distill/update_s``, ``distill/env_calls``), with a progress bar
   and orbax checkpoints every ``config.log.ckpt_every`` updates;
5. evaluates the student by running the task with the tool, saves it as a Hugging Face folder
   ``<workdir>/student_hf`` (safetensors; ``transformers`` loads it) and writes
   ``<workdir>/results.json``.

The trainer knows no task: everything task-specific (token ids, tokenizer, environment call
counter, teacher scorer, evaluator) comes from a :class:`prada_jax.distill.tasks.Task`, passed
in or looked up by the pool's ``task`` name. The job is a sequence of named steps on a
:class:`DistillRun`: :func:`build`, :func:`restore`, then per update :func:`optimizer_step`,
:func:`log_metrics`, :func:`refresh_ratio` and :func:`save`, and finally :func:`evaluate` and
:func:`finish`.

Determinism: the batch of micro-step s is drawn with ``np.random.default_rng([seed, s])`` and
the sampling key is ``fold_in(key(seed), s)``, so a resumed run continues the same sequence.

Seeds as a batch axis (``config.train.num_seeds = N`` > 1): one process trains N students with
seeds ``seed_i = config.seed + i`` (i = 0..N-1) in one jitted, ``vmap``-ped step: parameters
and optimiser states are stacked on a leading seed axis, and everything seed-dependent is
exactly what a separate run with ``config.seed = seed_i`` uses (student init, batch draws
``default_rng([seed_i, s])``, sampling keys ``fold_in(key(seed_i), s)``, the sampler's
schedule state for ``auto`` / ``exact-ratio``), so seed i of the vmapped run equals that
separate run up to floating-point reassociation of the batched kernels. On-policy generation,
teacher scoring, ratio refreshes and evaluations loop over the seeds on the host. Outputs:
curves of seed s in ``<workdir>/tb/seed_<s>`` (one TensorBoard run per seed), its student in
``<workdir>/seed_<s>/student_hf``; ``results.json`` holds ``per_seed`` (each entry the
results dict a separate run would write) and ``success_after`` = mean ± 95% Student-t CI of the
task success over seeds. With a ``student.init`` folder that holds ``seed_<s>/student_hf``
(a multi-seed run), seed s starts from its own student. N = 1 is the single-student path,
unchanged.
Modes (``config.mode``): ``offline`` (teacher tokens), ``onpolicy`` (ReOPD: the student samples
turn t after the replayed teacher prefix) and ``opd`` (online OPD, :mod:`prada_jax.distill.opd`:
the student plays whole episodes with the task's tool). Offline and ReOPD never call the
environment: ``distill/env_calls`` is the task's tool-call counter across the training steps
(0 there; OPD's rollouts count here). Every update's cost (supervised turns, student tokens,
teacher tokens, tool calls, rollout / scoring / update seconds) is logged as ``cost/*`` and
stored in ``results.json["cost"]``. ``optim.carry_from`` continues a warm start's optimiser
state; ``config.gate`` stops a run at a gate fixed in advance (or reports it not reached).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax import config_utils as cu
from prada_jax import run_state, runloop, stats
from prada_jax.errors import NonFiniteTraining
from prada_jax.jsonio import write_json
from prada_jax.distill import opd as opd_lib
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import ratio as ratio_lib
from prada_jax.distill import tasks as tasks_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.sampler import SCHEDULES, TurnSampler, check_kappa
from prada_jax.distill.learner import (init_state, make_optimizer, make_train_step,
                                       onpolicy_round, seed_slice, stack_states)


# Adaptive turn weightings (prada_jax/distill/ratio.py), re-estimated from the current student
# every ``sampler.refresh_every`` updates: "auto" = κ^t with κ = exp(−c̄), "exact-ratio" =
# clipped per-prefix likelihood ratio br_{i,t}.
ADAPTIVE = ("auto", "exact-ratio")

# Config fields that may change when a workdir is resumed (they extend or observe the run;
# ``prada_jax.run_state``): the total number of updates and the logging / checkpoint cadence.
# Note: the learning-rate schedule is laid out over ``train.steps``, so extending a run changes
# the schedule from the resumed update on (it does not equal a run started with the new total).
OBSERVATIONAL = ("train.steps", "log.*", "eval.before")   # eval.before acts at update 0 only

# "offline": teacher tokens; "onpolicy": ReOPD (student samples turn t after the replayed
# teacher prefix); "opd": online OPD (student episodes with the tool, prada_jax/distill/opd.py)
MODES = ("offline", "onpolicy", "opd")


def gate_on(config) -> bool:
    """Whether the run stops at a gate (``config.gate.every`` > 0)."""
    return "gate" in config and int(config.gate.every) > 0


def observational_fields(config) -> tuple[str, ...]:
    """Fields that may differ from a resumed workdir's stored config: :data:`OBSERVATIONAL`,
    ``optim.carry_from`` (it acts when a run starts), and fields that do not act in this run
    (``opd.*`` outside OPD mode, ``gate.*`` without a gate, ``train.prompt_bucket`` = 0), so
    workdirs written before those fields existed still resume."""
    extra = ["optim.carry_from"]
    if not int(config.train.get("prompt_bucket", 0)):
        extra.append("train.prompt_bucket")
    if config.mode != "opd":
        extra.append("opd.*")
    if not gate_on(config):
        extra.append("gate.*")
    return OBSERVATIONAL + tuple(extra)


def resolve_paths(config) -> dict[str, Path]:
    cache = Path(config.data.cache)
    return {"pool": Path(config.data.pool_dir or cache / "pool"),
            "logits": Path(config.data.logits_dir or cache / "logits"),
            "teacher": Path(config.data.teacher_dir or cache / "teacher")}


def validate_config(config) -> None:
    """Checks every field once; errors name the field (``config.sampler.kappa ...``)."""
    cu.check_choice(config, "mode", MODES)
    cu.check_choice(config, "loss.kind", ("fkl", "jsd", "sft", "rkl"))
    if config.mode == "offline":
        cu.check(config.loss.kind != "rkl", "loss.kind",
                 "'rkl' needs config.mode=onpolicy or opd (it scores student samples)")
    else:
        cu.check(config.loss.kind == "rkl", "loss.kind",
                 f"config.mode={config.mode} uses 'rkl'")
    if "opd" in config:
        cu.check_int(config, "opd.episodes", "opd.context_len", minimum=1)
        lat = config.opd.tool_latency_s
        cu.check(isinstance(lat, (int, float)) and not isinstance(lat, bool)
                 and np.isfinite(lat) and lat >= 0, "opd.tool_latency_s",
                 f"must be a finite number of seconds >= 0, got {lat!r}")
    elif config.mode == "opd":
        raise cu.ConfigError("config.opd is missing (config.mode=opd needs its fields)")
    try:
        check_kappa(config.sampler.kappa)
    except ValueError:
        raise cu.ConfigError(f"config.sampler.kappa must lie in (0, 1], got "
                             f"{config.sampler.kappa!r}") from None
    cu.check_choice(config, "sampler.schedule", SCHEDULES + ADAPTIVE)
    cu.check_int(config, "sampler.refresh_every", minimum=0)
    cu.check_range(config, "sampler.kappa_min", 0.0, 1.0, low_open=True)
    cu.check(float(config.sampler.get("auto_gap_max", float("inf"))) > 0.0,
             "sampler.auto_gap_max", "must be > 0 (nats per turn; inf = never hold κ)")
    cu.check_range(config, "sampler.ratio_min", 0.0, 1.0, low_open=True)
    cu.check(config.sampler.ratio_max >= 1.0, "sampler.ratio_max",
             f"must be >= 1 (the first turn's ratio), got {config.sampler.ratio_max!r}")
    cu.check_positive(config, "loss.temperature", "optim.lr", "optim.clip_norm",
                      "onpolicy.temperature", "onpolicy.top_p")
    cu.check_range(config, "loss.beta", 0.0, 1.0, low_open=True, high_open=True)
    cu.check_nonnegative(config, "loss.rkl_coef", "loss.fkl_coef", "optim.weight_decay")
    cu.check_int(config, "train.steps", "train.batch_size", "optim.grad_accum",
                 "log.every", "log.ckpt_every", "log.keep", "onpolicy.max_new_tokens",
                 "student.hidden_size", "student.num_layers", "student.num_heads",
                 "student.num_kv_heads", "student.intermediate_size", minimum=1)
    cu.check_int(config, "optim.warmup_steps", "eval.n_problems", minimum=0)
    cu.check_int(config, "train.num_seeds", minimum=1)
    if "prompt_bucket" in config.train:
        cu.check_int(config, "train.prompt_bucket", minimum=0)
    cu.check_int(config, "eval.every", minimum=0)
    cu.check(isinstance(config.eval.get("before", True), bool), "eval.before",
             f"must be true or false, got {config.eval.get('before')!r}")
    cu.check(config.student.hidden_size % config.student.num_heads == 0, "student.hidden_size",
             "must be divisible by config.student.num_heads")
    cu.check(config.student.num_heads % config.student.num_kv_heads == 0,
             "student.num_heads", "must be divisible by config.student.num_kv_heads")
    cu.check_choice(config, "train.compute_dtype", ("float32", "bfloat16"))
    cu.check(config.onpolicy.top_p <= 1.0, "onpolicy.top_p", "must be <= 1")
    if "gate" in config:
        cu.check_int(config, "gate.every", minimum=0)
        cu.check_range(config, "gate.success_min", 0.0, 1.0)
        cu.check_nonnegative(config, "gate.gap_max")
    if gate_on(config):
        cu.check(int(config.train.get("num_seeds", 1)) == 1, "gate.every",
                 "a gate needs config.train.num_seeds = 1 (one student per gated run)")
        cu.check(int(config.eval.n_problems) > 0, "gate.every",
                 "a gate needs task success: config.eval.n_problems > 0")
    if "mesh" in config:
        from prada_jax import parallel
        try:
            parallel.validate_mesh_config(config.mesh)
        except ValueError as e:
            raise cu.ConfigError(str(e)) from e


def seeds_of(config) -> list[int]:
    """The student seeds of a run: ``[config.seed + i for i in range(train.num_seeds)]``."""
    return [int(config.seed) + i for i in range(int(config.train.get("num_seeds", 1)))]


def init_dir(config, seed: int) -> str:
    """The HF folder seed ``seed`` starts from: ``<student.init>/seed_<seed>/student_hf`` when a
    multi-seed run's folder is given, else ``student.init`` itself ("" = random init)."""
    init = config.student.init
    if init and int(config.train.get("num_seeds", 1)) > 1:
        per = Path(init) / f"seed_{seed}" / "student_hf"
        if per.is_dir():
            return str(per)
    return init


def build_student(config, vocab_size: int, task: tasks_lib.Task, seed: int | None = None):
    """The Flax student: ``config.student.init`` (HF folder, :func:`init_dir`) or a random
    Qwen2-style model initialised from ``seed`` (default ``config.seed``)."""
    seed = int(config.seed if seed is None else seed)
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.hf import load_hf
    from prada_jax.lm.model import CausalLM
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


def _as_f32(model, cfg):
    from prada_jax.lm.model import CausalLM
    f32 = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    gd, _ = nnx.split(f32)
    return nnx.merge(gd, nnx.state(model))


@dataclasses.dataclass
class DistillRun:
    """Everything one distillation job holds between its steps (host side)."""

    config: Any
    workdir: Path
    task: tasks_lib.Task
    pool: Any
    samplers: list                  # one TurnSampler per seed (each owns its schedule state)
    table: Any                      # TeacherTable or None (on-policy without exported logits)
    teacher_score_fn: Callable | None
    graphdef: Any
    cfg: Any                        # LMConfig of the student
    state: Any                      # TrainState (params, opt_state); [N, ...] stacked if N > 1
    step_fn: Callable
    ckpt: Any
    writers: list                   # one MetricWriter per seed
    mesh: Any
    logp_fn: Callable | None        # student token log-probs for the ratio diagnostic
    num_turns: int
    seed_results: list              # one results dict per seed
    seeds: list = dataclasses.field(default_factory=list)
    start: int = 0
    meta: dict = dataclasses.field(default_factory=dict)
    base_keys: list = dataclasses.field(default_factory=list)
    prompts_cache: dict = dataclasses.field(default_factory=dict)
    # host-side state that feeds curves and results.json; all of it is in every checkpoint
    # (:func:`host_state`), so a resumed run's curves and results equal an uninterrupted run's
    update_times: list = dataclasses.field(default_factory=list)   # [s] per update, no compile
    tokens_done: int = 0            # tokens since the last log (all seeds)
    turn_hist: Any = None           # [N, num_turns] sampled-turn histogram per seed
    acc: dict = dataclasses.field(default_factory=dict)   # metric sums since the last log
    #                                 ([N, ...] per metric when N > 1)
    env_calls: int = 0
    # timing of this process only (not checkpointed): (seconds, tokens) of timed updates since
    # the last log; the first update of a process compiles and is not timed
    window: list = dataclasses.field(default_factory=list)
    calls: int = 0
    problems: Any = None            # OPD: the task problems of the pool's trajectories
    # per-update cost records (opd.RoundStats fields summed over seeds and micro-steps, plus
    # "timed": False for the first update of a process, which compiles); checkpointed
    costs: list = dataclasses.field(default_factory=list)
    cost_logged: int = 0            # costs[:cost_logged] are in the curves already
    # ``runloop.restore_or_init``'s ``(state, meta, step)``, done by :func:`build` before it
    # writes config.json (a template mismatch is refused first); consumed by :func:`restore`
    restored: Any = None

    @property
    def num_seeds(self) -> int:
        return len(self.seeds)

    @property
    def stacked(self) -> bool:
        return self.num_seeds > 1

    @property
    def sampler(self) -> TurnSampler:
        return self.samplers[0]

    @property
    def writer(self):
        return self.writers[0]

    @property
    def results(self) -> dict:
        return self.seed_results[0]

    def params_of(self, i: int, params=None):
        """Seed i's parameters (of ``params``, default the current state's)."""
        params = self.state.params if params is None else params
        return seed_slice(params, i) if self.stacked else params

    @property
    def schedule(self) -> str:
        return self.config.sampler.schedule

    @property
    def adaptive(self) -> bool:
        return self.schedule in ADAPTIVE

    @property
    def onpolicy(self) -> bool:
        """ReOPD (replayed prefix): the student samples turn t after the teacher's prefix."""
        return self.config.mode == "onpolicy"

    @property
    def opd(self) -> bool:
        """Online OPD: the student plays whole episodes with the tool."""
        return self.config.mode == "opd"


def build(config, workdir, task: tasks_lib.Task | None = None,
          teacher_score_fn: Callable | None = None) -> DistillRun:
    """Validates the config, prepares the workdir, loads pool / teacher logits / student and
    builds optimiser, jitted step, checkpointer and TensorBoard writer. ``task`` defaults to the
    registered task of the pool's ``meta["task"]``; ``teacher_score_fn`` (on-policy) to the
    task's teacher scorer on ``data.teacher_dir``."""
    from prada_jax import parallel
    from prada_jax.checkpointing import Checkpointer
    from prada_jax.metric_writer import MetricWriter

    validate_config(config)
    mesh = None
    if "mesh" in config:
        parallel.maybe_initialize_distributed(config.mesh)
        mesh = parallel.make_mesh(int(config.mesh.num_devices))
        try:
            parallel.check_divisible(int(config.train.batch_size), mesh,
                                     "config.train.batch_size")
        except ValueError as e:
            raise cu.ConfigError(str(e)) from e
    if not workdir:
        raise cu.ConfigError("--workdir is required")
    check = run_state.check_resume(config, workdir, observational_fields(config))   # no write
    paths = resolve_paths(config)
    pool = pool_lib.load_pool(paths["pool"])
    if task is None:
        task = tasks_lib.for_pool(pool.meta)
    vocab = int(pool.meta["tokenizer"]["vocab_size"])
    schedule = config.sampler.schedule
    adaptive = schedule in ADAPTIVE
    seeds = seeds_of(config)
    samplers = [TurnSampler(pool, kappa=config.sampler.kappa,
                            schedule="kappa" if adaptive else schedule,
                            ratio_min=config.sampler.ratio_min,
                            ratio_max=config.sampler.ratio_max) for _ in seeds]
    sampler = samplers[0]
    onpolicy = config.mode in ("onpolicy", "opd")
    problems = None
    if config.mode == "opd":
        if task.run_episodes is None or task.pool_problems is None or task.to_tokens is None:
            raise cu.ConfigError(f"config.mode=opd needs a task with an environment; task "
                                 f"{task.name!r} has none")
        problems = task.pool_problems(pool)
    table = None
    # offline losses and adaptive schedules need the exported logits; otherwise (on-policy)
    # they only feed the ratio diagnostic, when present
    if not onpolicy or adaptive or paths["logits"].is_dir():
        table = teacher_table.load(paths["logits"], pool)
    if onpolicy and teacher_score_fn is None:
        teacher_score_fn = task.teacher_scorer(paths["teacher"], config.loss.top_k)
    tx = make_optimizer(config.optim.lr, config.optim.warmup_steps, config.train.steps,
                        config.optim.weight_decay, config.optim.clip_norm,
                        config.optim.grad_accum)
    states = []
    for seed in seeds:   # N = 1: the seed is config.seed
        model, cfg = build_student(config, vocab, task, seed)
        if cfg.vocab_size < vocab:
            raise cu.ConfigError(f"config.student.init: vocabulary {cfg.vocab_size} is smaller "
                                 f"than the pool's tokenizer ({vocab})")
        graphdef, st = init_state(model, tx, jax.random.key(seed))
        states.append(st)
        del model
    state = states[0] if len(seeds) == 1 else stack_states(states)
    del states
    if config.optim.get("carry_from", ""):
        state = carry_optimizer_state(config, state)
    if gate_on(config) and table is None:
        raise cu.ConfigError("config.gate.every: the gate's per-turn gap needs the exported "
                             f"teacher logits ({paths['logits']} not found)")
    num_turns = max(sampler.max_turns, 1)
    if config.mode == "opd":   # student episodes may run longer than the teacher's
        num_turns = max(num_turns, int(task.max_turns))
    step_fn = make_train_step(graphdef, tx, "onpolicy" if onpolicy else "offline",
                              "rkl" if onpolicy else config.loss.kind,
                              temperature=config.loss.temperature, beta=config.loss.beta,
                              rkl_coef=config.loss.rkl_coef, fkl_coef=config.loss.fkl_coef,
                              num_turns=num_turns, num_seeds=len(seeds))
    # every input is loaded and checked: now the workdir may be written
    workdir = cu.prepare_workdir(workdir)
    ckpt = Checkpointer(workdir / "checkpoints", save_every=config.log.ckpt_every,
                        max_to_keep=config.log.keep)
    try:   # the checkpoint against the template before config.json / run.json are written
        restored = runloop.restore_or_init(ckpt, state)
    except BaseException:
        ckpt.close()
        raise
    if parallel.is_process_zero():
        run_state.commit(config, workdir, check)
    # one TensorBoard run per seed: <workdir>/tb (N = 1) or <workdir>/tb/seed_<s>
    writers = [MetricWriter(workdir / "tb") if len(seeds) == 1
               else MetricWriter(workdir / "tb" / f"seed_{s}") for s in seeds]
    if check.fresh:
        for w in writers:
            w.write_texts(0, {"config": cu.config_to_json(config)})
    seed_results = [{"mode": config.mode, "loss": config.loss.kind,
                     "kappa": None if adaptive else config.sampler.kappa,
                     "schedule": schedule, "seed": seed, "synthetic": True, "ratio": []}
                    for seed in seeds]
    return DistillRun(config=config, workdir=workdir, task=task, pool=pool, samplers=samplers,
                      table=table, teacher_score_fn=teacher_score_fn, graphdef=graphdef,
                      cfg=cfg, state=state, step_fn=step_fn, ckpt=ckpt, writers=writers,
                      mesh=mesh,
                      logp_fn=ratio_lib.token_logp_fn(graphdef) if table is not None else None,
                      num_turns=num_turns, seed_results=seed_results, seeds=seeds,
                      base_keys=[jax.random.key(s) for s in seeds],
                      turn_hist=np.zeros((len(seeds), num_turns)), problems=problems,
                      restored=restored)


def reset_schedule_counts(opt_state):
    """``opt_state`` with every learning-rate schedule's step count set to 0 (Adam's moments and
    its bias-correction count are kept)."""
    import optax
    is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)   # noqa: E731
    return jax.tree.map(lambda x: x._replace(count=jnp.zeros_like(x.count)) if is_sched(x)
                        else x, opt_state, is_leaf=is_sched)


def carry_optimizer_state(config, state):
    """``state`` with the optimiser state of the finished distillation workdir
    ``config.optim.carry_from`` (its final checkpoint): the warm start's AdamW moments continue
    and this run's learning-rate schedule starts over (:func:`reset_schedule_counts`).

    The warm start's final student must be ``config.student.init`` (its parameters are compared
    exactly) and its optimiser must have the same structure (same ``optim.grad_accum``, same
    number of seeds). Raises ConfigError (nothing written) otherwise."""
    from prada_jax.checkpointing import Checkpointer
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


def restore(run: DistillRun) -> None:
    """Restores the newest intact checkpoint (state, results so far, each sampler's schedule
    state, the host-side counters) if there is one, sets ``run.start``; otherwise evaluates the
    untrained students ("before", unless ``eval.before`` is False) and runs the first ratio
    diagnostic."""
    from prada_jax import parallel
    got = run.restored if run.restored is not None else runloop.restore_or_init(run.ckpt,
                                                                                 run.state)
    run.restored = None
    run.state, run.meta, step = got
    if run.meta:
        run.start = int(run.meta.get("opt_step", step))
        stored = run.meta.get("results", {})
        per = stored.get("per_seed") if run.stacked else [stored]
        for res, got in zip(run.seed_results, per or []):
            res.update(got)
        load_host_state(run, run.meta.get("host"))
    if run.mesh is not None:   # parameters / optimiser state replicated on every device
        run.state = parallel.replicate(run.state, run.mesh)
    if run.adaptive and run.start > 0 and "sampler" in run.meta:
        states = run.meta["sampler"] if run.stacked else [run.meta["sampler"]]
        for sampler, st in zip(run.samplers, states):
            sampler.load_schedule_state(st)   # the weights in force
    elif run.adaptive and run.start > 0:
        refresh_ratio(run, run.start, True)
    if run.start == 0:
        for i, res in enumerate(run.seed_results if run.config.eval.get("before", True) else ()):
            res["before"] = evaluate(run, run.params_of(i))
            if res["before"]:
                run.writers[i].write_scalars(0, {"eval/success_rate":
                                                 res["before"]["success_rate"]})
        if run.logp_fn is not None:
            refresh_ratio(run, 0, run.adaptive)


def refresh_ratio(run: DistillRun, step: int, update_weights: bool) -> None:
    """Ratio diagnostic of each seed's current student (``ratio/*`` curves,
    ``results["ratio"]``); for adaptive schedules (when ``update_weights``) hands each seed's
    sampler its new weights."""
    from prada_jax.checkpointing import first_non_finite
    config = run.config
    bad = first_non_finite(run.state.params)
    if bad is not None:
        raise NonFiniteTraining(f"non-finite student parameters ({bad}) at update {step}; "
                                f"stopping; {runloop.no_checkpoint_note(run.ckpt)}")
    for i, sampler in enumerate(run.samplers):
        diag = ratio_lib.diagnose_student(run.logp_fn, run.params_of(i), run.pool, run.table,
                                          config.sampler.kappa_min)
        scal = diag.scalars()
        rec = {"step": step, **{k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                                for k, v in diag.summary().items()}}
        if update_weights and run.schedule == "auto":
            # hold the configured κ while the gap is uninformative (from scratch: c̄ ≈ 20 nats)
            held = not diag.mean_gap <= float(config.sampler.get("auto_gap_max", float("inf")))
            sampler.use_kappa(config.sampler.kappa if held else diag.kappa_auto)
            rec["kappa_held"] = held
            scal["distill/kappa_held"] = float(held)
        elif update_weights and run.schedule == "exact-ratio":
            low = sampler.use_log_ratio(diag.log_ratio)
            scal["ratio/clipped_low_frac"] = rec["clipped_low_frac"] = low
        if run.schedule == "auto":   # exact-ratio has no single κ to report
            scal["distill/kappa"] = rec["kappa_used"] = sampler.kappa
        run.writers[i].write_scalars(step, scal)
        run.seed_results[i]["ratio"].append(rec)


def _prefix(run: DistillRun, k) -> list[int]:
    k, cache, pool = int(k), run.prompts_cache, run.pool
    if k not in cache:
        s = int(pool.turn_starts[k])
        a = max(int(pool.traj_offsets[run.sampler.pair_traj[k]]), s - run.sampler.P)
        cache[k] = np.asarray(pool.tokens[a:s]).tolist()
    return cache[k]


def bucket_width(longest: int, width: int, bucket: int) -> int:
    """Prompt width of a batch whose longest prefix has ``longest`` tokens: the next multiple
    of ``bucket`` (at least one bucket), at most the full ``width``; ``bucket`` = 0: ``width``."""
    if bucket <= 0:
        return int(width)
    return int(min(width, max(bucket, -(-int(longest) // bucket) * bucket)))


def bucketed(tb, bucket: int):
    """A :class:`~prada_jax.distill.sampler.TurnBatch` with its left-padded prompt cut to
    :func:`bucket_width` of its longest prefix (only padding columns are dropped: positions come
    from the mask, so the step computes the same numbers up to float reassociation)."""
    w = bucket_width(int(tb.prompt_mask.sum(1).max()), tb.prompt.shape[1], bucket)
    if w == tb.prompt.shape[1]:
        return tb
    return tb.replace(prompt=tb.prompt[:, -w:], prompt_mask=tb.prompt_mask[:, -w:])


def _widen(batch: dict, width: int) -> dict:
    """``batch`` with prompt / prompt_mask left-padded (zeros) to ``width`` columns."""
    p = batch["prompt"].shape[1]
    if p == width:
        return batch
    pad = ((0, 0), (width - p, 0))
    return dict(batch, prompt=np.pad(batch["prompt"], pad),
                prompt_mask=np.pad(batch["prompt_mask"], pad))


def opd_rows(config, task) -> int:
    """Static row count of an OPD batch: ``opd.episodes`` × the task's agent-turn cap."""
    return int(config.opd.episodes) * int(task.max_turns)


def _opd_batch(run: DistillRun, i: int, s: int) -> tuple[dict, int, opd_lib.RoundStats]:
    """Micro-step ``s``'s OPD batch of seed index ``i``: ``opd.episodes`` pool problems drawn
    with ``default_rng([seed, s])``, played by the student (sampling key
    ``fold_in(key(seed), s)``), scored by the teacher."""
    config, seed = run.config, run.seeds[i]
    rng = np.random.default_rng([seed, s])
    idx = rng.integers(0, len(run.problems), size=int(config.opd.episodes))
    gen = opd_lib.student_generate_fn(
        run.graphdef, run.params_of(i), jax.random.fold_in(run.base_keys[i], s),
        batch=int(config.opd.episodes), context_len=int(config.opd.context_len),
        max_new_tokens=config.onpolicy.max_new_tokens, temperature=config.onpolicy.temperature,
        top_p=config.onpolicy.top_p, stop_ids=run.task.stop_ids, pad_id=run.task.pad_id)
    batch, st, _ = opd_lib.opd_round(
        run.task, [run.problems[j] for j in idx], gen, run.teacher_score_fn,
        rows=opd_rows(config, run.task), context_len=int(config.opd.context_len),
        action_len=int(config.onpolicy.max_new_tokens),
        tool_delay_s=float(config.opd.tool_latency_s))
    has = batch["action_mask"].sum(-1) > 0
    run.turn_hist[i] += np.bincount(batch["turn"][has], minlength=run.num_turns)[:run.num_turns]
    return batch, st.student_tokens, st


def _seed_batch(run: DistillRun, i: int, s: int) -> tuple[dict, int, opd_lib.RoundStats]:
    """Micro-step ``s``'s batch of seed index ``i`` (what a separate run with
    ``config.seed = seeds[i]`` draws), its number of trained tokens and what it cost."""
    if run.opd:
        return _opd_batch(run, i, s)
    t0 = time.perf_counter()
    config, seed, sampler = run.config, run.seeds[i], run.samplers[i]
    rng = np.random.default_rng([seed, s])
    pairs = sampler.draw(rng, config.train.batch_size)
    tb = bucketed(sampler.batch(pairs), int(config.train.get("prompt_bucket", 0)))
    run.turn_hist[i] += np.bincount(tb.turn, minlength=run.num_turns)
    if run.onpolicy:
        prompts = [_prefix(run, k) for k in pairs]
        batch, n, st = onpolicy_round(
            run.graphdef, run.params_of(i), jax.random.fold_in(run.base_keys[i], s), tb,
            run.teacher_score_fn, max_new_tokens=config.onpolicy.max_new_tokens,
            temperature=config.onpolicy.temperature, top_p=config.onpolicy.top_p,
            stop_ids=run.task.stop_ids, pad_id=run.task.pad_id, prompt_tokens=prompts)
        return batch, n, st
    batch = dict(prompt=tb.prompt, prompt_mask=tb.prompt_mask, action=tb.action,
                 action_valid=(tb.action_pos >= 0).astype(np.int32),
                 action_mask=tb.action_mask, turn=tb.turn)
    g = run.table.gather(tb.action_pos)
    batch.update(topk_ids=g["topk_ids"], topk_logp=g["topk_logp"], tail_mass=g["tail_mass"])
    n = int(tb.action_mask.sum())
    st = opd_lib.RoundStats(supervised_turns=int(np.sum(tb.action_mask.sum(-1) > 0)),
                            rollout_s=time.perf_counter() - t0)
    return batch, n, st


def optimizer_step(run: DistillRun, opt_step: int) -> None:
    """One optimiser update (``optim.grad_accum`` micro-batches) of every seed's student: draw
    pairs, build the batch (teacher logits gathered offline; student samples scored by the
    teacher on-policy), run the jitted (seed-vmapped when N > 1) step; accumulates metrics, the
    sampled-turn histograms, tokens, env calls, time, and the update's cost record
    (:data:`opd.COUNTS` and :data:`opd.TIMES` summed over seeds and micro-steps)."""
    from prada_jax import parallel
    config = run.config
    compiled0 = _compilations(run)
    t0 = time.perf_counter()
    calls0 = run.task.tool_calls()
    ntok_step = 0
    cost = opd_lib.RoundStats()
    for micro in range(config.optim.grad_accum):
        s = opt_step * config.optim.grad_accum + micro
        got = [_seed_batch(run, i, s) for i in range(run.num_seeds)]
        ntok = sum(g[1] for g in got)
        mask = 0
        for g in got:
            for f in opd_lib.COUNTS + opd_lib.TIMES:
                setattr(cost, f, getattr(cost, f) + getattr(g[2], f))
            mask |= g[2].tool_turn_mask
        cost.tool_turn_mask |= mask
        cost.tool_rounds += bin(mask).count("1")   # one round per turn, across seeds
        if run.stacked:   # [N, B, ...]; bucketed prompts padded to the seeds' widest
            w = max(g[0]["prompt"].shape[1] for g in got)
            parts = [_widen(g[0], w) for g in got]
            batch = {k: np.stack([b[k] for b in parts]) for k in parts[0]}
        else:
            batch = got[0][0]
        if run.mesh is not None:   # sequences split over the ``batch`` mesh axis
            batch = (parallel.shard_axis(batch, run.mesh, 1) if run.stacked
                     else parallel.shard_batch(batch, run.mesh))
        tu = time.perf_counter()
        run.state, m = run.step_fn(run.state, batch)
        m = jax.device_get(m)
        cost.update_s += time.perf_counter() - tu
        for k, v in m.items():
            run.acc[k] = run.acc.get(k, 0.0) + np.asarray(v, np.float64)
        run.acc["n"] = run.acc.get("n", 0) + 1
        run.tokens_done += ntok
        ntok_step += ntok
    jax.block_until_ready(run.state.params)
    run.env_calls += run.task.tool_calls() - calls0
    dt = time.perf_counter() - t0
    # an update that compiled (the first of a process, and the second, whose parameters come
    # out of the step with another sharding annotation) is not timed
    timed = run.calls > 0 and _compilations(run) == compiled0
    if timed:
        run.update_times.append(dt)
        run.window.append((dt, ntok_step))
    run.costs.append(dict(cost.as_dict(), timed=timed))
    run.calls += 1


def _compilations(run: DistillRun) -> int:
    """Programs compiled so far by the jitted step and the student's generation."""
    from prada_jax.lm.sampling import _generate_jit
    return int(run.step_fn._cache_size()) + int(_generate_jit._cache_size())


def log_metrics(run: DistillRun, done: int) -> dict | list[dict]:
    """The ``distill/*`` scalars averaged since the last log (``distill/tokens_per_s`` — all
    seeds' tokens — and ``distill/update_s`` over the timed updates of the window, omitted when
    it has none); one dict, or one per seed when N > 1; resets the accumulators. The host loop
    checks them for finiteness before writing."""
    acc = run.acc
    n = acc.pop("n")
    timing = {}
    if run.window:
        secs = [w[0] for w in run.window]
        timing["distill/tokens_per_s"] = (sum(w[1] for w in run.window)
                                          / max(sum(secs), 1e-9))
        timing["distill/update_s"] = float(np.median(secs))
    timing.update(opd_lib.cost_scalars(run.costs[run.cost_logged:], run.costs))
    run.cost_logged = len(run.costs)
    out = []
    for i in range(run.num_seeds):
        a = {k: v[i] for k, v in acc.items()} if run.stacked else acc
        scal = {"distill/loss": a["loss"] / n, "distill/kl": a["kl"] / n,
                "distill/grad_norm": a["grad_norm"] / n, "distill/env_calls": run.env_calls}
        scal.update(timing)
        if "fkl" in a:
            scal["distill/fkl"] = a["fkl"] / n
        cnt, hist = a["kl_turn_count"], run.turn_hist[i]
        for t in range(run.num_turns):
            if cnt[t] > 0:
                scal[f"distill/kl_turn_{t}"] = a["kl_turn_sum"][t] / cnt[t]
            scal[f"distill/turn_frac_{t}"] = hist[t] / max(hist.sum(), 1)
        out.append(scal)
    run.acc, run.tokens_done, run.window = {}, 0, []
    return out if run.stacked else out[0]


def host_state(run: DistillRun) -> dict:
    """JSON-able host-side state that feeds curves and ``results.json`` (N > 1: the histogram
    and metric sums carry the leading seed axis)."""
    hist = run.turn_hist if run.stacked else run.turn_hist[0]
    return {"turn_hist": hist.tolist(), "env_calls": int(run.env_calls),
            "update_times": list(run.update_times), "tokens_done": int(run.tokens_done),
            "acc": {k: (int(v) if k == "n" else np.asarray(v).tolist())
                    for k, v in run.acc.items()},
            "costs": list(run.costs), "cost_logged": int(run.cost_logged)}


def load_host_state(run: DistillRun, h: dict | None) -> None:
    """Inverse of :func:`host_state` (checkpoints without it leave the fresh values)."""
    if not h:
        return
    run.turn_hist = np.asarray(h["turn_hist"], np.float64).reshape(run.num_seeds, -1)
    run.env_calls = int(h["env_calls"])
    run.update_times = [float(x) for x in h["update_times"]]
    run.tokens_done = int(h["tokens_done"])
    run.acc = {k: (int(v) if k == "n" else np.asarray(v, np.float64))
               for k, v in h["acc"].items()}
    run.costs = [dict(c) for c in h.get("costs", [])]   # absent in older checkpoints
    run.cost_logged = int(h.get("cost_logged", len(run.costs)))


def checkpoint_meta(run: DistillRun, done: int) -> dict:
    """The JSON meta stored with the checkpoint of update ``done`` (N > 1: results and
    sampler states as per-seed lists)."""
    kept = [{k: v for k, v in res.items() if k in ("before", "ratio", "curve", "gate")}
            for res in run.seed_results]
    meta = {"opt_step": done, "results": {"per_seed": kept} if run.stacked else kept[0],
            "host": host_state(run)}
    if run.adaptive:
        states = [s.schedule_state() for s in run.samplers]
        meta["sampler"] = states if run.stacked else states[0]
    return meta


def evaluate(run: DistillRun, params) -> dict:
    """Task success of one student (``params``: unstacked; the task's evaluator; {} without
    one or with ``eval.n_problems`` = 0)."""
    config = run.config
    if config.eval.n_problems == 0 or run.task.evaluate is None:
        return {}
    model = nnx.merge(run.graphdef, params)
    if config.train.compute_dtype == "bfloat16":
        model = _as_f32(model, run.cfg)
    return run.task.evaluate(model, config.eval.n_problems, config.eval.seed,
                             config.eval.batch_size)


def eval_point(run: DistillRun, done: int) -> None:
    """Task success of every seed's student after update ``done`` (``eval.every``):
    ``eval/success_rate`` curve points and ``results["curve"]`` records ``{step,
    success_rate}`` (the "before" and "after" evaluations are not repeated there)."""
    for i, res in enumerate(run.seed_results):
        got = evaluate(run, run.params_of(i))
        if got:
            run.writers[i].write_scalars(done, {"eval/success_rate": got["success_rate"]})
            res.setdefault("curve", []).append({"step": done,
                                                "success_rate": got["success_rate"]})


def check_gate(run: DistillRun, done: int) -> bool:
    """The gate after update ``done`` (N = 1): task success >= ``gate.success_min`` and the mean
    per-turn gap c̄ to the teacher on the pool <= ``gate.gap_max`` [nats per turn]. Records
    the check in ``results["gate"]["checks"]`` (and the ratio/eval curves); True when reached."""
    g, res = run.config.gate, run.results
    if not res["ratio"] or res["ratio"][-1]["step"] != done:
        refresh_ratio(run, done, False)
    gap = res["ratio"][-1].get("mean_gap")
    got = evaluate(run, run.params_of(0))
    run.writer.write_scalars(done, {"eval/success_rate": got["success_rate"]})
    res.setdefault("curve", []).append({"step": done, "success_rate": got["success_rate"]})
    ok = (got["success_rate"] >= float(g.success_min) and gap is not None
          and gap <= float(g.gap_max))
    gate = res.setdefault("gate", gate_record(run.config))
    gate["checks"].append({"step": done, "success_rate": got["success_rate"], "mean_gap": gap,
                           "reached": bool(ok)})
    if ok:
        gate.update(reached=True, step=done)
    return bool(ok)


def gate_record(config) -> dict:
    """The gate as fixed before training (thresholds, cadence) with no check yet."""
    g = config.gate
    return {"success_min": float(g.success_min), "gap_max": float(g.gap_max),
            "every": int(g.every), "budget_updates": int(config.train.steps),
            "reached": False, "step": None, "checks": []}


def seeds_summary(run: DistillRun) -> dict:
    """``results.json`` of a multi-seed run: ``per_seed`` (each the dict a separate run with
    that seed writes) and mean ± 95% CI over seeds of the task success before/after."""
    per = run.seed_results
    out = {"num_seeds": run.num_seeds, "seeds": list(run.seeds), "mode": run.config.mode,
           "loss": run.config.loss.kind, "schedule": run.schedule, "synthetic": True,
           "env_calls_during_training": int(run.env_calls),
           "update_s_median": per[0]["update_s_median"], "cost": per[0]["cost"]}
    for tag in ("before", "after"):
        vals = [r[tag]["success_rate"] for r in per if r.get(tag)]
        if vals:
            # mean ± 95% Student-t CI over seeds, None where undefined
            out[f"success_{tag}"] = stats.mean_ci([float(v) for v in vals]).to_json_dict()
    out["per_seed"] = per
    return out


def student_dir(run: DistillRun, i: int) -> Path:
    """Where seed index i's student is saved: ``student_hf`` (N = 1) or
    ``seed_<s>/student_hf``."""
    if not run.stacked:
        return run.workdir / "student_hf"
    return run.workdir / f"seed_{run.seeds[i]}" / "student_hf"


def finish(run: DistillRun) -> dict:
    """Final evaluation, the students as Hugging Face folders and ``results.json``."""
    from prada_jax import parallel
    config = run.config
    update_s = float(np.median(run.update_times)) if run.update_times else None
    for i, results in enumerate(run.seed_results):
        results["env_calls_during_training"] = int(run.env_calls)
        results["update_s_median"] = update_s
        results["cost"] = opd_lib.cost_summary(run.costs)
        if gate_on(config):
            results.setdefault("gate", gate_record(config))
        results["turn_histogram"] = run.turn_hist[i].tolist()
        if run.schedule == "auto":
            results["kappa"] = run.samplers[i].kappa   # the last estimate in force
        results["after"] = evaluate(run, run.params_of(i))
        end = (results.get("gate") or {}).get("step") or config.train.steps
        if results["after"]:
            run.writers[i].write_scalars(end,
                                         {"eval/success_rate": results["after"]["success_rate"]})
    for w in run.writers:
        w.flush()
    results = seeds_summary(run) if run.stacked else run.seed_results[0]
    if parallel.is_process_zero():
        for i in range(run.num_seeds):
            save_student(run.graphdef, run.params_of(i), run.cfg, student_dir(run, i), run.task)
        write_json(run.workdir / "results.json", results, indent=2, newline=False)
    return results


def stored_results(workdir: Path) -> dict | None:
    """``<workdir>/results.json`` of a finished run, or None (absent, unreadable, no "after" /
    "per_seed")."""
    try:
        res = json.loads((Path(workdir) / "results.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return res if isinstance(res, dict) and ("after" in res or "per_seed" in res) else None


def train_and_evaluate(config, workdir, teacher_score_fn: Callable | None = None,
                       task: tasks_lib.Task | None = None, max_steps: int | None = None
                       ) -> dict:
    """Runs (or resumes) a distillation job on the shared host loop (``prada_jax.runloop``);
    returns the results dict (also written to ``<workdir>/results.json``).

    On an existing workdir the config is checked against the stored one before anything is
    written (only :data:`OBSERVATIONAL` fields may change); the newest intact checkpoint is
    restored with all host-side state, and the run says it resumed. A finished workdir is not
    touched: the stored results are returned with ``"already_finished": True``. ``max_steps``
    stops after that many updates in this call (checkpointed; the returned dict then has
    ``"finished": False``); so does SIGINT/SIGTERM (``"stopped_by"``).

    Raises:
      BadInput subclasses (config, pool, logits, checkpoint, resume mismatch) before writing;
      errors.NonFiniteTraining when a metric, the parameters at a refresh or the state at a
        save is non-finite (the last good checkpoint stays, results.json is not written).
    """
    run = build(config, workdir, task, teacher_score_fn)
    steps = int(config.train.steps)
    try:
        restore(run)
        stored = stored_results(run.workdir)
        if stored is not None and (stored.get("gate") or {}).get("reached"):
            print(f"{run.workdir}: finished run (gate reached at update "
                  f"{stored['gate']['step']}); nothing to do", flush=True)
            return {**stored, "already_finished": True}
        if run.start >= steps:
            if stored is not None:
                print(f"{run.workdir}: finished run ({run.start} of {steps} updates); nothing "
                      "to do", flush=True)
                return {**stored, "already_finished": True}
        elif run.start > 0:
            print(f"resumed {run.workdir} at update {run.start} of {steps}", flush=True)
        if run.start < steps:
            res = _run_updates(run, steps, max_steps)
            run.state = res.state
            if res.stopped_by == "stop" and (run.results.get("gate") or {}).get("reached"):
                return finish(run)
            if not res.finished:
                return {"finished": False, "stopped_by": res.stopped_by, "opt_step": res.step}
        return finish(run)
    finally:
        run.ckpt.close()
        for w in run.writers:
            w.close()


def _run_updates(run: DistillRun, steps: int, max_steps: int | None):
    """The update loop: one :func:`optimizer_step` per call of the host loop's step function,
    then the ratio refresh on its cadence; curves every ``log.every`` updates; checkpoints
    (with :func:`checkpoint_meta`) every ``log.ckpt_every`` and at the end."""
    config = run.config
    refresh_every = int(config.sampler.refresh_every)
    eval_every = int(config.eval.get("every", 0))

    gate_every = int(config.gate.every) if gate_on(config) else 0
    gate_hit = [False]

    def step_fn(state, opt_step):
        run.state = state
        optimizer_step(run, opt_step)
        done = opt_step + 1
        if run.logp_fn is not None and (
                (refresh_every and done % refresh_every == 0) or done == steps):
            refresh_ratio(run, done, run.adaptive and done < steps)
        if eval_every and done % eval_every == 0 and done < steps:
            eval_point(run, done)
        if gate_every and done % gate_every == 0:
            gate_hit[0] = check_gate(run, done)
        return run.state, {}

    def scalars_fn(_, done, wall_s):
        if gate_hit[0] and done < steps:   # gate reached: log this window, then stop here
            for w, sc in zip(run.writers, _as_list(log_metrics(run, done))):
                w.write_scalars(done, sc)
            raise runloop.Stop
        if done % config.log.every == 0 or done == steps:
            return log_metrics(run, done)
        return None

    return runloop.run(
        run.state, step_fn, start=run.start, total=steps, max_calls=max_steps,
        writers=run.writers, ckpt=run.ckpt, scalars_fn=scalars_fn,
        writer_names=[f"seed {s}" for s in run.seeds],
        meta_fn=lambda st, done, sc: checkpoint_meta(run, done),
        progress=bool(config.log.progress), desc=f"distill[{config.mode}/{config.loss.kind}]",
        unit="upd", step_name="updates",
        postfix_fn=lambda sc: {"loss": f"{sc[0]['distill/loss']:.4f}",
                               "kl": f"{sc[0]['distill/kl']:.4f}"})


def _as_list(x) -> list:
    return x if isinstance(x, list) else [x]


def save_student(graphdef, params, cfg, out_dir: Path, task: tasks_lib.Task | None = None
                 ) -> Path:
    """Saves the student as a Hugging Face folder (float32 safetensors + config + the task's
    tokenizer when the task has one)."""
    from prada_jax.lm.hf import save_hf
    model = nnx.merge(graphdef, params)
    save_hf(model, cfg, out_dir, arch=cfg.arch)
    if task is not None and task.build_tokenizer is not None:
        try:
            task.build_tokenizer().save_pretrained(out_dir)
        except Exception as e:  # noqa: BLE001 - the tokenizer is a convenience, weights suffice
            print(f"note: tokenizer not saved next to the student ({e})")
    return out_dir
