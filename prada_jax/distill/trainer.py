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
counter, teacher scorer, evaluator) comes from a :class:`prada_jax.distill.task_registry.Task`, passed
in or looked up by the pool's ``task`` name. The shape is every trainer's:
:func:`build_setup` validates the config once, loads pool / teacher logits / task and builds
the student, optimiser and jitted step, writing nothing; :func:`train_and_evaluate` opens the
workdir (:func:`open_run`), restores, and runs the host loop (``prada_jax.runloop``) of
:func:`optimizer_step` (its batches from :mod:`prada_jax.distill.batches`, the student from
:mod:`prada_jax.distill.student`), :func:`log_metrics`, :func:`refresh_ratio`, checkpoints,
and finally :func:`evaluate` and :func:`finish`. What the curves and ``results.json`` count
between checkpoints is one small :class:`HostState` tuple stored in every checkpoint.
:func:`start_run` gives a run of a Setup with no workdir (a benchmark times one step with it).

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
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from flax import nnx

from prada_jax import config_utils as cu
from prada_jax import parallel, run_state, runloop, stats
from prada_jax.checkpointing import Checkpointer, first_non_finite
from prada_jax.errors import NonFiniteTraining
from prada_jax.jsonio import write_json
from prada_jax.lm.sampling import _generate_jit
from prada_jax.metric_writer import MetricWriter
from prada_jax.distill import opd as opd_lib
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import ratio as ratio_lib
from prada_jax.distill import task_registry as tasks_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.batches import (Drawn, bucket_width, bucketed, draw, opd_rows,  # noqa: F401
                                       stack_seeds)
from prada_jax.distill.learner import (RKL_ESTIMATORS, make_optimizer, make_train_step,
                                       seed_slice)
from prada_jax.distill.sampler import SCHEDULES, TurnSampler, check_kappa
# re-exported: ``from prada_jax.distill.trainer import <name>`` keeps working for these
from prada_jax.distill.student import (as_f32 as _as_f32, build_student,  # noqa: F401
                                       carry_optimizer_state, init_dir, init_students,
                                       reset_schedule_counts, save_student, seeds_of,
                                       stored_results)


# Adaptive turn weightings (prada_jax/distill/ratio/), re-estimated from the current student
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


# ----------------------------------------------------------------------------- config

def gate_on(config) -> bool:
    """Whether the run stops at a gate (``config.gate.every`` > 0)."""
    return "gate" in config and int(config.gate.every) > 0


def observational_fields(config) -> tuple[str, ...]:
    """Fields that may differ from a resumed workdir's stored config: :data:`OBSERVATIONAL`,
    ``optim.carry_from`` (it acts when a run starts), and fields that do not act in this run
    (``opd.*`` outside OPD mode, ``gate.*`` without a gate, ``train.prompt_bucket`` = 0), so
    workdirs written before those fields existed still resume."""
    extra = ["optim.carry_from"]
    if not int(config.train.prompt_bucket):
        extra.append("train.prompt_bucket")
    if config.mode != "opd":
        extra.append("opd.*")
    if not gate_on(config):
        extra.append("gate.*")
    return OBSERVATIONAL + tuple(extra)


def resolve_paths(config) -> dict[str, Path]:
    """The pool, teacher-logits and teacher folders (``config.data.*_dir`` or under
    ``config.data.cache``)."""
    cache = Path(config.data.cache)
    return {"pool": Path(config.data.pool_dir or cache / "pool"),
            "logits": Path(config.data.logits_dir or cache / "logits"),
            "teacher": Path(config.data.teacher_dir or cache / "teacher")}


def validate_config(config) -> None:
    """Checks every field once; errors name the field (``config.sampler.kappa ...``)."""
    cu.check_choice(config, "mode", MODES)
    cu.check_choice(config, "loss.kind", ("fkl", "jsd", "sft", "rkl"))
    cu.check_choice(config, "loss.rkl_estimator", RKL_ESTIMATORS)
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
    cu.check(float(config.sampler.auto_gap_max) > 0.0,
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
    cu.check_int(config, "train.prompt_bucket", minimum=0)
    cu.check_int(config, "eval.every", minimum=0)
    cu.check(isinstance(config.eval.before, bool), "eval.before",
             f"must be true or false, got {config.eval.before!r}")
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
        cu.check(int(config.train.num_seeds) == 1, "gate.every",
                 "a gate needs config.train.num_seeds = 1 (one student per gated run)")
        cu.check(int(config.eval.n_problems) > 0, "gate.every",
                 "a gate needs task success: config.eval.n_problems > 0")
    if "mesh" in config:
        try:
            parallel.validate_mesh_config(config.mesh)
        except ValueError as e:
            raise cu.ConfigError(str(e)) from e


# ----------------------------------------------------------------------------- setup

class Setup(NamedTuple):
    """Everything a distillation job derives from its config and inputs (no run state, nothing
    written): :func:`build_setup`'s result."""

    config: Any
    task: tasks_lib.Task
    pool: Any
    table: Any                      # TeacherTable or None (on-policy without exported logits)
    teacher_score_fn: Callable | None
    graphdef: Any
    cfg: Any                        # LMConfig of the student
    init_state: Any                 # fresh TrainState ([N, ...] stacked if N > 1)
    step_fn: Callable               # jitted (seed-vmapped when N > 1) train step
    mesh: Any
    logp_fn: Callable | None        # student token log-probs for the ratio diagnostic
    num_turns: int
    seeds: tuple
    problems: Any = None            # OPD: the task problems of the pool's trajectories

    @property
    def schedule(self) -> str:
        return self.config.sampler.schedule

    @property
    def adaptive(self) -> bool:
        return self.schedule in ADAPTIVE

    def new_samplers(self) -> list[TurnSampler]:
        """One :class:`TurnSampler` per seed with the configured weights (each owns its
        schedule state, which adaptive schedules change during a run)."""
        c = self.config.sampler
        return [TurnSampler(self.pool, kappa=c.kappa,
                            schedule="kappa" if self.adaptive else c.schedule,
                            ratio_min=c.ratio_min, ratio_max=c.ratio_max) for _ in self.seeds]


def build_setup(config, task: tasks_lib.Task | None = None,
                teacher_score_fn: Callable | None = None) -> Setup:
    """Validates the config once, loads the pool and (where needed) the teacher logits, and
    builds the students, optimiser and jitted step; writes nothing.

    ``task`` defaults to the registered task of the pool's ``meta["task"]``;
    ``teacher_score_fn`` (on-policy) to the task's teacher scorer on ``data.teacher_dir``.
    Raises BadInput subclasses (config, pool, logits, ``optim.carry_from``)."""
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
    paths = resolve_paths(config)
    pool = pool_lib.load_pool(paths["pool"])
    if task is None:
        task = tasks_lib.for_pool(pool.meta)
    vocab = int(pool.meta["tokenizer"]["vocab_size"])
    adaptive = config.sampler.schedule in ADAPTIVE
    seeds = tuple(seeds_of(config))
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
    if onpolicy and config.loss.rkl_estimator == "exact" and config.loss.top_k < vocab:
        raise cu.ConfigError(f"config.loss.top_k={config.loss.top_k}: the exact reverse KL "
                             f"(loss.rkl_estimator=exact) needs the teacher's whole "
                             f"distribution, top_k >= the vocabulary ({vocab})")
    if onpolicy and teacher_score_fn is None:
        teacher_score_fn = task.teacher_scorer(paths["teacher"], config.loss.top_k)
    tx = make_optimizer(config.optim.lr, config.optim.warmup_steps, config.train.steps,
                        config.optim.weight_decay, config.optim.clip_norm,
                        config.optim.grad_accum)
    graphdef, cfg, state = init_students(config, vocab, task, tx, list(seeds))
    if config.optim.carry_from:
        state = carry_optimizer_state(config, state)
    if gate_on(config) and table is None:
        raise cu.ConfigError("config.gate.every: the gate's per-turn gap needs the exported "
                             f"teacher logits ({paths['logits']} not found)")
    num_turns = max(int(pool.turns_per_trajectory().max()), 1)   # the samplers' max_turns
    if config.mode == "opd":   # student episodes may run longer than the teacher's
        num_turns = max(num_turns, int(task.max_turns))
    step_fn = make_train_step(graphdef, tx, "onpolicy" if onpolicy else "offline",
                              "rkl" if onpolicy else config.loss.kind,
                              temperature=config.loss.temperature, beta=config.loss.beta,
                              rkl_coef=config.loss.rkl_coef, fkl_coef=config.loss.fkl_coef,
                              num_turns=num_turns, num_seeds=len(seeds),
                              rkl_estimator=str(config.loss.rkl_estimator))
    return Setup(config=config, task=task, pool=pool, table=table,
                 teacher_score_fn=teacher_score_fn, graphdef=graphdef, cfg=cfg,
                 init_state=state, step_fn=step_fn, mesh=mesh,
                 logp_fn=ratio_lib.token_logp_fn(graphdef) if table is not None else None,
                 num_turns=num_turns, seeds=seeds, problems=problems)


# ----------------------------------------------------------------------------- run state

class HostState(NamedTuple):
    """Host-side state that feeds curves and ``results.json``, stored in every checkpoint
    (:meth:`to_json`), so a resumed run's curves and results equal an uninterrupted run's.
    Updated by replacement (``_replace``), never in place."""

    turn_hist: np.ndarray           # [N, num_turns] sampled-turn histogram per seed (rows)
    env_calls: int = 0              # the task's tool calls during training
    update_times: tuple = ()        # [s] per timed update (no compile)
    tokens_done: int = 0            # tokens since the last log (all seeds)
    acc: dict = {}                  # metric sums since the last log ([N, ...] when N > 1)
    costs: tuple = ()               # per-update cost records (opd.RoundStats fields + timed)
    cost_logged: int = 0            # costs[:cost_logged] are in the curves already

    @classmethod
    def fresh(cls, num_seeds: int, num_turns: int) -> "HostState":
        return cls(turn_hist=np.zeros((num_seeds, num_turns)), acc={})

    def to_json(self, stacked: bool) -> dict:
        """JSON-able form (N > 1: the histogram and metric sums carry the seed axis)."""
        hist = self.turn_hist if stacked else self.turn_hist[0]
        return {"turn_hist": hist.tolist(), "env_calls": int(self.env_calls),
                "update_times": list(self.update_times), "tokens_done": int(self.tokens_done),
                "acc": {k: (int(v) if k == "n" else np.asarray(v).tolist())
                        for k, v in self.acc.items()},
                "costs": list(self.costs), "cost_logged": int(self.cost_logged)}

    @classmethod
    def from_json(cls, h: dict, num_seeds: int) -> "HostState":
        """Inverse of :meth:`to_json`."""
        costs = tuple(dict(c) for c in h.get("costs", []))   # absent in older checkpoints
        return cls(turn_hist=np.asarray(h["turn_hist"], np.float64).reshape(num_seeds, -1),
                   env_calls=int(h["env_calls"]),
                   update_times=tuple(float(x) for x in h["update_times"]),
                   tokens_done=int(h["tokens_done"]),
                   acc={k: (int(v) if k == "n" else np.asarray(v, np.float64))
                        for k, v in h["acc"].items()},
                   costs=costs, cost_logged=int(h.get("cost_logged", len(costs))))


@dataclasses.dataclass
class Run:
    """One process's distillation job: its :class:`Setup`, the train state, the checkpointed
    :class:`HostState` and results so far, the per-seed samplers, and (with a workdir) its
    checkpointer and curve writers. Attributes of the Setup and HostState read through."""

    setup: Setup
    state: Any                      # TrainState; [N, ...] stacked if N > 1
    host: HostState
    samplers: list                  # one TurnSampler per seed (each owns its schedule state)
    seed_results: list              # one results dict per seed
    workdir: Path | None = None
    ckpt: Any = None
    writers: list = dataclasses.field(default_factory=list)   # one MetricWriter per seed
    start: int = 0
    meta: dict = dataclasses.field(default_factory=dict)
    # ``runloop.restore_or_init``'s ``(state, meta, step)``, done by :func:`open_run` before it
    # writes config.json (a template mismatch is refused first); consumed by :func:`restore`
    restored: Any = None
    prompts_cache: dict = dataclasses.field(default_factory=dict)
    # timing of this process only (not checkpointed): (seconds, tokens) of timed updates since
    # the last log; the first update of a process compiles and is not timed
    window: list = dataclasses.field(default_factory=list)
    calls: int = 0

    def __getattr__(self, name):   # config, task, pool, graphdef, ..., costs, update_times
        if name in Setup._fields:
            return getattr(self.setup, name)
        if name in HostState._fields:
            return getattr(self.host, name)
        raise AttributeError(name)

    @property
    def num_seeds(self) -> int:
        return len(self.setup.seeds)

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
        return self.setup.schedule

    @property
    def adaptive(self) -> bool:
        return self.setup.adaptive

    @property
    def onpolicy(self) -> bool:
        """ReOPD (replayed prefix): the student samples turn t after the teacher's prefix."""
        return self.config.mode == "onpolicy"

    @property
    def opd(self) -> bool:
        """Online OPD: the student plays whole episodes with the tool."""
        return self.config.mode == "opd"


DistillRun = Run   # the name before the trainer was split (issue 34)


def _copy_state(state):
    """A fresh copy of a train state (the jitted step donates its input, and a Setup's initial
    state must stay usable for the next run)."""
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)


def start_run(setup: Setup) -> Run:
    """A fresh in-memory run of ``setup`` (no workdir, checkpoint or curves): what a benchmark
    or test steps with :func:`optimizer_step` to time or check one update."""
    config = setup.config
    seed_results = [{"mode": config.mode, "loss": config.loss.kind,
                     "kappa": None if setup.adaptive else config.sampler.kappa,
                     "schedule": setup.schedule, "seed": seed, "synthetic": True, "ratio": []}
                    for seed in setup.seeds]
    return Run(setup=setup, state=_copy_state(setup.init_state),
               host=HostState.fresh(len(setup.seeds), setup.num_turns),
               samplers=setup.new_samplers(), seed_results=seed_results)


def check_stored_run(config, workdir) -> run_state.ResumeCheck:
    """The resume contract with ``workdir``'s stored run (config fields, an intact checkpoint
    if it has any); writes nothing. :func:`open_run` checks it; ``train.distill`` checks it
    first too, so a refused resume is reported before the inputs are loaded."""
    if not workdir:
        raise cu.ConfigError("--workdir is required")
    return run_state.check_resume(config, workdir, observational_fields(config))


def open_run(setup: Setup, workdir) -> Run:
    """:func:`start_run` with a workdir: checks the resume contract (:func:`check_stored_run`;
    nothing written if it fails), restores the newest checkpoint against the template, then
    writes ``config.json`` / ``run.json`` and opens one TensorBoard writer per seed."""
    config = setup.config
    check = check_stored_run(config, workdir)
    run = start_run(setup)
    workdir = cu.prepare_workdir(workdir)
    ckpt = Checkpointer(workdir / "checkpoints", save_every=config.log.ckpt_every,
                        max_to_keep=config.log.keep)
    try:   # the checkpoint against the template before config.json / run.json are written
        restored = runloop.restore_or_init(ckpt, run.state)
    except BaseException:
        ckpt.close()
        raise
    if parallel.is_process_zero():
        run_state.commit(config, workdir, check)
    # one TensorBoard run per seed: <workdir>/tb (N = 1) or <workdir>/tb/seed_<s>
    writers = [MetricWriter(workdir / "tb") if len(setup.seeds) == 1
               else MetricWriter(workdir / "tb" / f"seed_{s}") for s in setup.seeds]
    if check.fresh:
        for w in writers:
            w.write_texts(0, {"config": cu.config_to_json(config)})
    return dataclasses.replace(run, workdir=workdir, ckpt=ckpt, writers=writers,
                               restored=restored)


def build(config, workdir, task: tasks_lib.Task | None = None,
          teacher_score_fn: Callable | None = None, setup: Setup | None = None) -> Run:
    """:func:`build_setup` (unless ``setup`` is given) then :func:`open_run` on ``workdir``."""
    if setup is None:
        setup = build_setup(config, task, teacher_score_fn)
    return open_run(setup, workdir)


def close(run: Run) -> None:
    """Closes the run's checkpointer and curve writers."""
    if run.ckpt is not None:
        run.ckpt.close()
    for w in run.writers:
        w.close()


def restore(run: Run) -> None:
    """Restores the newest intact checkpoint (state, results so far, each sampler's schedule
    state, the host state) if there is one, sets ``run.start``; otherwise evaluates the
    untrained students ("before", unless ``eval.before`` is False) and runs the first ratio
    diagnostic."""
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
        if run.meta.get("host"):   # checkpoints without it leave the fresh values
            run.host = HostState.from_json(run.meta["host"], run.num_seeds)
    if run.mesh is not None:   # parameters / optimiser state replicated on every device
        run.state = parallel.replicate(run.state, run.mesh)
    if run.adaptive and run.start > 0 and "sampler" in run.meta:
        states = run.meta["sampler"] if run.stacked else [run.meta["sampler"]]
        for sampler, st in zip(run.samplers, states):
            sampler.load_schedule_state(st)   # the weights in force
    elif run.adaptive and run.start > 0:
        refresh_ratio(run, run.start, True)
    if run.start == 0:
        for i, res in enumerate(run.seed_results if run.config.eval.before else ()):
            res["before"] = evaluate(run, run.params_of(i))
            if res["before"]:
                run.writers[i].write_scalars(0, {"eval/success_rate":
                                                 res["before"]["success_rate"]})
        if run.logp_fn is not None:
            refresh_ratio(run, 0, run.adaptive)


# ----------------------------------------------------------------------------- one update

def refresh_ratio(run: Run, step: int, update_weights: bool) -> None:
    """Ratio diagnostic of each seed's current student (``ratio/*`` curves,
    ``results["ratio"]``); for adaptive schedules (when ``update_weights``) hands each seed's
    sampler its new weights."""
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
            held = not diag.mean_gap <= float(config.sampler.auto_gap_max)
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


def _compilations(run: Run) -> int:
    """Programs compiled so far by the jitted step and the student's generation."""
    return int(run.step_fn._cache_size()) + int(_generate_jit._cache_size())


def optimizer_step(run: Run, opt_step: int) -> None:
    """One optimiser update (``optim.grad_accum`` micro-batches) of every seed's student: draw
    each seed's batch (:func:`prada_jax.distill.batches.draw`), run the jitted (seed-vmapped
    when N > 1) step; sets ``run.state`` and ``run.host`` with the metrics, sampled-turn
    histograms, tokens, env calls, time, and the update's cost record (:data:`opd.COUNTS` and
    :data:`opd.TIMES` summed over seeds and micro-steps)."""
    config, host = run.config, run.host
    hist, acc, tokens_done = host.turn_hist.copy(), dict(host.acc), host.tokens_done
    compiled0 = _compilations(run)
    t0 = time.perf_counter()
    calls0 = run.task.tool_calls()
    ntok_step = 0
    cost = opd_lib.RoundStats()
    # N > 1 seeds: the seeds' rollouts run one after another on the host, but their tool calls
    # of one turn round are concurrent (the count ``tool_rounds`` prices): each seed's rollout
    # waits for nothing and the update waits once per merged round below
    merged_wait = float(config.opd.tool_latency_s) if run.opd and run.stacked else 0.0
    for micro in range(config.optim.grad_accum):
        s = opt_step * config.optim.grad_accum + micro
        got: list[Drawn] = []
        for i, seed in enumerate(run.seeds):
            # the student's parameters only where it samples (offline rows need none)
            params = None if config.mode == "offline" else run.params_of(i)
            d = draw(run.setup, run.samplers[i], params, seed, s, run.prompts_cache,
                     tool_delay_s=0.0 if merged_wait else None)
            hist[i] += d.turn_counts
            got.append(d)
        ntok = sum(d.tokens for d in got)
        mask = 0
        for d in got:
            for f in opd_lib.COUNTS + opd_lib.TIMES:
                setattr(cost, f, getattr(cost, f) + getattr(d.stats, f))
            mask |= d.stats.tool_turn_mask
        cost.tool_turn_mask |= mask
        cost.tool_rounds += bin(mask).count("1")   # one round per turn, across seeds
        if merged_wait and mask:
            tw = time.perf_counter()
            time.sleep(merged_wait * bin(mask).count("1"))   # one wait per merged round
            cost.rollout_s += time.perf_counter() - tw
        batch = stack_seeds([d.batch for d in got]) if run.stacked else got[0].batch
        if run.mesh is not None:   # sequences split over the ``batch`` mesh axis
            batch = (parallel.shard_axis(batch, run.mesh, 1) if run.stacked
                     else parallel.shard_batch(batch, run.mesh))
        tu = time.perf_counter()
        run.state, m = run.step_fn(run.state, batch)
        m = jax.device_get(m)
        cost.update_s += time.perf_counter() - tu
        for k, v in m.items():
            acc[k] = acc.get(k, 0.0) + np.asarray(v, np.float64)
        acc["n"] = acc.get("n", 0) + 1
        tokens_done += ntok
        ntok_step += ntok
    jax.block_until_ready(run.state.params)
    env_calls = host.env_calls + run.task.tool_calls() - calls0
    dt = time.perf_counter() - t0
    # an update that compiled (the first of a process, and the second, whose parameters come
    # out of the step with another sharding annotation) is not timed
    timed = run.calls > 0 and _compilations(run) == compiled0
    if timed:
        run.window.append((dt, ntok_step))
    run.host = host._replace(
        turn_hist=hist, acc=acc, tokens_done=tokens_done, env_calls=env_calls,
        update_times=host.update_times + ((dt,) if timed else ()),
        costs=host.costs + (dict(cost.as_dict(), timed=timed),))
    run.calls += 1


def log_metrics(run: Run, done: int) -> dict | list[dict]:
    """The ``distill/*`` scalars averaged since the last log (``distill/tokens_per_s`` — all
    seeds' tokens — and ``distill/update_s`` over the timed updates of the window, omitted when
    it has none); one dict, or one per seed when N > 1; resets the accumulators. The host loop
    checks them for finiteness before writing."""
    host = run.host
    acc = dict(host.acc)
    n = acc.pop("n")
    timing = {}
    if run.window:
        secs = [w[0] for w in run.window]
        timing["distill/tokens_per_s"] = (sum(w[1] for w in run.window)
                                          / max(sum(secs), 1e-9))
        timing["distill/update_s"] = float(np.median(secs))
    timing.update(opd_lib.cost_scalars(list(host.costs[host.cost_logged:]), list(host.costs)))
    out = []
    for i in range(run.num_seeds):
        a = {k: v[i] for k, v in acc.items()} if run.stacked else acc
        scal = {"distill/loss": a["loss"] / n, "distill/kl": a["kl"] / n,
                "distill/grad_norm": a["grad_norm"] / n, "distill/env_calls": host.env_calls}
        scal.update(timing)
        if "fkl" in a:
            scal["distill/fkl"] = a["fkl"] / n
        cnt, hist = a["kl_turn_count"], host.turn_hist[i]
        for t in range(run.num_turns):
            if cnt[t] > 0:
                scal[f"distill/kl_turn_{t}"] = a["kl_turn_sum"][t] / cnt[t]
            scal[f"distill/turn_frac_{t}"] = hist[t] / max(hist.sum(), 1)
        out.append(scal)
    run.host = host._replace(acc={}, tokens_done=0, cost_logged=len(host.costs))
    run.window = []
    return out if run.stacked else out[0]


def host_state(run: Run) -> dict:
    """JSON-able host state of the run (:meth:`HostState.to_json`)."""
    return run.host.to_json(run.stacked)


def load_host_state(run: Run, h: dict | None) -> None:
    """Inverse of :func:`host_state` (checkpoints without it leave the fresh values)."""
    if h:
        run.host = HostState.from_json(h, run.num_seeds)


def checkpoint_meta(run: Run, done: int) -> dict:
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


# ----------------------------------------------------------------------------- evaluation

def evaluate(run: Run, params) -> dict:
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


def eval_point(run: Run, done: int) -> None:
    """Task success of every seed's student after update ``done`` (``eval.every``):
    ``eval/success_rate`` curve points and ``results["curve"]`` records ``{step,
    success_rate}`` (the "before" and "after" evaluations are not repeated there)."""
    for i, res in enumerate(run.seed_results):
        got = evaluate(run, run.params_of(i))
        if got:
            run.writers[i].write_scalars(done, {"eval/success_rate": got["success_rate"]})
            res.setdefault("curve", []).append({"step": done,
                                                "success_rate": got["success_rate"]})


def check_gate(run: Run, done: int) -> bool:
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


def seeds_summary(run: Run) -> dict:
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


def student_dir(run: Run, i: int) -> Path:
    """Where seed index i's student is saved: ``student_hf`` (N = 1) or
    ``seed_<s>/student_hf``."""
    if not run.stacked:
        return run.workdir / "student_hf"
    return run.workdir / f"seed_{run.seeds[i]}" / "student_hf"


def updates_done(run: Run) -> int:
    """Optimiser updates the current state has taken (its micro-step counter over
    ``optim.grad_accum``; N > 1: the seeds' counters are equal)."""
    step = np.asarray(jax.device_get(run.state.step)).reshape(-1)
    return int(step[0]) // int(run.config.optim.grad_accum)


def finish(run: Run) -> dict:
    """Final evaluation, the students as Hugging Face folders and ``results.json``."""
    config = run.config
    update_s = float(np.median(run.update_times)) if run.update_times else None
    for i, results in enumerate(run.seed_results):
        results["env_calls_during_training"] = int(run.env_calls)
        results["update_s_median"] = update_s
        results["cost"] = opd_lib.cost_summary(list(run.costs))
        if gate_on(config):
            results.setdefault("gate", gate_record(config))
        results["turn_histogram"] = run.turn_hist[i].tolist()
        if run.schedule == "auto":
            results["kappa"] = run.samplers[i].kappa   # the last estimate in force
        results["after"] = evaluate(run, run.params_of(i))
        # the final evaluation is labelled with the update of the model it evaluated (a run
        # finished early, e.g. at a plateau or a gate, is not at ``train.steps``)
        end = updates_done(run)
        results["after_step"] = end
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


# ----------------------------------------------------------------------------- host loop

def train_and_evaluate(config, workdir, setup: Setup | None = None, *,
                       teacher_score_fn: Callable | None = None,
                       task: tasks_lib.Task | None = None, max_steps: int | None = None
                       ) -> dict:
    """Runs (or resumes) a distillation job on the shared host loop (``prada_jax.runloop``);
    returns the results dict (also written to ``<workdir>/results.json``).

    ``setup``: :func:`build_setup`'s result for ``config`` (a launcher builds it once to
    report bad input before anything is written); built here when None (``task`` and
    ``teacher_score_fn`` then go to :func:`build_setup`).

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
    if setup is None:
        setup = build_setup(config, task, teacher_score_fn)
    run = open_run(setup, workdir)
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
        close(run)


def _run_updates(run: Run, steps: int, max_steps: int | None):
    """The update loop: one :func:`optimizer_step` per call of the host loop's step function,
    then the ratio refresh on its cadence; curves every ``log.every`` updates; checkpoints
    (with :func:`checkpoint_meta`) every ``log.ckpt_every`` and at the end."""
    config = run.config
    refresh_every = int(config.sampler.refresh_every)
    eval_every = int(config.eval.every)

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
