"""The host-side state of a distillation run beside its train state (what curves and results count).

:class:`HostState` holds what the ``distill/*`` and ``cost/*`` curves and ``results.json``
count between checkpoints (sampled-turn histograms, metric sums, tokens, tool calls, per-update
cost records) plus two process-local timing fields that are not stored. It is replaced
(``_replace``), never changed in place: :mod:`prada_jax.distill.host_update` returns a new one
after every update and :func:`log_scalars` after every log. :class:`SeedRecords` holds the
per-seed objects that change in place (samplers, results dicts) and :class:`RunFiles` the open
workdir (checkpointer, one curve writer per seed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from prada_jax.distill import opd as opd_lib


class HostState(NamedTuple):
    """Host-side state that feeds curves and ``results.json``, stored in every checkpoint
    (:meth:`to_json`; ``window`` and ``calls`` excepted: they time this process only), so a
    resumed run's curves and results equal an uninterrupted run's."""

    turn_hist: np.ndarray           # [N, num_turns] sampled-turn histogram per seed (rows)
    env_calls: int = 0              # the task's tool calls during training
    update_times: tuple = ()        # [s] per timed update (no compile)
    tokens_done: int = 0            # tokens since the last log (all seeds)
    acc: dict = {}                  # metric sums since the last log ([N, ...] when N > 1)
    costs: tuple = ()               # per-update cost records (opd.RoundStats fields + timed)
    cost_logged: int = 0            # costs[:cost_logged] are in the curves already
    # this process only (not checkpointed): (seconds, tokens) of the timed updates since the
    # last log, and the updates run so far (the first of a process compiles and is not timed)
    window: tuple = ()
    calls: int = 0

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
        """Inverse of :meth:`to_json` (the timing fields start empty)."""
        costs = tuple(dict(c) for c in h.get("costs", []))   # absent in older checkpoints
        return cls(turn_hist=np.asarray(h["turn_hist"], np.float64).reshape(num_seeds, -1),
                   env_calls=int(h["env_calls"]),
                   update_times=tuple(float(x) for x in h["update_times"]),
                   tokens_done=int(h["tokens_done"]),
                   acc={k: (int(v) if k == "n" else np.asarray(v, np.float64))
                        for k, v in h["acc"].items()},
                   costs=costs, cost_logged=int(h.get("cost_logged", len(costs))))


class SeedRecords(NamedTuple):
    """Per-seed host objects of a run, changed in place as it goes."""

    samplers: list                  # TurnSampler per seed (adaptive schedules re-weight it)
    results: list                   # results dict per seed (evaluations, ratio records, gate)
    prompts: dict                   # replayed teacher prefixes, memoised by pair index


class RunFiles(NamedTuple):
    """Where a run writes: its workdir, checkpointer and one curve writer per seed (None, None
    and [] for a run without a workdir)."""

    workdir: Path | None = None
    ckpt: Any = None
    writers: tuple = ()


def log_scalars(host: HostState, num_turns: int, stacked: bool
                ) -> tuple[list[dict], HostState]:
    """The ``distill/*`` and ``cost/*`` scalars averaged since the last log, one dict per seed
    (``distill/tokens_per_s`` — all seeds' tokens — and ``distill/update_s`` over the timed
    updates of the window, omitted when it has none), and ``host`` with the window reset."""
    acc = dict(host.acc)
    n = acc.pop("n")
    timing = {}
    if host.window:
        secs = [w[0] for w in host.window]
        timing["distill/tokens_per_s"] = (sum(w[1] for w in host.window)
                                          / max(sum(secs), 1e-9))
        timing["distill/update_s"] = float(np.median(secs))
    timing.update(opd_lib.cost_scalars(list(host.costs[host.cost_logged:]), list(host.costs)))
    out = []
    for i in range(len(host.turn_hist)):
        a = {k: v[i] for k, v in acc.items()} if stacked else acc
        scal = {"distill/loss": a["loss"] / n, "distill/kl": a["kl"] / n,
                "distill/grad_norm": a["grad_norm"] / n, "distill/env_calls": host.env_calls}
        scal.update(timing)
        if "fkl" in a:
            scal["distill/fkl"] = a["fkl"] / n
        cnt, hist = a["kl_turn_count"], host.turn_hist[i]
        for t in range(num_turns):
            if cnt[t] > 0:
                scal[f"distill/kl_turn_{t}"] = a["kl_turn_sum"][t] / cnt[t]
            scal[f"distill/turn_frac_{t}"] = hist[t] / max(hist.sum(), 1)
        out.append(scal)
    return out, host._replace(acc={}, tokens_done=0, cost_logged=len(host.costs), window=())
