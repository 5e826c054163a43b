"""The parts of ``train.main`` that train: the trace summary, the screening policy (PPO), its
critic refit, the learned multipliers (dual); and ``check_envs``, run before any of them."""
from __future__ import annotations

import shutil
from pathlib import Path

from envs import edge, stage1, stage2
from evals import suite
from prada_jax import latency
from prada_jax.errors import BadInput
from prada_jax.rl import trainer
from prada_jax.dual import trainer as dual_trainer
from prada_jax.traces import stats as tstats
from prada_jax.traces import synthetic
from prada_jax.traces.loader import load_config_traces
from train import pipeline
from train.parts.cache import mark_done, reuse_finished


def part_traces(workdir: Path, config, log, redo: bool) -> dict:
    """Summary table of the synthetic presets (issue 2's main job)."""
    d = workdir / "traces"
    problems = config.summary_problems or None
    key = {"presets": list(config.summary_presets), "problems": problems}
    done = reuse_finished(d, key, redo, log, "traces: reusing the finished summary")
    if done:
        print(done["result"]["table"])
        return done["result"]
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for preset in config.summary_presets:
        tr, meta = synthetic.generate(preset, seed=0, problems=problems)
        rows.append(tstats.trace_stats(tr, meta))
    table = tstats.summary_table(rows)
    table = "Synthetic trace presets (SYNTHETIC data, calibrated to published accuracies)\n" \
        + table
    (d / "summary.txt").write_text(table + "\n")
    print(table)
    result = {"table": table, "path": str(d / "summary.txt")}
    mark_done(d, key, result)
    return result


def ppo_overrides(config) -> dict:
    """The dotted fields ``train.main`` sets on the PPO config (the server model, the clock's
    hardware pair and, when nonzero, the run's length)."""
    fields = {"env.server_model": config.ppo.server_model, "env.hardware": config.hardware}
    if config.ppo.total_env_steps:
        fields["ppo.total_env_steps"] = int(config.ppo.total_env_steps)
    return fields


def ppo_config(config, preset: str):
    """The screening policy's config of one benchmark (``train.pipeline.ppo_config``)."""
    return pipeline.ppo_config(preset, config.ppo.variant, ppo_overrides(config),
                               problems=config.train_problems or None, progress=True)


def part_ppo(workdir: Path, config, preset: str, log, redo: bool) -> Path:
    """Trains (or resumes, or reuses) the screening policy; returns its run directory."""
    d = workdir / "ppo" / preset
    c = ppo_config(config, preset)
    # The part is keyed on what train.main chooses (variant, overrides, problems), not on the
    # whole PPO config: a new field in ppo.py must not retrain a finished run.
    key = {"variant": config.ppo.variant, "overrides": ppo_overrides(config), "preset": preset,
           "problems": config.train_problems or None}
    if reuse_finished(d, key, redo, log, f"ppo [{preset}]: reusing the finished run in {d}"):
        return d
    log(f"ppo [{preset}]: training the screening policy ({c.ppo.total_env_steps} env "
        f"slots, U={c.env.num_users}) in {d}")
    result = trainer.train_and_evaluate(c, d, stage1.build_setup(c))
    sc = result["scalars"][0]
    if not sc or result.get("start_update") == result["update_step"]:
        log(f"ppo [{preset}]: the run in {d} was already complete (update "
            f"{result['update_step']})")
    else:
        log(f"ppo [{preset}]: done at update {result['update_step']}, episode return "
            f"{sc.get('train/episode_return', float('nan')):.4f} (synthetic), nominate rate "
            f"{sc.get('train/nominate_rate', float('nan')):.3f}")
    mark_done(d, key, {"update_step": result["update_step"], "env_steps": result["env_steps"]})
    return d


def part_critic(workdir: Path, config, preset: str, ppo_dir: Path, log, redo: bool) -> Path:
    """Refits the critic of the PPO run for its final actor (``train.critic``)
    into ``critic/<preset>`` and returns that policy folder (the PPO folder itself when
    ``config.critic_refit.fit_states`` is 0)."""
    cfg = config.critic_refit.to_dict()
    if not cfg["fit_states"]:
        return ppo_dir
    d = workdir / "critic" / preset
    key = {"critic_refit": cfg, "policy": str(ppo_dir), "split": config.choice_split}
    if reuse_finished(d, key, redo, log, f"critic [{preset}]: reusing the refit critic in {d}"):
        return d
    if d.exists():   # an interrupted or outdated refit: start again
        shutil.rmtree(d)
    log(f"critic [{preset}]: refitting the critic for the final actor ({cfg['fit_states']} "
        f"Monte-Carlo states; judged and early-stopped on the {config.choice_split} split) in "
        f"{d}")
    summary = pipeline.refit_critic(ppo_dir, d, cfg, config.choice_split,
                                    log=lambda m: log(f"critic [{preset}]: {m.strip()}"))
    mark_done(d, key, summary)
    return d


def dual_config(config, preset: str, policy_dir: Path, env_kw: dict):
    """``(dual config, key)``: the ``prada_jax/configs/dual.py`` config of one benchmark (same
    scenario as the eval, the policy of ``policy_dir``) and the part's rerun key (what
    train.main chose: variant and the fields it set)."""
    variant = ",".join(v for v in (config.dual.variant, preset) if v)
    fields = {"policy_dir": str(policy_dir), "env.trace_seed": 0,
              "env.problems": int(config.train_problems),
              "env.split": config.choice_split}
    fields.update({f"env.{k}": env_kw[k] for k in ("num_users", "num_servers", "bandwidth_hz",
                                                   "arrival_rate_hz", "beta", "tau_s")})
    fields.update({"env.server_model": config.dual.server_model,
                   "env.hardware": config.hardware})
    c = pipeline.dual_config(preset, config.dual.variant, fields)
    return c, {"variant": variant, "fields": fields}


def part_dual(workdir: Path, config, preset: str, policy_dir: Path, log, redo: bool) -> Path:
    """Learns the multipliers in this process (``prada_jax.dual.trainer``, what
    ``python -m train.dual`` runs); returns the run directory."""
    d = workdir / "dual" / preset
    policy = suite.load_policy(str(policy_dir))
    env_kw = suite.env_kwargs_from(policy.config, {})
    c, key = dual_config(config, preset, policy_dir, env_kw)
    if reuse_finished(d, key, redo, log, f"dual [{preset}]: reusing the finished run in {d}"):
        return d
    log(f"dual [{preset}]: learning λ_s and µ in {d} on the {c.env.split} split "
        f"(seeds from {dual_trainer.learner_seed(c)})")
    result = dual_trainer.train_and_evaluate(c, d, stage2.build_setup(c))
    for ln in dual_trainer.summary_lines(result):
        if ln.startswith(("done:", "duality gap")):
            print("    " + ln + " [synthetic traces]")
    mark_done(d, key, {})
    return d


def check_envs(config, flag: str = "--hardware") -> None:
    """Every part's env under ``config.hardware``, checked before anything is written: the
    PPO part's (``envs.stage1.build_env``, its M against the server's KV memory included) and the
    largest M the later parts run (the policy's ``env.num_servers``, the sweep's M grid).
    ``BadInput`` naming ``flag`` (the flag or field that chose the pair)."""
    hardware = config.hardware
    sweep_m = list(config.sweep.num_servers) if "num_servers" in config.sweep.axes else []
    for preset in config.benchmarks:
        c = ppo_config(config, preset)
        try:
            trainer.validate_config(c)
            stage1.validate_env_config(c)
            traces, _ = load_config_traces(c)
            stage1.build_env(c, traces)
            edge.check_num_servers(latency.pair_latency_params(hardware), traces,
                                   max([int(c.env.num_servers), *sweep_m]), hardware)
        except BadInput as e:
            msg = str(e)
            raise BadInput(msg if msg.startswith(flag) else f"{flag}={hardware}: {msg}"
                           ) from None
