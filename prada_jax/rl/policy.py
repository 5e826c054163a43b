"""A trained PPO policy's run-folder files: ``policy_meta.json`` and loading the network from
its checkpoints.

A ``train.ppo`` run folder (``prada_jax.rl.trainer`` writes it) holds, besides ``config.json``,
``run.json`` and ``tb/``::

    <workdir>/policy_meta.json   obs_dim, trace-set shape, preset, network sizes (for loaders)
    <workdir>/checkpoints/<update>/   orbax checkpoints of the whole (seed-stacked) LearnerState

``load_policy(workdir)`` rebuilds the network and returns the trained parameters plus the
functions the evaluation and dual-ascent code need (``advantage_fn`` for ΔQ, ``act_fn``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import orbax.checkpoint as ocp

from prada_jax import checkpointing, config_utils, run_state
from prada_jax.errors import BadInput
from prada_jax.jsonio import read_json, write_json
from prada_jax.rl import networks
from prada_jax.rl.screen import screen_and_gain

__all__ = ["POLICY_META_FILE", "Policy", "policy_meta", "check_policy_meta",
           "write_policy_meta", "read_policy_meta", "check_traces_match", "make_act_fn",
           "load_policy", "LoadedPolicy", "load_checked"]

POLICY_META_FILE = "policy_meta.json"


def policy_meta(config, setup) -> dict:
    """The ``policy_meta.json`` of a run: obs size, trace-set shape, network sizes and seeds of
    ``setup`` (a ``prada_jax.rl.trainer.Setup``) and ``config``."""
    return {"obs_dim": setup.obs_dim, "num_users": setup.num_users,
            "env": config.env.name, "preset": config.env.preset,
            "reward_mode": config.env.reward_mode,
            "traces": setup.trace_info, "hidden": list(config.net.hidden),
            "separate_critic": bool(config.net.separate_critic),
            "num_actions": setup.num_actions, "critic": setup.critic,
            "num_seeds": int(config.num_seeds), "seeds": [int(config.seed) + i
                                                          for i in range(int(config.num_seeds))],
            # the clock's hardware pair; absent = "paper" (runs stored before pairs existed)
            **({"hardware": str(config.env.hardware)}
               if str(config.env.hardware) != "paper" else {})}


def check_policy_meta(workdir: Path, meta: dict) -> None:
    """Refuses a resume whose data gives another policy_meta.json (e.g. a trace folder whose
    content changed under the same path); writes nothing."""
    path = workdir / POLICY_META_FILE
    if not path.is_file():
        return
    try:
        old = read_json(path, expect=None)
    except BadInput:
        raise BadInput(f"{path}: not valid JSON; cannot check the resumed run against "
                       "it") from None
    new = json.loads(json.dumps(meta))
    if isinstance(old, dict) and old != new:
        diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise run_state.ConfigMismatch(
            f"--workdir={workdir} holds a run whose {POLICY_META_FILE} differs in {diff} "
            f"(the data changed?); use a new --workdir")


def write_policy_meta(workdir, meta: dict) -> None:
    """Writes ``meta`` as ``<workdir>/policy_meta.json`` (sorted keys, indent 2), atomically."""
    write_json(Path(workdir) / POLICY_META_FILE, meta, indent=2, sort_keys=True)


def make_act_fn(apply_fn: Callable, action_fn: Callable | None = None,
                greedy: bool = True) -> Callable:
    """``act_fn(params, key, obs [U, D]) -> env action`` for running a policy in an env.

    Greedy = argmax of the policy logits, else a sample. With ``action_fn`` (e.g.
    ``envs.stage1.edge_action``) the critic's ΔQ is attached as the gain; otherwise an int32
    [U] array.
    """
    def act_fn(params, key, obs):
        screen, gain = screen_and_gain(apply_fn, params, obs, key, greedy=greedy)
        if action_fn is None:
            return screen
        return action_fn(screen, gain)
    return act_fn


class Policy(NamedTuple):
    """A trained screening policy.

    apply_fn: ``(params, obs [..., D]) -> (logits [..., 2], q [..., 2])``.
    params: parameters of one seed.
    advantage_fn: ``(params, obs [U, D]) -> ΔQ [U]`` (PRM units under the coarse reward).
    act_fn: ``(params, key, obs [U, D]) -> action`` (greedy): the ``action_fn`` given to
      :func:`load_policy` of the screen and ΔQ (``envs.stage1.edge_action`` for the edge
      env), or the int32 [U] screen.
    meta: the run's ``policy_meta.json`` plus ``step`` and ``seed``.
    """

    apply_fn: Callable
    params: Any
    advantage_fn: Callable
    act_fn: Callable
    meta: dict


def read_policy_meta(workdir) -> dict:
    path = Path(workdir) / POLICY_META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (is {workdir} a train.ppo run directory?)")
    return read_json(path)   # malformed: BadInput (a ValueError) naming the file


def check_traces_match(meta: dict, traces, where: str = "policy") -> None:
    """Refuses a trace set whose feature dim differs from the one the policy was trained on."""
    want = meta.get("traces", {}).get("feature_dim")
    if want is not None and int(traces.feature_dim) != int(want):
        raise ValueError(f"{where}: trained on traces with feature_dim {want} "
                         f"({meta['traces'].get('source')}), got a trace set with "
                         f"feature_dim {traces.feature_dim}")


def load_policy(workdir, step: int | None = None, seed_index: int = 0,
                action_fn: Callable | None = None):
    """Loads a trained policy from a ``train.ppo`` run directory.

    Args:
      workdir: the run directory.
      step: checkpoint step (update count); default the latest.
      seed_index: which of the run's ``num_seeds`` learner states (0-based).
      action_fn: ``(screen [U], gain [U]) -> env action`` of ``Policy.act_fn`` (None: the
        int screen), e.g. ``envs.stage1.action_fn_of(env_params, config.env.pass_gain)``.

    Returns:
      ``(policy, config)``: a ``Policy`` and the run's ``ConfigDict``; ``policy.meta["step"]``
      is the checkpoint step (update count) that was loaded.

    Raises:
      FileNotFoundError / ValueError naming the file that is missing or malformed;
      ``checkpointing.CheckpointError`` (a ``BadInput``; ``MissingCheckpoint`` is also a
      FileNotFoundError) for a missing, damaged or mismatched checkpoint. The latest step is
      loaded as it is: a damaged one is reported (naming the file), never skipped.
    """
    workdir = Path(workdir)
    config = config_utils.read_config_json(workdir)
    meta = read_policy_meta(workdir)
    if not 0 <= seed_index < int(meta["num_seeds"]):
        raise ValueError(f"seed_index {seed_index} out of range: {workdir} holds "
                         f"{meta['num_seeds']} seed(s)")
    obs_dim, hidden = int(meta["obs_dim"]), tuple(meta["hidden"])
    sep = bool(meta["separate_critic"])
    graphdef, params_template = networks.init_network(
        jax.random.key(0), obs_dim, hidden, sep, int(meta.get("num_actions", networks.NUM_ACTIONS)),
        str(meta.get("critic", "q")))
    params_template = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((int(meta["num_seeds"]),) + x.shape, x.dtype),
        params_template)
    # Read-only: a policy folder without checkpoints/ is refused, never created.
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", create=False)
    try:
        params, ckpt_meta, step = _restore_params(ckpt, params_template, step)
    finally:
        ckpt.close()
    # debug: commands validate every input before their first INFO line (evals.run logs it)
    logging.debug("loaded policy %s at update %d (seed index %d)", workdir, step, seed_index)
    params = jax.tree.map(lambda x: x[seed_index], params)
    apply_fn = networks.make_apply_fn(graphdef)
    policy = Policy(apply_fn=apply_fn, params=params,
                    advantage_fn=networks.make_advantage_fn(apply_fn),
                    act_fn=make_act_fn(apply_fn, action_fn, greedy=True),
                    meta=dict(meta, step=step, seed=meta["seeds"][seed_index],
                              checkpoint_meta=ckpt_meta))
    return policy, config


def _restore_params(ckpt: checkpointing.Checkpointer, params_template, step):
    """Restores only ``params`` of a saved LearnerState (other items are not read)."""
    if step is None:
        step = ckpt.latest_step()
        if step is None:
            raise checkpointing.MissingCheckpoint(f"no checkpoint in {ckpt.directory}")
    if step not in ckpt.all_steps():
        raise checkpointing.MissingCheckpoint(f"no checkpoint for step {step} in "
                                              f"{ckpt.directory} (have {ckpt.all_steps()})")
    step = int(step)
    verified = ckpt.verify(step)
    path = ckpt.directory / str(step) / "state"
    meta_path = ckpt.directory / str(step) / "meta" / "metadata"
    try:
        ckpt_meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except (ValueError, RecursionError) as e:
        raise checkpointing.DamagedCheckpoint(
            f"checkpoint step {step} is damaged: {meta_path} is not valid JSON "
            f"({type(e).__name__})") from None
    try:
        with ocp.PyTreeCheckpointer() as pc:
            item = {"params": params_template}
            # Restore onto the template's devices, whatever topology saved the run.
            restored = pc.restore(path, args=ocp.args.PyTreeRestore(
                item=item, partial_restore=True,
                restore_args=ocp.checkpoint_utils.construct_restore_args(item)))
    except Exception as e:  # noqa: BLE001  (orbax/tensorstore raise many types)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        if verified:
            raise checkpointing.CheckpointError(
                f"checkpoint {path} does not hold the parameters {POLICY_META_FILE} "
                f"describes: {type(e).__name__}: {first}") from e
        raise checkpointing.DamagedCheckpoint(
            f"checkpoint step {step} is damaged or unreadable: {path}: "
            f"{type(e).__name__}: {first}") from e
    return restored["params"], ckpt_meta, step


class LoadedPolicy(NamedTuple):
    apply_fn: Any
    params: Any
    meta: dict      # policy_meta.json plus the restored step
    config: Any     # the run's ConfigDict
    workdir: str


_POLICY_CACHE: dict = {}


def load_checked(workdir: str, step: int | None = None, flag: str = "--policy", *,
                error: type[BadInput] = BadInput) -> LoadedPolicy:
    """Loads a ``train.ppo`` run for another command (checked, cached per folder, step and
    checkpoint listing, so callers in one process share one ``apply_fn`` and one compiled
    rollout); every failure raises ``error`` (a BadInput) naming the folder.

    ``flag`` is how the user named the folder (``--policy``, ``--checkpoints``). Nothing is
    created in the folder: one without ``checkpoints/`` is refused before the checkpoint
    library sees it.
    """
    path = Path(workdir)
    if not path.is_dir():
        raise error(f"{flag}={workdir}: no such run directory")
    ckpts = path / "checkpoints"
    try:
        config_utils.check_run_dir(path, flag, files=("config.json", "policy_meta.json"),
                                   checkpoints=False, kind="train.ppo run")
    except BadInput as e:
        raise error(f"cannot load the policy checkpoint: {e}") from None
    if not ckpts.is_dir():
        raise error(f"{flag}={workdir}: no checkpoints/ folder (not a train.ppo run "
                    "directory, or one that never saved)")
    stamp = tuple(sorted(p.name for p in ckpts.iterdir()))
    cache_key = (str(path.resolve()), step, stamp)
    if cache_key in _POLICY_CACHE:
        return _POLICY_CACHE[cache_key]
    try:
        policy, config = load_policy(path, step=step)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise error(f"{flag}={workdir}: cannot load the policy checkpoint: {e}") from None
    except Exception as e:  # orbax / tensorstore errors on a corrupt checkpoint
        raise error(f"{flag}={workdir}: checkpoint is corrupt or unreadable "
                    f"({type(e).__name__}: {str(e)[:300]})") from None
    loaded = LoadedPolicy(policy.apply_fn, policy.params, policy.meta, config, str(path))
    _POLICY_CACHE[cache_key] = loaded
    return loaded
