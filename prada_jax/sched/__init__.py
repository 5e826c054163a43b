"""Stage-2 server schedulers: Lagrangian threshold rule and baselines (one pure signature)."""
from prada_jax.sched.base import (IMMEDIATE, LOCAL, QUEUE, SchedInputs, SchedParams,
                                  greedy_fill, greedy_fill_ranked, prefix_admit, priority_rank)
from prada_jax.sched.baselines import fifo_greedy, keep_local, offload_all, random_sched, rsd
from prada_jax.sched.registry import (RSD_INDEX, SCHEDULER_NAMES, SCHEDULERS,
                                      scheduler_index)
from prada_jax.sched.threshold import (advantages, threshold_decide, threshold_rule,
                                       threshold_soft)
