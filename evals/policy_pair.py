"""The hardware pair a policy was trained under, and the check that a verdict evaluates it only
under that pair (issue 33 item 5).

Every step of a verdict (policy training, the learners' rollouts, every evaluated row) runs one
pair, ``env.hardware`` (``prada_jax.latency.PAIRS``; docs/latency.md). A policy stores its pair
in ``policy_meta.json`` (``hardware``; absent = ``paper``, a run stored before pairs existed). A
verdict asked to run a policy under another pair than the one it was trained under is refused
(``BadInput``, exit 2, naming the flag and the folder), like a policy trained on another split
or trace set: the screening policy's nominations were learned for one clock's latencies, so a
number under another clock would describe a policy nobody trained for it.
"""
from __future__ import annotations

from prada_jax import latency
from prada_jax.errors import BadInput


def policy_pair(meta: dict) -> str:
    """The hardware pair a policy was trained under (``meta``: its ``policy_meta.json``)."""
    hw = meta.get("hardware") if isinstance(meta, dict) else None
    return str(hw) if hw else latency.PAPER


def check_policy_pair(meta: dict, hardware: str, where: str, flag: str = "--hardware") -> None:
    """``BadInput`` naming ``flag`` and ``where`` unless the policy of ``meta`` was trained
    under ``hardware``."""
    got = policy_pair(meta)
    if got != str(hardware):
        raise BadInput(f"{flag}={hardware}: {where} was trained under hardware {got!r} "
                       f"(policy_meta.json hardware); the verdict runs {hardware!r} in every "
                       "step, so train (train.policy_samples) or pass a policy of that pair")
