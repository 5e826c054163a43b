"""κ^t prefix sampler: draws (trajectory, agent turn t) pairs and packs them into static batches.

Turn index ``t`` is counted **from 0** (the first agent turn of a trajectory has t = 0 and
weight κ^0 = 1). Within a trajectory with K agent turns the supervised turn is drawn with

* ``schedule="kappa"``:      p(t) ∝ κ^t             (ReOPD; κ = 0.6 default, κ = 1 uniform)
* ``schedule="late"``:       p(t) ∝ κ^(K - 1 - t)   (late-step-heavy ablation, mirror image)

Trajectories are drawn uniformly, then t within the trajectory. (The authors' release fans a
K-turn trajectory into K rows and draws rows ∝ κ^t over the whole pool; :func:`pair_weights`
with ``per_trajectory=False`` reproduces that instead: p(i, t) ∝ κ^t over all pairs.)
The replayed prefix of turn t is every pool token of the trajectory before the turn, verbatim;
the target is the turn's action tokens.

Batch layout (static shapes, so one compile): ``prompt`` [B, P] left-padded with the prefix,
``action`` [B, A] right-padded with the target; the model input is ``concat(prompt, action)``
[B, P + A] with positions ``cumsum(mask) - 1``; the logits at column ``P - 1 + j`` predict
action token j.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from flax import struct

from prada_jax.distill.pool import Pool

SCHEDULES = ("kappa", "late")


def check_kappa(kappa: float, name: str = "kappa") -> float:
    k = float(kappa)
    if not (np.isfinite(k) and 0.0 < k <= 1.0):
        raise ValueError(f"{name} must lie in (0, 1], got {kappa!r}")
    return k


def turn_weights(num_turns: int, kappa: float, schedule: str = "kappa") -> np.ndarray:
    """[K] float64 normalised probabilities of each agent turn t = 0..K-1 of one trajectory."""
    kappa = check_kappa(kappa)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if num_turns < 1:
        raise ValueError(f"a trajectory needs >= 1 agent turn, got {num_turns}")
    t = np.arange(num_turns, dtype=np.float64)
    if schedule == "late":
        t = t[::-1]
    w = kappa ** t
    return w / w.sum()


def pair_index(pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """([K_total] int32 trajectory index, [K_total] int32 turn index t from 0) of every pool
    turn, in pool order."""
    counts = pool.turns_per_trajectory()
    offs = np.asarray(pool.turn_offsets, np.int64)
    traj = np.repeat(np.arange(counts.size), counts).astype(np.int32)
    turn = (np.arange(offs[-1]) - np.repeat(offs[:-1], counts)).astype(np.int32)
    return traj, turn


def pair_weights(pool: Pool, kappa: float, schedule: str = "kappa",
                 per_trajectory: bool = True) -> np.ndarray:
    """[K_total] float64 probability of each (trajectory, turn) pair in pool order."""
    counts = pool.turns_per_trajectory()
    if counts.size == 0:
        raise ValueError("the pool has no trajectories")
    if np.any(counts < 1):
        raise ValueError(f"trajectory {int(np.argmax(counts < 1))} of the pool has no agent "
                         "turns; cannot sample")
    parts = []
    for k in counts:
        w = turn_weights(int(k), kappa, schedule)
        if not per_trajectory:
            t = np.arange(k, dtype=np.float64)
            w = check_kappa(kappa) ** (t[::-1] if schedule == "late" else t)
        parts.append(w)
    w = np.concatenate(parts)
    return w / w.sum()


def exact_ratio_probs(pool: Pool, log_ratio: np.ndarray, ratio_min: float = 1e-3,
                      ratio_max: float = 10.0) -> np.ndarray:
    """[K_total] float64 pair probabilities: trajectories uniform, then p(t | i) ∝
    clip(br_{i,t}, ratio_min, ratio_max). The first turn has br = 1 by definition."""
    if not (0.0 < ratio_min <= 1.0 <= ratio_max):
        raise ValueError(f"need 0 < ratio_min <= 1 <= ratio_max, got {ratio_min!r}, "
                         f"{ratio_max!r}")
    lr = np.asarray(log_ratio, np.float64)
    w = np.exp(np.clip(lr, math.log(ratio_min), math.log(ratio_max)))
    offs = np.asarray(pool.turn_offsets, np.int64)
    counts = np.diff(offs)
    per_traj = np.add.reduceat(w, offs[:-1])
    return w / np.repeat(per_traj, counts) / counts.size


@struct.dataclass
class TurnBatch:
    """One padded batch (NumPy arrays; axis letters B batch, P prompt, A action).

    prompt: [B, P] int32 left-padded replayed prefixes; prompt_mask: [B, P] int32.
    action: [B, A] int32 right-padded target tokens; action_mask: [B, A] int32 (1 = loss).
    action_pos: [B, A] int64 absolute pool index of each action token (-1 = padding), used to
      gather teacher logits. traj: [B] int32; turn: [B] int32 turn index t (from 0).
    """

    prompt: Any
    prompt_mask: Any
    action: Any
    action_mask: Any
    action_pos: Any
    traj: Any
    turn: Any


class TurnSampler:
    """Draws batches of (trajectory, turn) pairs ∝ κ^t and pads them to static shapes.

    Args:
      pool: the trajectory pool.
      kappa: in (0, 1]; 1 = uniform over turns.
      schedule: "kappa" or "late" (see the module docstring).
      prompt_len / action_len: static P and A; default = the pool's maxima. A prefix longer
        than P keeps its last P tokens (left truncation, reported by ``truncated_prefixes``); an
        action longer than A raises.
      ratio_min / ratio_max: clip of the prefix likelihood ratio in :meth:`use_log_ratio`.

    The sampler owns its schedule state (the pair probabilities, the κ in force and, for
    exact-ratio weights, the per-pair log br): adaptive schedules change it only through
    :meth:`use_kappa` / :meth:`use_log_ratio`, and :meth:`schedule_state` /
    :meth:`load_schedule_state` carry it through a checkpoint.
    """

    def __init__(self, pool: Pool, kappa: float = 0.6, schedule: str = "kappa",
                 prompt_len: int | None = None, action_len: int | None = None,
                 per_trajectory: bool = True, ratio_min: float = 1e-3,
                 ratio_max: float = 10.0):
        self.pool = pool
        self.ratio_min, self.ratio_max = float(ratio_min), float(ratio_max)
        self.kappa = check_kappa(kappa)
        self.schedule = schedule
        self.probs = pair_weights(pool, kappa, schedule, per_trajectory)
        counts = pool.turns_per_trajectory()
        self.pair_traj, self.pair_turn = pair_index(pool)
        starts = np.asarray(pool.turn_starts)
        ends = np.asarray(pool.turn_ends)
        self.prefix_lens = starts - np.asarray(pool.traj_offsets)[self.pair_traj]
        self.action_lens = ends - starts
        self.P = int(prompt_len or self.prefix_lens.max())
        self.A = int(action_len or self.action_lens.max())
        if self.A < self.action_lens.max():
            raise ValueError(f"action_len {self.A} is shorter than the longest agent turn "
                             f"({int(self.action_lens.max())} tokens)")
        self.truncated_prefixes = int(np.sum(self.prefix_lens > self.P))
        self.max_turns = int(counts.max())
        self.log_ratio = None   # per-pair log br when set from an exact-ratio refresh

    def set_probs(self, probs: np.ndarray, kappa: float | None = None) -> None:
        """Replaces the pair probabilities (adaptive schedules, :mod:`prada_jax.distill.ratio`):
        ``probs`` [K_total] finite, >= 0, positive sum (renormalised here). ``kappa`` records
        the κ they came from, if any."""
        p = np.asarray(probs, np.float64)
        if p.shape != self.probs.shape:
            raise ValueError(f"probs must have one entry per pool turn {self.probs.shape}, got "
                             f"{p.shape}")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise ValueError("probs must be finite, non-negative and not all zero")
        self.probs = p / p.sum()
        if kappa is not None:
            self.kappa = check_kappa(kappa)

    def use_kappa(self, kappa: float) -> None:
        """κ^t sampling (trajectory uniform, then p(t) ∝ κ^t) with a new κ in (0, 1]."""
        self.set_probs(pair_weights(self.pool, kappa), kappa=kappa)
        self.log_ratio = None

    def use_log_ratio(self, log_ratio: np.ndarray) -> float:
        """Exact-ratio sampling: trajectory uniform, then p(t | i) ∝ clip(br_{i,t}, ratio_min,
        ratio_max) from ``log_ratio`` [K_total] (nats). Returns the share of pairs at the
        lower clip."""
        lr = np.asarray(log_ratio)
        self.set_probs(exact_ratio_probs(self.pool, lr, self.ratio_min, self.ratio_max))
        self.log_ratio = lr
        return float(np.mean(lr < np.log(self.ratio_min)))

    def schedule_state(self) -> dict:
        """JSON-able schedule state for a checkpoint (see :meth:`load_schedule_state`)."""
        return {"kappa": self.kappa,
                "log_ratio": None if self.log_ratio is None else self.log_ratio.tolist()}

    def load_schedule_state(self, state: dict) -> None:
        """Restores :meth:`schedule_state`: exact-ratio weights when it holds a ``log_ratio``,
        else κ^t weights with its ``kappa``."""
        if state.get("log_ratio") is not None:
            self.use_log_ratio(np.asarray(state["log_ratio"]))
            self.kappa = check_kappa(state["kappa"])
        else:
            self.use_kappa(state["kappa"])

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """[n] int64 indices into the pool's turn arrays, drawn ∝ the pair probabilities."""
        return rng.choice(self.probs.shape[0], size=n, p=self.probs)

    def batch(self, pairs: np.ndarray) -> TurnBatch:
        """Pads the given pair indices into a :class:`TurnBatch`."""
        pool = self.pool
        tokens = np.asarray(pool.tokens)
        B = len(pairs)
        prompt = np.zeros((B, self.P), np.int32)
        pmask = np.zeros((B, self.P), np.int32)
        action = np.zeros((B, self.A), np.int32)
        amask = np.zeros((B, self.A), np.int32)
        apos = np.full((B, self.A), -1, np.int64)
        for b, k in enumerate(pairs):
            s, e = int(pool.turn_starts[k]), int(pool.turn_ends[k])
            t0 = int(pool.traj_offsets[self.pair_traj[k]])
            lo = max(t0, s - self.P)
            n = s - lo
            if n:
                prompt[b, self.P - n:] = tokens[lo:s]
                pmask[b, self.P - n:] = 1
            action[b, : e - s] = tokens[s:e]
            amask[b, : e - s] = 1
            if n == 0:  # nothing precedes the first token: no prediction (nor teacher entry)
                amask[b, 0] = 0
            apos[b, : e - s] = np.arange(s, e)
        return TurnBatch(prompt=prompt, prompt_mask=pmask, action=action, action_mask=amask,
                         action_pos=apos, traj=self.pair_traj[pairs],
                         turn=self.pair_turn[pairs])

    def sample(self, rng: np.random.Generator, batch_size: int) -> TurnBatch:
        return self.batch(self.draw(rng, batch_size))
