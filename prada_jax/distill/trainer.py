"""The distillation trainer: :func:`build_setup` and the host loop :func:`train_and_evaluate`.

Every trainer's shape (``prada_jax/rl/trainer.py``): :func:`build_setup` validates the config
once (:mod:`prada_jax.distill.validation`), loads the pool, the exported teacher logits where
needed and the task (:mod:`prada_jax.distill.task_registry`: the trainer knows no task), and
builds the students, optimiser and jitted step into a frozen :class:`Setup`, writing nothing.
:func:`train_and_evaluate` opens the workdir (:func:`open_workdir`: the resume contract, then
the checkpoint, then ``config.json`` / ``run.json``), continues or starts the run
(:func:`restore_state`; a fresh run evaluates the untrained students, "before"), and runs
``config.train.steps`` updates on the shared host loop (``prada_jax.runloop``): each one
:func:`prada_jax.distill.host_update.optimizer_update` (``optim.grad_accum`` micro-steps),
then the ratio diagnostic, evaluations and gate on their cadences
(:mod:`prada_jax.distill.evaluation`); curves in ``<workdir>/tb`` (``distill/*``,
``cost/*``, ``ratio/*``, ``eval/*``), orbax checkpoints every ``log.ckpt_every`` updates. The
end (:func:`prada_jax.distill.results.finish`): the final evaluation, the students as Hugging
Face folders and ``results.json``.

The loop threads the train state (orbax's checkpoint) and a
:class:`~prada_jax.distill.host_state.HostState` (the checkpoint's meta); the per-seed samplers
and results (:class:`~prada_jax.distill.host_state.SeedRecords`) and the open files
(:class:`~prada_jax.distill.host_state.RunFiles`) are passed explicitly. Timing studies,
benchmarks and tests step a run update by update themselves with
:mod:`prada_jax.distill.stepping` (the same functions, threaded by the caller).

Determinism: the batch of micro-step s is drawn with ``np.random.default_rng([seed, s])`` and
sampled with ``fold_in(key(seed), s)`` (:mod:`prada_jax.distill.batches`), so a resumed run
continues the same sequence. Seeds as a batch axis (``train.num_seeds = N`` > 1): N students
with seeds ``config.seed + i`` in one jitted, ``vmap``-ped step, each drawing what a separate
run with its seed draws (curves in ``tb/seed_<s>``; :mod:`prada_jax.distill.results`). Modes
(``config.mode``): ``offline`` (teacher tokens), ``onpolicy`` (ReOPD: the student samples turn
t after the replayed teacher prefix), ``opd`` (online OPD, :mod:`prada_jax.distill.opd`: whole
student episodes with the task's tool; the only mode whose ``distill/env_calls`` is not 0).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax

from prada_jax import config_utils as cu
from prada_jax import parallel, run_state, runloop
from prada_jax.checkpointing import Checkpointer
from prada_jax.metric_writer import MetricWriter
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import ratio as ratio_lib
from prada_jax.distill import results as results_lib
from prada_jax.distill import task_registry as tasks_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.evaluation import check_gate, eval_point, evaluate, gate_on, refresh_ratio
from prada_jax.distill.host_state import HostState, RunFiles, SeedRecords, log_scalars
from prada_jax.distill.host_update import optimizer_update
from prada_jax.distill.learner import make_optimizer, make_train_step, seed_slice
from prada_jax.distill.sampler import TurnSampler
from prada_jax.distill.student import (carry_optimizer_state, init_students, seeds_of,
                                       stored_results)
from prada_jax.distill.validation import ADAPTIVE, validate_config


# Config fields that may change when a workdir is resumed (they extend or observe the run;
# ``prada_jax.run_state``): the total number of updates and the logging / checkpoint cadence.
# Note: the learning-rate schedule is laid out over ``train.steps``, so extending a run changes
# the schedule from the resumed update on (it does not equal a run started with the new total).
OBSERVATIONAL = ("train.steps", "log.*", "eval.before")   # eval.before acts at update 0 only


# ----------------------------------------------------------------------------- config

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
    schedule: str                   # config.sampler.schedule
    problems: Any = None            # OPD: the task problems of the pool's trajectories

    @property
    def adaptive(self) -> bool:
        return self.schedule in ADAPTIVE

    @property
    def stacked(self) -> bool:
        """N > 1 seeds: states, batches and metrics carry a leading seed axis."""
        return len(self.seeds) > 1

    def params_of(self, params, i: int):
        """Seed i's parameters of ``params`` (seed-stacked when N > 1)."""
        return seed_slice(params, i) if self.stacked else params

    def new_samplers(self) -> list[TurnSampler]:
        """One :class:`TurnSampler` per seed with the configured weights (each owns its
        schedule state, which adaptive schedules change during a run)."""
        c = self.config.sampler
        return [TurnSampler(self.pool, kappa=c.kappa,
                            schedule="kappa" if self.adaptive else c.schedule,
                            ratio_min=c.ratio_min, ratio_max=c.ratio_max) for _ in self.seeds]


def _mesh(config):
    """The device mesh of ``config.mesh`` (None without one), after joining the processes."""
    if "mesh" not in config:
        return None
    parallel.maybe_initialize_distributed(config.mesh)
    mesh = parallel.make_mesh(int(config.mesh.num_devices))
    try:
        parallel.check_divisible(int(config.train.batch_size), mesh, "config.train.batch_size")
    except ValueError as e:
        raise cu.ConfigError(str(e)) from e
    return mesh


def _load_inputs(config, task, teacher_score_fn):
    """``(pool, task, table, teacher_score_fn, problems)``: the pool, its task, the exported
    teacher logits where needed and the on-policy teacher scorer."""
    paths = resolve_paths(config)
    pool = pool_lib.load_pool(paths["pool"])
    if task is None:
        task = tasks_lib.for_pool(pool.meta)
    vocab = int(pool.meta["tokenizer"]["vocab_size"])
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
    if not onpolicy or config.sampler.schedule in ADAPTIVE or paths["logits"].is_dir():
        table = teacher_table.load(paths["logits"], pool)
    if onpolicy and config.loss.rkl_estimator == "exact" and config.loss.top_k < vocab:
        raise cu.ConfigError(f"config.loss.top_k={config.loss.top_k}: the exact reverse KL "
                             f"(loss.rkl_estimator=exact) needs the teacher's whole "
                             f"distribution, top_k >= the vocabulary ({vocab})")
    if onpolicy and teacher_score_fn is None:
        teacher_score_fn = task.teacher_scorer(paths["teacher"], config.loss.top_k)
    return pool, task, table, teacher_score_fn, problems


def build_setup(config, task: tasks_lib.Task | None = None,
                teacher_score_fn: Callable | None = None) -> Setup:
    """Validates the config once, loads the pool and (where needed) the teacher logits, and
    builds the students, optimiser and jitted step; writes nothing.

    ``task`` defaults to the registered task of the pool's ``meta["task"]``;
    ``teacher_score_fn`` (on-policy) to the task's teacher scorer on ``data.teacher_dir``.
    Raises BadInput subclasses (config, pool, logits, ``optim.carry_from``)."""
    validate_config(config)
    mesh = _mesh(config)
    pool, task, table, teacher_score_fn, problems = _load_inputs(config, task,
                                                                 teacher_score_fn)
    seeds = tuple(seeds_of(config))
    tx = make_optimizer(config.optim.lr, config.optim.warmup_steps, config.train.steps,
                        config.optim.weight_decay, config.optim.clip_norm,
                        config.optim.grad_accum)
    graphdef, cfg, state = init_students(config, int(pool.meta["tokenizer"]["vocab_size"]),
                                         task, tx, list(seeds))
    if config.optim.carry_from:
        state = carry_optimizer_state(config, state)
    if gate_on(config) and table is None:
        raise cu.ConfigError("config.gate.every: the gate's per-turn gap needs the exported "
                             f"teacher logits ({resolve_paths(config)['logits']} not found)")
    num_turns = max(int(pool.turns_per_trajectory().max()), 1)   # the samplers' max_turns
    if config.mode == "opd":   # student episodes may run longer than the teacher's
        num_turns = max(num_turns, int(task.max_turns))
    onpolicy = config.mode in ("onpolicy", "opd")
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
                 num_turns=num_turns, seeds=seeds, schedule=str(config.sampler.schedule),
                 problems=problems)


# ----------------------------------------------------------------------------- workdir

def check_stored_run(config, workdir) -> run_state.ResumeCheck:
    """The resume contract with ``workdir``'s stored run (config fields, an intact checkpoint
    if it has any); writes nothing. :func:`open_workdir` checks it; ``train.distill`` checks it
    first too, so a refused resume is reported before the inputs are loaded."""
    if not workdir:
        raise cu.ConfigError("--workdir is required")
    return run_state.check_resume(config, workdir, observational_fields(config))


def copy_state(state):
    """A fresh copy of a train state (the jitted step donates its input, and a Setup's initial
    state must stay usable for the next run)."""
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)


def new_records(setup: Setup) -> SeedRecords:
    """Fresh per-seed samplers and results dicts of a run of ``setup``."""
    config = setup.config
    results = [{"mode": config.mode, "loss": config.loss.kind,
                "kappa": None if setup.adaptive else config.sampler.kappa,
                "schedule": setup.schedule, "seed": seed, "synthetic": True, "ratio": []}
               for seed in setup.seeds]
    return SeedRecords(samplers=setup.new_samplers(), results=results, prompts={})


def open_workdir(setup: Setup, workdir) -> tuple[RunFiles, tuple]:
    """Checks the resume contract (:func:`check_stored_run`; nothing written if it fails),
    restores the newest checkpoint against a fresh state, then writes ``config.json`` /
    ``run.json`` and opens one TensorBoard writer per seed. Returns the files and
    ``runloop.restore_or_init``'s ``(state, meta, step)``."""
    config = setup.config
    check = check_stored_run(config, workdir)
    state = copy_state(setup.init_state)
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
    writers = tuple(MetricWriter(workdir / "tb") if not setup.stacked
                    else MetricWriter(workdir / "tb" / f"seed_{s}") for s in setup.seeds)
    if check.fresh:
        for w in writers:
            w.write_texts(0, {"config": cu.config_to_json(config)})
    return RunFiles(workdir=workdir, ckpt=ckpt, writers=writers), restored


def close_files(files: RunFiles) -> None:
    """Closes the run's checkpointer and curve writers."""
    if files.ckpt is not None:
        files.ckpt.close()
    for w in files.writers:
        w.close()


def restore_state(setup: Setup, rec: SeedRecords, files: RunFiles, restored: tuple,
                  host: HostState) -> tuple[Any, HostState, int]:
    """``(state, host, start)`` of the run continued from ``restored`` (``(state, meta,
    step)``): results so far and each sampler's schedule state go back into ``rec``; a fresh
    run (start 0) evaluates the untrained students ("before", unless ``eval.before`` is False)
    and runs the first ratio diagnostic. ``host``: kept when the checkpoint has none."""
    state, meta, step = restored
    start = 0
    if meta:
        start = int(meta.get("opt_step", step))
        stored = meta.get("results", {})
        per = stored.get("per_seed") if setup.stacked else [stored]
        for res, got in zip(rec.results, per or []):
            res.update(got)
        if meta.get("host"):   # checkpoints without it leave the fresh values
            host = HostState.from_json(meta["host"], len(setup.seeds))._replace(
                window=host.window, calls=host.calls)   # this process's timing goes on
    if setup.mesh is not None:   # parameters / optimiser state replicated on every device
        state = parallel.replicate(state, setup.mesh)
    if setup.adaptive and start > 0 and "sampler" in meta:
        states = meta["sampler"] if setup.stacked else [meta["sampler"]]
        for sampler, st in zip(rec.samplers, states):
            sampler.load_schedule_state(st)   # the weights in force
    elif setup.adaptive and start > 0:
        refresh_ratio(setup, rec, files, state.params, start, True)
    if start == 0:
        for i, res in enumerate(rec.results if setup.config.eval.before else ()):
            res["before"] = evaluate(setup, setup.params_of(state.params, i))
            if res["before"]:
                files.writers[i].write_scalars(0, {"eval/success_rate":
                                                   res["before"]["success_rate"]})
        if setup.logp_fn is not None:
            refresh_ratio(setup, rec, files, state.params, 0, setup.adaptive)
    return state, host, start


def checkpoint_meta(setup: Setup, rec: SeedRecords, host: HostState, done: int) -> dict:
    """The JSON meta stored with the checkpoint of update ``done`` (N > 1: results and
    sampler states as per-seed lists); :func:`restore_state` reads it back."""
    kept = [{k: v for k, v in res.items() if k in ("before", "ratio", "curve", "gate")}
            for res in rec.results]
    meta = {"opt_step": done, "results": {"per_seed": kept} if setup.stacked else kept[0],
            "host": host.to_json(setup.stacked)}
    if setup.adaptive:
        states = [s.schedule_state() for s in rec.samplers]
        meta["sampler"] = states if setup.stacked else states[0]
    return meta


# ----------------------------------------------------------------------------- host loop

def train_and_evaluate(config, workdir, setup: Setup | None = None, *,
                       teacher_score_fn: Callable | None = None,
                       task: tasks_lib.Task | None = None, max_steps: int | None = None
                       ) -> dict:
    """Runs (or resumes) a distillation job on the shared host loop (``prada_jax.runloop``);
    returns the results dict (also written to ``<workdir>/results.json``).

    ``setup``: :func:`build_setup`'s result for ``config`` (a launcher builds it once to
    report bad input before anything is written); else built here from ``task`` and
    ``teacher_score_fn``.

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
    files, restored = open_workdir(setup, workdir)
    steps = int(config.train.steps)
    try:
        rec = new_records(setup)
        state, host, start = restore_state(setup, rec, files, restored,
                                           HostState.fresh(len(setup.seeds), setup.num_turns))
        stored = stored_results(files.workdir)
        if stored is not None and (stored.get("gate") or {}).get("reached"):
            print(f"{files.workdir}: finished run (gate reached at update "
                  f"{stored['gate']['step']}); nothing to do", flush=True)
            return {**stored, "already_finished": True}
        if start >= steps:
            if stored is not None:
                print(f"{files.workdir}: finished run ({start} of {steps} updates); nothing "
                      "to do", flush=True)
                return {**stored, "already_finished": True}
        elif start > 0:
            print(f"resumed {files.workdir} at update {start} of {steps}", flush=True)
        if start < steps:
            res, host = _run_updates(setup, rec, files, state, host, start, max_steps)
            state = res.state
            gate_reached = (rec.results[0].get("gate") or {}).get("reached")
            if not res.finished and not (res.stopped_by == "stop" and gate_reached):
                return {"finished": False, "stopped_by": res.stopped_by, "opt_step": res.step}
        return results_lib.finish(setup, rec, files, state, host)
    finally:
        close_files(files)


def _run_updates(setup: Setup, rec: SeedRecords, files: RunFiles, state, host: HostState,
                 start: int, max_steps: int | None):
    """The update loop from update ``start``: one :func:`optimizer_update` per call of the
    host loop's step function, then the ratio refresh, evaluation and gate on their cadences;
    curves every ``log.every`` updates; checkpoints (with :func:`checkpoint_meta`) every
    ``log.ckpt_every`` and at the end. Returns the loop's result and the last host state."""
    config = setup.config
    steps, log_every = int(config.train.steps), int(config.log.every)
    refresh_every, eval_every = int(config.sampler.refresh_every), int(config.eval.every)
    gate_every = int(config.gate.every) if gate_on(config) else 0
    gate_hit = False

    def step_fn(state, opt_step):
        nonlocal host, gate_hit
        state, host = optimizer_update(setup, rec, state, host, opt_step)
        done = opt_step + 1
        if setup.logp_fn is not None and (
                (refresh_every and done % refresh_every == 0) or done == steps):
            refresh_ratio(setup, rec, files, state.params, done, setup.adaptive and done < steps)
        if eval_every and done % eval_every == 0 and done < steps:
            eval_point(setup, rec, files, state.params, done)
        if gate_every and done % gate_every == 0:
            gate_hit = check_gate(setup, rec, files, state.params, done)
        return state, {}

    def scalars_fn(_, done, wall_s):
        nonlocal host
        if gate_hit and done < steps:   # gate reached: log this window, then stop here
            scalars, host = log_scalars(host, setup.num_turns, setup.stacked)
            for w, sc in zip(files.writers, scalars):
                w.write_scalars(done, sc)
            raise runloop.Stop
        if done % log_every == 0 or done == steps:
            scalars, host = log_scalars(host, setup.num_turns, setup.stacked)
            return scalars if setup.stacked else scalars[0]
        return None

    res = runloop.run(
        state, step_fn, start=start, total=steps, max_calls=max_steps,
        writers=files.writers, ckpt=files.ckpt, scalars_fn=scalars_fn,
        writer_names=[f"seed {s}" for s in setup.seeds],
        meta_fn=lambda st, done, sc: checkpoint_meta(setup, rec, host, done),
        progress=bool(config.log.progress), desc=f"distill[{config.mode}/{config.loss.kind}]",
        unit="upd", step_name="updates",
        postfix_fn=lambda sc: {"loss": f"{sc[0]['distill/loss']:.4f}",
                               "kl": f"{sc[0]['distill/kl']:.4f}"})
    return res, host
