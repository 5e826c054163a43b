"""A ``train.ppo`` run folder loaded for another command, every failure one ``BadInput`` line.

``load_policy(workdir)`` is what the evaluation commands (``evals.suite``) and the critic refit
(``prada_jax.rl.critic_refit``) call to read a policy someone points them at: it checks the
folder (``config.json``, ``policy_meta.json``, ``checkpoints/``) without writing anything, then
restores the newest (or the given) checkpoint through ``trainer.load_policy``. Loaded policies
are cached per (folder, step, checkpoint listing), so callers in one process share one
``apply_fn`` and hence one compiled rollout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from prada_jax import config_utils
from prada_jax.errors import BadInput
from prada_jax.rl import trainer

__all__ = ["LoadedPolicy", "load_policy"]


class LoadedPolicy(NamedTuple):
    apply_fn: Any
    params: Any
    meta: dict      # policy_meta.json plus the restored step
    config: Any     # the run's ConfigDict
    workdir: str


_POLICY_CACHE: dict = {}


def load_policy(workdir: str, step: int | None = None, flag: str = "--policy", *,
                error: type[BadInput] = BadInput) -> LoadedPolicy:
    """Loads a ``train.ppo`` run; every failure raises ``error`` (a BadInput) naming the folder.

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
        policy, config = trainer.load_policy(path, step=step)
    except (FileNotFoundError, ValueError, KeyError) as e:
        raise error(f"{flag}={workdir}: cannot load the policy checkpoint: {e}") from None
    except Exception as e:  # orbax / tensorstore errors on a corrupt checkpoint
        raise error(f"{flag}={workdir}: checkpoint is corrupt or unreadable "
                    f"({type(e).__name__}: {str(e)[:300]})") from None
    loaded = LoadedPolicy(policy.apply_fn, policy.params, policy.meta, config, str(path))
    _POLICY_CACHE[cache_key] = loaded
    return loaded
