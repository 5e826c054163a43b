"""A declared GPU cost model of a distillation update: prices counts on ``prada_jax.latency``'s
roofline hardware profiles (issue 44, item 7).

The CPU wall clock of this repository is throughput-bound (2 cores, tiny models); the paper's
≥ 4× per-rollout speed-up comes from latency-bound GPU decoding with long turns and slow tools.
This module states, as pure functions, what an update would cost on a GPU given what it did:

* :class:`Counts` — what an update did: ``supervised_turns``; ``gen_rounds`` (sequential
  student generation rounds: OPD plays turn t+1 only after the tool answered turn t, ReOPD
  generates every row's action in one round); ``decode_steps`` (decode steps summed over the
  rounds: a round runs until its longest action stops); ``parallel`` (sequences decoded
  together in a round); ``generated_tokens``; ``decode_context`` (mean tokens in context per
  decoding sequence); ``student_prefill_tokens`` and ``prefill_seq_len`` (tokens the student
  prefills — questions, tool replies, replayed prefixes — and the mean sequence length they
  attend over); ``teacher_prefill_tokens`` and ``teacher_seq_len`` (tokens the teacher forwards
  to score, in sequences of that mean length); ``tool_rounds`` (rounds that wait on the tool;
  concurrent calls of a round wait once); ``train_tokens`` (tokens through the student's
  forward + backward in the step).
* :func:`price` — seconds of each phase on one GPU (a ``latency.HardwareProfile``) with the
  student and teacher priced as ``latency.ModelSpec``\\ s:

  - decode: ``decode_steps × decode_step_s(student, hw, parallel, parallel × decode_context)``
    (the roofline step of ``latency``: weights + KV read once per step, or FLOP-bound);
  - student prefill: ``gen_rounds`` batched passes over ``student_prefill_tokens`` in total,
    each ``max(FLOPs/(peak·η), W/(BW·η_mem))`` with FLOPs = ``(n/ℓ) · prefill_flops(ℓ)``
    (``n`` tokens in sequences of length ``ℓ`` = ``prefill_seq_len``);
  - teacher scoring: one batched pass over ``teacher_prefill_tokens`` (``ℓ`` =
    ``teacher_seq_len``), priced the same way with the teacher's spec;
  - the step: ``3 · 2 · P_student · train_tokens`` FLOPs at ``peak·η`` (forward + backward; the
    attention term left out);
  - tool: ``tool_rounds × tool_latency_s``.

  ``total_s`` is their sum (phases do not overlap: one GPU, one update at a time) and
  ``per_turn_s`` = ``total_s / supervised_turns``: **the unit of every ratio here is seconds
  per supervised turn** (at equal supervised turns per update, the same as per update).
* :func:`scenario` — closed-form counts of one OPD or ReOPD update of a parametrised workload
  (turns K, tokens per turn m, parallel episodes E, question and tool-reply tokens, κ), with
  ReOPD at equal supervised turns (B = E·K rows);
* :func:`ratio`, :func:`break_even_latency` — OPD / ReOPD cost per supervised turn, and the
  tool latency [seconds per tool round] at which it reaches a target (1: parity; 4: the paper).

Every figure is an *assumption* carried from ``latency``'s profiles (datasheet peaks, assumed
η = 0.5, η_mem = 0.8); the model ignores kernel launch overheads, scheduling gaps and
host-side tool parallelism, so it prices the mechanism, not a measured GPU.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable

from prada_jax import latency

GPU_PROFILES = ("a100_80gb_bf16", "h100_sxm_bf16")
COUNT_FIELDS = ("supervised_turns", "gen_rounds", "decode_steps", "parallel",
                "generated_tokens", "decode_context", "student_prefill_tokens",
                "prefill_seq_len", "teacher_prefill_tokens", "teacher_seq_len", "tool_rounds",
                "train_tokens")
PHASES = ("decode_s", "student_prefill_s", "teacher_s", "step_s", "tool_s")


@dataclasses.dataclass(frozen=True)
class Counts:
    """What one update did (see the module docstring); every field a finite number >= 0."""

    supervised_turns: float
    gen_rounds: float
    decode_steps: float
    parallel: float
    generated_tokens: float
    decode_context: float
    student_prefill_tokens: float
    prefill_seq_len: float
    teacher_prefill_tokens: float
    teacher_seq_len: float
    tool_rounds: float
    train_tokens: float

    def __post_init__(self):
        for f in COUNT_FIELDS:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"Counts.{f} must be a finite number >= 0, got {v!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def profile(name: str) -> latency.HardwareProfile:
    """One of :data:`GPU_PROFILES` (``latency.PROFILES``); ValueError naming the choices."""
    if name not in GPU_PROFILES:
        raise ValueError(f"hardware {name!r} is not a GPU profile; choose from {GPU_PROFILES}")
    return latency.PROFILES[name]()


def _pass_s(spec: latency.ModelSpec, hw: latency.HardwareProfile, n: float, seq_len: float
            ) -> float:
    """One batched forward pass over ``n`` tokens in sequences of mean length ``seq_len``."""
    if n <= 0:
        return 0.0
    ell = max(float(seq_len), 1.0)
    flops = (n / ell) * float(latency.prefill_flops(spec, ell))
    t_flop = flops / (float(hw.peak_flops) * float(hw.eta))
    t_mem = float(latency.model_weight_bytes(spec, hw)) / (float(hw.mem_bw) * float(hw.eta_mem))
    return max(t_flop, t_mem)


def price(c: Counts, hw: latency.HardwareProfile, student: latency.ModelSpec,
          teacher: latency.ModelSpec, tool_latency_s: float) -> dict:
    """Seconds of each phase (:data:`PHASES`), ``total_s`` and ``per_turn_s`` [s per supervised
    turn; None when the update supervised no turn] of the update ``c``."""
    if not (math.isfinite(tool_latency_s) and tool_latency_s >= 0):
        raise ValueError(f"tool_latency_s must be a finite number >= 0, got {tool_latency_s!r}")
    out = {}
    if c.decode_steps > 0 and c.parallel > 0:
        step = float(latency.decode_step_s(student, hw, c.parallel,
                                           c.parallel * c.decode_context))
        out["decode_s"] = c.decode_steps * step
    else:
        out["decode_s"] = 0.0
    rounds = max(c.gen_rounds, 1.0)
    out["student_prefill_s"] = (c.gen_rounds * _pass_s(student, hw, c.student_prefill_tokens
                                                       / rounds, c.prefill_seq_len)
                                if c.gen_rounds > 0 else 0.0)
    out["teacher_s"] = _pass_s(teacher, hw, c.teacher_prefill_tokens, c.teacher_seq_len)
    out["step_s"] = 6.0 * float(student.params) * c.train_tokens / (
        float(hw.peak_flops) * float(hw.eta))
    out["tool_s"] = c.tool_rounds * tool_latency_s
    out["total_s"] = sum(out[p] for p in PHASES)
    out["per_turn_s"] = out["total_s"] / c.supervised_turns if c.supervised_turns > 0 else None
    return out


def mean_turn(turns: int, kappa: float) -> float:
    """Mean supervised turn index t under p(t) ∝ κ^t, t = 0 … turns − 1."""
    w = [kappa ** t for t in range(turns)]
    return sum(t * x for t, x in enumerate(w)) / sum(w)


def scenario(method: str, *, turns: int, tokens_per_turn: float, episodes: float,
             question_tokens: float = 32.0, reply_tokens: float = 16.0,
             kappa: float = 0.6) -> Counts:
    """Counts of one update of a parametrised workload (closed form).

    ``opd``: ``episodes`` = E episodes played together, each ``turns`` = K turns of ``m`` =
    ``tokens_per_turn`` tokens, a tool reply of ``r`` tokens after every turn but the last
    (the answer), the question ``q`` tokens; K sequential generation rounds of m decode steps
    at batch E, K − 1 tool rounds, the teacher scoring each whole episode once.
    ``reopd``: B = E·K rows (equal supervised turns), one generation round of m steps at batch
    B after replayed prefixes of ``q + t̄ (m + r)`` tokens (t̄ = :func:`mean_turn` under κ), the
    teacher forwarding every prefix with its action, no tool.
    """
    K, m, E, q, r = int(turns), float(tokens_per_turn), float(episodes), float(question_tokens), \
        float(reply_tokens)
    if K < 1 or m <= 0 or E <= 0 or q < 0 or r < 0:
        raise ValueError(f"scenario needs turns >= 1, tokens_per_turn > 0, episodes > 0, "
                         f"question/reply tokens >= 0; got {turns}, {m}, {E}, {q}, {r}")
    if method == "opd":
        prefix = q + (K - 1) / 2.0 * (m + r)          # mean context before a turn
        episode = q + K * m + (K - 1) * r
        return Counts(supervised_turns=E * K, gen_rounds=K, decode_steps=K * m, parallel=E,
                      generated_tokens=E * K * m, decode_context=prefix + m / 2.0,
                      student_prefill_tokens=E * (q + (K - 1) * r), prefill_seq_len=prefix,
                      teacher_prefill_tokens=E * episode, teacher_seq_len=episode,
                      tool_rounds=K - 1, train_tokens=E * K * (prefix + m))
    if method == "reopd":
        if not 0 < kappa <= 1:
            raise ValueError(f"kappa must lie in (0, 1], got {kappa!r}")
        B = E * K
        prefix = q + mean_turn(K, kappa) * (m + r)
        return Counts(supervised_turns=B, gen_rounds=1, decode_steps=m, parallel=B,
                      generated_tokens=B * m, decode_context=prefix + m / 2.0,
                      student_prefill_tokens=B * prefix, prefill_seq_len=prefix,
                      teacher_prefill_tokens=B * (prefix + m), teacher_seq_len=prefix + m,
                      tool_rounds=0, train_tokens=B * (prefix + m))
    raise ValueError(f"method must be 'opd' or 'reopd', got {method!r}")


def ratio(opd: Counts, reopd: Counts, hw, student, teacher, tool_latency_s: float) -> float:
    """OPD / ReOPD modelled seconds per supervised turn (ReOPD never waits on the tool)."""
    a = price(opd, hw, student, teacher, tool_latency_s)["per_turn_s"]
    b = price(reopd, hw, student, teacher, 0.0)["per_turn_s"]
    return a / b


def break_even_latency(opd: Counts, reopd: Counts, hw, student, teacher,
                       target: float = 1.0) -> float | None:
    """The tool latency [seconds per tool round] at which OPD / ReOPD per supervised turn equals
    ``target`` (closed form: OPD's cost is linear in it). 0.0 when the ratio is already >=
    ``target`` without any latency; None when OPD has no tool rounds and stays below it."""
    a = price(opd, hw, student, teacher, 0.0)["total_s"] / opd.supervised_turns
    b = price(reopd, hw, student, teacher, 0.0)["per_turn_s"]
    slope = opd.tool_rounds / opd.supervised_turns     # seconds per turn per second of latency
    if a >= target * b:
        return 0.0
    if slope <= 0:
        return None
    return (target * b - a) / slope


def sweep(hw_name: str, student: latency.ModelSpec, teacher: latency.ModelSpec, *,
          turns: Iterable[int], tokens_per_turn: Iterable[float], latencies_s: Iterable[float],
          episodes: Iterable[float], kappa: float = 0.6, question_tokens: float = 32.0,
          reply_tokens: float = 16.0) -> list[dict]:
    """The OPD / ReOPD ratio [per supervised turn] over the grid, each row with the break-even
    latencies for parity and for 4× [s per tool round]."""
    hw = profile(hw_name)
    rows = []
    for K in turns:
        for m in tokens_per_turn:
            for E in episodes:
                kw = dict(turns=K, tokens_per_turn=m, episodes=E,
                          question_tokens=question_tokens, reply_tokens=reply_tokens)
                o, r = scenario("opd", **kw), scenario("reopd", kappa=kappa, **kw)
                be1 = break_even_latency(o, r, hw, student, teacher, 1.0)
                be4 = break_even_latency(o, r, hw, student, teacher, 4.0)
                for L in latencies_s:
                    rows.append({"hardware": hw_name, "turns": K, "tokens_per_turn": m,
                                 "episodes": E, "tool_latency_s": L, "kappa": kappa,
                                 "ratio": ratio(o, r, hw, student, teacher, L),
                                 "break_even_s_parity": be1, "break_even_s_4x": be4})
    return rows
