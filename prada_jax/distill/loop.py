"""Host training loop of ``python -m train.distill``: data, student, checkpoints, curves, eval.

``train_and_evaluate(config, workdir)`` (config: ``train/configs/distill.py``):

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

Determinism: the batch of micro-step s is drawn with ``np.random.default_rng([seed, s])`` and
the sampling key is ``fold_in(key(seed), s)``, so a resumed run continues the same sequence.
The trainer never calls the environment: ``distill/env_calls`` is the calculator's call
counter across the training steps (it must be 0).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from prada_jax import config_utils as cu
from prada_jax.distill import pool as pool_lib
from prada_jax.distill import ratio as ratio_lib
from prada_jax.distill import teacher_table
from prada_jax.distill.sampler import SCHEDULES, TurnSampler, check_kappa, pair_weights
from prada_jax.distill.task import arith
from prada_jax.distill.trainer import init_state, make_optimizer, make_train_step, onpolicy_round


# Adaptive turn weightings (prada_jax/distill/ratio.py), re-estimated from the current student
# every ``sampler.refresh_every`` updates: "auto" = κ^t with κ = exp(−c̄), "exact-ratio" =
# clipped per-prefix likelihood ratio br_{i,t}.
ADAPTIVE = ("auto", "exact-ratio")


def resolve_paths(config) -> dict[str, Path]:
    cache = Path(config.data.cache)
    return {"pool": Path(config.data.pool_dir or cache / "pool"),
            "logits": Path(config.data.logits_dir or cache / "logits"),
            "teacher": Path(config.data.teacher_dir or cache / "teacher")}


def validate_config(config) -> None:
    """Checks every field once; errors name the field (``config.sampler.kappa ...``)."""
    cu.check_choice(config, "mode", ("offline", "onpolicy"))
    cu.check_choice(config, "loss.kind", ("fkl", "jsd", "sft", "rkl"))
    if config.mode == "offline":
        cu.check(config.loss.kind != "rkl", "loss.kind",
                 "'rkl' needs config.mode=onpolicy (it scores student samples)")
    else:
        cu.check(config.loss.kind == "rkl", "loss.kind", "on-policy mode uses 'rkl'")
    try:
        check_kappa(config.sampler.kappa)
    except ValueError:
        raise cu.ConfigError(f"config.sampler.kappa must lie in (0, 1], got "
                             f"{config.sampler.kappa!r}") from None
    cu.check_choice(config, "sampler.schedule", SCHEDULES + ADAPTIVE)
    cu.check_int(config, "sampler.refresh_every", minimum=0)
    cu.check_range(config, "sampler.kappa_min", 0.0, 1.0, low_open=True)
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
    cu.check(config.student.hidden_size % config.student.num_heads == 0, "student.hidden_size",
             "must be divisible by config.student.num_heads")
    cu.check(config.student.num_heads % config.student.num_kv_heads == 0,
             "student.num_heads", "must be divisible by config.student.num_kv_heads")
    cu.check_choice(config, "train.compute_dtype", ("float32", "bfloat16"))
    cu.check(config.onpolicy.top_p <= 1.0, "onpolicy.top_p", "must be <= 1")
    if "mesh" in config:
        from prada_jax import parallel
        try:
            parallel.validate_mesh_config(config.mesh)
        except ValueError as e:
            raise cu.ConfigError(str(e)) from e


def build_student(config, vocab_size: int):
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.hf import load_hf
    from prada_jax.lm.model import CausalLM
    dtype = jnp.bfloat16 if config.train.compute_dtype == "bfloat16" else jnp.float32
    if config.student.init:
        model, cfg = load_hf(config.student.init, dtype=dtype, param_dtype=jnp.float32)
        return model, cfg
    s = config.student
    cfg = LMConfig(vocab_size=vocab_size, hidden_size=s.hidden_size,
                   intermediate_size=s.intermediate_size, num_layers=s.num_layers,
                   num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
                   head_dim=s.hidden_size // s.num_heads, tie_word_embeddings=True,
                   max_position_embeddings=256, pad_token_id=arith.PAD_ID,
                   eos_token_id=arith.EOS_ID, arch="qwen2")
    model = CausalLM(cfg, rngs=nnx.Rngs(params=config.seed), dtype=dtype,
                     param_dtype=jnp.float32)
    return model, cfg


def _teacher_score_fn(teacher_dir: Path, top_k: int) -> Callable:
    from prada_jax.distill.task.export_local import score_sequences
    from prada_jax.distill.task.teacher import load_teacher
    model = load_teacher(teacher_dir)
    return lambda seqs: score_sequences(model, seqs, top_k)


def _eval(graphdef, params, config, cfg, task: str = arith.TASK_NAME) -> dict:
    """Task success of the student on the built-in task ({} when the pool is another task)."""
    from prada_jax.distill.task.evaluate import evaluate_model
    if config.eval.n_problems == 0 or task != arith.TASK_NAME:
        return {}
    model = nnx.merge(graphdef, params)
    if config.train.compute_dtype == "bfloat16":
        model = _as_f32(model, cfg)
    probs = arith.make_problems(config.eval.seed * 1000 + 3, config.eval.n_problems)
    return evaluate_model(model, probs, batch=config.eval.batch_size)


def _as_f32(model, cfg):
    from prada_jax.lm.model import CausalLM
    f32 = nnx.eval_shape(lambda: CausalLM(cfg, rngs=nnx.Rngs(0)))
    gd, _ = nnx.split(f32)
    return nnx.merge(gd, nnx.state(model))


def train_and_evaluate(config, workdir, teacher_score_fn: Callable | None = None) -> dict:
    """Runs a distillation job (see the module docstring); returns the results dict."""
    from tqdm import tqdm

    from prada_jax.checkpointing import Checkpointer
    from prada_jax.metric_writer import MetricWriter

    from prada_jax import parallel

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
    workdir = cu.prepare_workdir(workdir)
    if parallel.is_process_zero():
        cu.write_config_json(config, workdir)
    paths = resolve_paths(config)
    pool = pool_lib.load_pool(paths["pool"])
    vocab = int(pool.meta["tokenizer"]["vocab_size"])
    schedule = config.sampler.schedule
    adaptive = schedule in ADAPTIVE
    sampler = TurnSampler(pool, kappa=config.sampler.kappa,
                          schedule="kappa" if adaptive else schedule)
    onpolicy = config.mode == "onpolicy"
    table = None
    # offline losses and adaptive schedules need the exported logits; otherwise (on-policy)
    # they only feed the ratio diagnostic, when present
    if not onpolicy or adaptive or paths["logits"].is_dir():
        table = teacher_table.load(paths["logits"], pool)
    if onpolicy and teacher_score_fn is None:
        teacher_score_fn = _teacher_score_fn(paths["teacher"], config.loss.top_k)
    model, cfg = build_student(config, vocab)
    if cfg.vocab_size < vocab:
        raise cu.ConfigError(f"config.student.init: vocabulary {cfg.vocab_size} is smaller than "
                             f"the pool's tokenizer ({vocab})")
    accum = config.optim.grad_accum
    tx = make_optimizer(config.optim.lr, config.optim.warmup_steps, config.train.steps,
                        config.optim.weight_decay, config.optim.clip_norm, accum)
    graphdef, state = init_state(model, tx, jax.random.key(config.seed))
    del model
    num_turns = max(sampler.max_turns, 1)
    step_fn = make_train_step(graphdef, tx, config.mode,
                              "rkl" if onpolicy else config.loss.kind,
                              temperature=config.loss.temperature, beta=config.loss.beta,
                              rkl_coef=config.loss.rkl_coef, fkl_coef=config.loss.fkl_coef,
                              num_turns=num_turns)
    ckpt = Checkpointer(workdir / "checkpoints", save_every=config.log.ckpt_every,
                        max_to_keep=config.log.keep)
    writer = MetricWriter(workdir / "tb")
    writer.write_texts(0, {"config": cu.config_to_json(config)})
    results: dict = {"mode": config.mode, "loss": config.loss.kind,
                     "kappa": None if adaptive else config.sampler.kappa,
                     "schedule": schedule, "seed": config.seed, "synthetic": True, "ratio": []}
    start = 0
    meta: dict = {}
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        start = int(meta.get("opt_step", ckpt.latest_step()))
        results.update(meta.get("results", {}))
    if mesh is not None:   # parameters / optimiser state replicated on every device
        state = parallel.replicate(state, mesh)
    logp_fn = ratio_lib.token_logp_fn(graphdef) if table is not None else None
    refresh_every = int(config.sampler.refresh_every)

    def refresh(step: int, params, update_weights: bool) -> None:
        """Ratio diagnostic of the current student; for adaptive schedules new weights."""
        diag = ratio_lib.diagnose_student(logp_fn, params, pool, table,
                                          config.sampler.kappa_min)
        scal = diag.scalars()
        rec = {"step": step, **{k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                                for k, v in diag.summary().items()}}
        if update_weights and schedule == "auto":
            sampler.set_probs(pair_weights(pool, diag.kappa_auto), kappa=diag.kappa_auto)
            sampler.log_ratio = None
        elif update_weights and schedule == "exact-ratio":
            sampler.set_probs(ratio_lib.exact_ratio_probs(pool, diag.log_ratio,
                                                          config.sampler.ratio_min,
                                                          config.sampler.ratio_max))
            sampler.log_ratio = diag.log_ratio
            low = float(np.mean(diag.log_ratio < np.log(config.sampler.ratio_min)))
            scal["ratio/clipped_low_frac"] = rec["clipped_low_frac"] = low
        if schedule == "auto":   # exact-ratio has no single κ to report
            scal["distill/kappa"] = rec["kappa_used"] = sampler.kappa
        writer.write_scalars(step, scal)
        results["ratio"].append(rec)

    if adaptive and start > 0 and "sampler" in meta:   # the weights in force at the checkpoint
        sm = meta["sampler"]
        if schedule == "auto":
            sampler.set_probs(pair_weights(pool, sm["kappa"]), kappa=sm["kappa"])
        else:
            sampler.set_probs(ratio_lib.exact_ratio_probs(
                pool, np.asarray(sm["log_ratio"]), config.sampler.ratio_min,
                config.sampler.ratio_max))
            sampler.log_ratio = np.asarray(sm["log_ratio"])
    elif adaptive and start > 0:
        refresh(start, state.params, True)
    if start == 0:
        results["before"] = _eval(graphdef, state.params, config, cfg, pool.meta["task"])
        if results["before"]:
            writer.write_scalars(0, {"eval/success_rate": results["before"]["success_rate"]})
        if logp_fn is not None:
            refresh(0, state.params, adaptive)
    base_key = jax.random.key(config.seed)
    prompts_cache: dict = {}
    update_times, tokens_done, turn_hist = [], 0, np.zeros(num_turns)
    acc: dict = {}
    env_calls = 0
    bar = tqdm(range(start, config.train.steps), initial=start, total=config.train.steps,
               desc=f"distill[{config.mode}/{config.loss.kind}]", disable=not config.log.progress)
    for opt_step in bar:
        t0 = time.perf_counter()
        calls0 = arith.TOOL_CALLS.calls
        for micro in range(accum):
            s = opt_step * accum + micro
            rng = np.random.default_rng([config.seed, s])
            pairs = sampler.draw(rng, config.train.batch_size)
            tb = sampler.batch(pairs)
            turn_hist += np.bincount(tb.turn, minlength=num_turns)
            if onpolicy:
                prompts = [_prefix(pool, sampler, k, prompts_cache) for k in pairs]
                batch, ntok = onpolicy_round(
                    graphdef, state.params, jax.random.fold_in(base_key, s), tb,
                    teacher_score_fn, max_new_tokens=config.onpolicy.max_new_tokens,
                    temperature=config.onpolicy.temperature, top_p=config.onpolicy.top_p,
                    stop_ids=arith.STOP_IDS if pool.meta["task"] == arith.TASK_NAME else (),
                    pad_id=arith.PAD_ID, prompt_tokens=prompts)
            else:
                batch = dict(prompt=tb.prompt, prompt_mask=tb.prompt_mask, action=tb.action,
                             action_valid=(tb.action_pos >= 0).astype(np.int32),
                             action_mask=tb.action_mask, turn=tb.turn)
                g = table.gather(tb.action_pos)
                batch.update(topk_ids=g["topk_ids"], topk_logp=g["topk_logp"],
                             tail_mass=g["tail_mass"])
                ntok = int(tb.action_mask.sum())
            if mesh is not None:   # sequences split over the ``batch`` mesh axis
                batch = parallel.shard_batch(batch, mesh)
            state, m = step_fn(state, batch)
            m = jax.device_get(m)
            for k, v in m.items():
                acc[k] = acc.get(k, 0.0) + np.asarray(v, np.float64)
            acc["n"] = acc.get("n", 0) + 1
            tokens_done += ntok
        jax.block_until_ready(state.params)
        env_calls += arith.TOOL_CALLS.calls - calls0
        dt = time.perf_counter() - t0
        update_times.append(dt)
        done = opt_step + 1
        if done % config.log.every == 0 or done == config.train.steps:
            n = acc.pop("n")
            scal = {"distill/loss": acc["loss"] / n, "distill/kl": acc["kl"] / n,
                    "distill/grad_norm": acc["grad_norm"] / n,
                    "distill/tokens_per_s": tokens_done / max(sum(update_times[-config.log.every:]), 1e-9),
                    "distill/update_s": float(np.median(update_times[-config.log.every:])),
                    "distill/env_calls": env_calls}
            if "fkl" in acc:
                scal["distill/fkl"] = acc["fkl"] / n
            cnt = acc["kl_turn_count"]
            for t in range(num_turns):
                if cnt[t] > 0:
                    scal[f"distill/kl_turn_{t}"] = acc["kl_turn_sum"][t] / cnt[t]
                scal[f"distill/turn_frac_{t}"] = turn_hist[t] / max(turn_hist.sum(), 1)
            from prada_jax.metric_writer import all_finite
            if not all_finite(scal):
                ckpt.close()
                writer.close()
                raise FloatingPointError(f"non-finite training metrics between updates "
                                         f"{done - config.log.every} and {done}: {scal}")
            writer.write_scalars(done, scal)
            bar.set_postfix(loss=f"{scal['distill/loss']:.4f}", kl=f"{scal['distill/kl']:.4f}")
            acc, tokens_done = {}, 0
        if logp_fn is not None and (
                (refresh_every and done % refresh_every == 0) or done == config.train.steps):
            refresh(done, state.params, adaptive and done < config.train.steps)
        meta = {"opt_step": done, "results": {k: v for k, v in results.items()
                                              if k in ("before", "ratio")}}
        if adaptive:
            meta["sampler"] = {"kappa": sampler.kappa, "log_ratio": (
                None if sampler.log_ratio is None else sampler.log_ratio.tolist())}
        if ckpt.should_save(done) or done == config.train.steps:
            writer.flush()  # curves before a checkpoint are on disk before it (resume)
        ckpt.save(done, state, meta=meta, force=done == config.train.steps)
    bar.close()
    ckpt.close()
    results["env_calls_during_training"] = int(env_calls)
    results["update_s_median"] = float(np.median(update_times)) if update_times else None
    results["turn_histogram"] = turn_hist.tolist()
    if schedule == "auto":
        results["kappa"] = sampler.kappa   # the last estimate in force
    results["after"] = _eval(graphdef, state.params, config, cfg, pool.meta["task"])
    if results["after"]:
        writer.write_scalars(config.train.steps,
                             {"eval/success_rate": results["after"]["success_rate"]})
    writer.close()
    if parallel.is_process_zero():
        save_student(graphdef, state.params, cfg, workdir / "student_hf", config)
        (workdir / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _prefix(pool, sampler, k, cache) -> list[int]:
    k = int(k)
    if k not in cache:
        s = int(pool.turn_starts[k])
        a = max(int(pool.traj_offsets[sampler.pair_traj[k]]), s - sampler.P)
        cache[k] = np.asarray(pool.tokens[a:s]).tolist()
    return cache[k]


def save_student(graphdef, params, cfg, out_dir: Path, config=None) -> Path:
    """Saves the student as a Hugging Face folder (float32 safetensors + config + the task
    tokenizer when the built-in task is used)."""
    from prada_jax.lm.hf import save_hf
    model = nnx.merge(graphdef, params)
    save_hf(model, cfg, out_dir, arch=cfg.arch)
    try:
        arith.build_tokenizer().save_pretrained(out_dir)
    except Exception as e:  # noqa: BLE001 - the tokenizer is a convenience, weights suffice
        print(f"note: tokenizer not saved next to the student ({e})")
    return out_dir
