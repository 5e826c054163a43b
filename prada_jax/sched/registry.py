"""The tuple of schedulers the env switches over (``lax.switch`` on an int in the env params)."""
from __future__ import annotations

from prada_jax.sched.baselines import fifo_greedy, keep_local, offload_all, random_sched, rsd
from prada_jax.sched.threshold import threshold_decide, threshold_fifo_decide

#: The paper's schedulers: name -> index into ``SCHEDULERS``; the env's ``params.scheduler``
#: holds the index. Tests and evaluations that sweep "every scheduler" iterate over these.
#: ``threshold_fifo`` is an ablation (the value filter with a first-come repair), appended so
#: the other indices keep their values.
SCHEDULER_NAMES = ("keep_local", "offload_all", "random", "fifo_greedy", "threshold", "rsd",
                   "threshold_fifo")
SCHEDULERS = (keep_local, offload_all, random_sched, fifo_greedy, threshold_decide, rsd,
              threshold_fifo_decide)
RSD_INDEX = SCHEDULER_NAMES.index("rsd")
THRESHOLD_INDEX = SCHEDULER_NAMES.index("threshold")


def scheduler_index(name_or_index) -> int:
    """Index of a scheduler given its name or index; raises ``ValueError`` naming the field."""
    if isinstance(name_or_index, str):
        if name_or_index not in SCHEDULER_NAMES:
            raise ValueError(f"scheduler must be one of {SCHEDULER_NAMES}, got "
                             f"{name_or_index!r}")
        return SCHEDULER_NAMES.index(name_or_index)
    i = int(name_or_index)
    if not 0 <= i < len(SCHEDULERS):
        raise ValueError(f"scheduler index must be in [0, {len(SCHEDULERS)}), got {i}")
    return i
