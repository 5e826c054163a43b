"""Calibrated synthetic step traces: a latent per-step error model rendered into a step-tree forest.

Everything here is **synthetic** data (``meta.json`` says ``"synthetic": true`` and the model
names start with ``synthetic-``); it imitates, it does not reproduce, the Qwen2.5-Math 1.5B / 7B
instruct pair of docs/design.md §2.

Latent model (per problem ``p``, step ``k = 0 .. L_p - 1``)
------------------------------------------------------------
* ``L_p`` steps per solution: ``L_p = clip(steps_base + Poisson(steps_extra), steps_min,
  steps_max)`` (gsm8k: 3 + Poisson(2.0) in [3, 10], mean ~5.0; gaokao2023en: 4 + Poisson(3.0)
  in [4, 14], mean ~7.0; mmlu_stem: 2 + Poisson(1.5) in [2, 8], mean ~3.5). Every path of a
  problem has ``L_p`` steps: both candidates of a node at depth ``L_p - 1`` are terminal.
* Problem difficulty ``d_p ~ N(0, 1)``, step hardness ``g_pk ~ N(0, step_sd^2)``.
* SLM step error probability ``e_S = sigmoid(alpha_s + beta * d_p + g_pk)``.
* The LLM fails where the SLM fails with probability ``r = sigmoid(alpha_r + beta_r * d_p)``
  and slips where the SLM is right with probability ``f`` (``llm_slip``), so each step has one
  of four types: none, S-only error (the LLM step is worth it), L-only error, both.
* An error is absorbing: a path's final answer is right iff none of its steps is an error of
  the model that produced it. Step types belong to the problem's k-th step, so every node at
  depth k shares them (nodes differ in features, tokens, PRM noise and prefix correctness).
  Consequently, on problems without L-only errors, choosing the LLM at more steps never hurts:
  mixed paths land between all-SLM and all-LLM.

Calibration (analytic, no search over seeds)
--------------------------------------------
``alpha_s`` solves ``mean_p prod_k (1 - e_S) = acc_slm`` and then ``alpha_r`` solves
``mean_p prod_k (1 - e_L) = acc_llm`` with ``e_L = e_S r + (1 - e_S) f``; both by bisection on
the drawn ``d, g, L``, so the *expected* accuracies equal the published ones exactly. The
realisation then draws each problem's outcome class (all-SLM right?, all-LLM right?) with
systematic PPS sampling (problems sorted by how much the SLM outcome shifts the LLM one), which
keeps each problem's marginal probabilities exact while the realised counts stay within about
two problems of their expectation; step types are then drawn from the per-step model
conditioned on the class. The all-SLM / all-LLM accuracies therefore land within a few tenths
of a point of the targets on every seed at full size.

Observables
-----------
* ``prm``: a noisy, optionally miscalibrated read of ``v`` = P(final correct | prefix) under the
  model (0 once the prefix holds an error; else the SLM's prior probability of finishing
  cleanly; terminal candidates: the realised correctness), except that each read overlooks an
  error with probability ``prm_miss`` (reads the prefix as clean); clipped to [0.02, 0.98]:
  ``prm = sigmoid((1 + prm_miscalibration) * logit(v) + prm_noise * N(0, 1))``.
  ``prm`` of a child equals ``cand_prm`` of the parent candidate that created it.
* ``feat`` (F = 16, ``FEATURE_NAMES``): the SLM draft's latent quality
  ``q = feature_signal * (1 - 2 * slm_error) - 0.4 * d_p + N(0, 1)`` read through a fixed random
  10-dim projection with 6 nuisance latents and noise (``hid_*``), token log-prob mean / min /
  entropy of the draft (noisy linear in ``q``), step index / 10, context tokens / 1000, draft
  tokens / 100. The edge never sees the PRM or the LLM step.
* Tokens: prompt ``~ LogNormal(log(prompt_median), 0.35)``; SLM draft
  ``~ LogNormal(log(step_median), 0.45) * (1.2 if the draft is an error else 1)``; LLM step
  ``~ LogNormal(log(0.9 * step_median), 0.40)``; all >= 3. ``ctx_tokens`` of a child = parent's
  ``ctx_tokens`` + the chosen candidate's tokens.

Tree shape
----------
Nodes at depth < ``full_depth`` expand every non-terminal candidate. Deeper, each node expands
the candidate of the action that led to it (the "sticky" continuation, so the all-SLM and
all-LLM paths are always complete) and, while a problem's projected node count stays within
``node_budget``, also the other candidate, in order of probability under a behaviour policy
that picks the LLM with probability ``behaviour_llm``. An unexpanded non-terminal candidate
falls back to its sibling's child (``fallback``). Node ids are contiguous per problem.

Generation is vectorised NumPy over all problems per depth level, deterministic from
``np.random.default_rng(seed)``. ``meta["splits"]`` holds the train / validation / test
problem indices (``prada_jax.traces.splits.problem_split``), drawn afterwards from a stream of
their own, so the parts share the one feature projection and calibration of the whole set.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from prada_jax.errors import BadInput
from prada_jax.presets import BENCHMARKS
from prada_jax.traces.format import TraceFormatError, TraceSet, load, save
from prada_jax.traces.splits import problem_split

FEATURE_NAMES = tuple([f"hid_{i}" for i in range(10)]
                      + ["logp_mean", "logp_min", "entropy", "step_index_div10",
                         "ctx_tokens_div1000", "draft_tokens_div100"])


@dataclasses.dataclass(frozen=True)
class Preset:
    """Benchmark-like settings of one synthetic preset (see the module docstring)."""

    benchmark: str
    problems: int          # published test-set size
    acc_slm: float         # published Qwen2.5-Math-1.5B-Instruct CoT accuracy, fraction
    acc_llm: float         # published Qwen2.5-Math-7B-Instruct CoT accuracy, fraction
    steps_base: int        # L = clip(steps_base + Poisson(steps_extra), steps_min, steps_max)
    steps_extra: float
    steps_min: int
    steps_max: int
    prompt_median: float   # prompt tokens (chat template + question), median
    step_median: float     # SLM draft tokens per step, median
    beta: float = 1.0      # spread of problem difficulty on the SLM error logit
    step_sd: float = 0.6   # per-step hardness sd on the SLM error logit
    beta_r: float = 1.0    # difficulty slope of P(LLM also fails | SLM fails)
    llm_slip: float = 0.005  # P(LLM errs | SLM right) per step


PRESETS: dict[str, Preset] = {
    "gsm8k": Preset("gsm8k", 1319, 0.848, 0.952, 3, 2.0, 3, 10, 130.0, 40.0, llm_slip=0.002),
    "gaokao2023en": Preset("gaokao2023en", 385, 0.655, 0.668, 4, 3.0, 4, 14, 190.0, 60.0,
                           llm_slip=0.02),
    "mmlu_stem": Preset("mmlu_stem", 3018, 0.575, 0.719, 2, 1.5, 2, 8, 170.0, 45.0,
                        llm_slip=0.01),
}

assert tuple(PRESETS) == BENCHMARKS, "prada_jax.presets.BENCHMARKS is the one preset list"

DEFAULTS = dict(prm_noise=1.0, prm_miscalibration=0.0, prm_miss=0.2, full_depth=4, node_budget=64,
                behaviour_llm=0.3, feature_signal=0.85)

_V_CLIP = 0.02


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p):
    return np.log(p) - np.log1p(-p)


def _bisect_decreasing(fn, target: float, lo: float = -30.0, hi: float = 30.0) -> float:
    """x with fn(x) = target for a decreasing fn, by bisection (raises if out of range)."""
    f_lo, f_hi = fn(lo), fn(hi)
    if not (f_hi <= target <= f_lo):
        raise ValueError(f"target {target:.4f} outside reachable range [{f_hi:.4f}, {f_lo:.4f}]")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if fn(mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _systematic(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Systematic PPS sampling: Bernoulli(pi_i) marginals, total within 1 of sum(pi)."""
    c = np.concatenate([[0.0], np.cumsum(np.clip(pi, 0.0, 1.0))])
    u = rng.uniform()
    k = np.floor(c + u)
    return (k[1:] - k[:-1]) > 0


def _first_occurrence(x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draws independent Bernoulli(x) flags per row conditioned on at least one being set.

    Args:
      x: [R, K] per-step probabilities; mask: [R, K] valid steps (each row needs some x > 0).
    Returns:
      [R, K] bool flags, exact draws from the conditional law.
    """
    x = np.where(mask, x, 0.0)
    surv = np.cumprod(np.concatenate([np.ones((x.shape[0], 1)), 1.0 - x[:, :-1]], axis=1), axis=1)
    w = surv * x
    cw = np.cumsum(w, axis=1)
    u = rng.uniform(size=(x.shape[0], 1)) * cw[:, -1:]
    first = np.minimum(np.sum(cw <= u, axis=1), x.shape[1] - 1)
    cols = np.arange(x.shape[1])[None, :]
    later = rng.uniform(size=x.shape) < x
    return np.where(cols < first[:, None], False, np.where(cols == first[:, None], True, later)) & mask


def _calibrate(pre: Preset, d: np.ndarray, g: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """alpha_s, alpha_r such that the expected all-SLM / all-LLM accuracies hit the targets."""
    def acc_s(a):
        e = _sigmoid(a + pre.beta * d[:, None] + g)
        return float(np.mean(np.exp(np.sum(np.where(mask, np.log1p(-e), 0.0), axis=1))))

    alpha_s = _bisect_decreasing(acc_s, pre.acc_slm)
    e_s = _sigmoid(alpha_s + pre.beta * d[:, None] + g)

    def acc_l(a):
        r = _sigmoid(a + pre.beta_r * d)[:, None]
        e_l = e_s * r + (1.0 - e_s) * pre.llm_slip
        return float(np.mean(np.exp(np.sum(np.where(mask, np.log1p(-e_l), 0.0), axis=1))))

    try:
        alpha_r = _bisect_decreasing(acc_l, pre.acc_llm)
    except ValueError as e:
        raise ValueError(f"preset {pre.benchmark}: acc_llm not reachable with llm_slip="
                         f"{pre.llm_slip}: {e}") from None
    return alpha_s, alpha_r


def _step_types(pre, e_s, r, mask, rng):
    """Realises per-step error flags (E_S, E_L) [P, K] with variance-reduced outcome classes."""
    f = pre.llm_slip
    q_none = (1 - e_s) * (1 - f)
    q_s = e_s * (1 - r)
    q_l = (1 - e_s) * f
    logsum = lambda a: np.sum(np.where(mask, np.log(np.maximum(a, 1e-300)), 0.0), axis=1)  # noqa: E731
    p_sok = np.exp(logsum(1 - e_s))
    p_okok = np.exp(logsum(q_none))
    p_lok = np.exp(logsum(q_none + q_s))
    p_errok = np.clip(p_lok - p_okok, 0.0, 1.0)
    pi_l_sok = np.clip(p_okok / np.maximum(p_sok, 1e-300), 0.0, 1.0)
    pi_l_serr = np.clip(p_errok / np.maximum(1.0 - p_sok, 1e-300), 0.0, 1.0)
    n = e_s.shape[0]
    # Stage 1: SLM outcome, ordered by the LLM-probability shift (implicit stratification).
    order = np.lexsort((rng.uniform(size=n), pi_l_sok - pi_l_serr))
    s_ok = np.empty(n, bool)
    s_ok[order] = _systematic(p_sok[order], rng)
    # Stage 2: LLM outcome given the SLM outcome.
    order2 = rng.permutation(n)
    pi2 = np.where(s_ok, pi_l_sok, pi_l_serr)
    l_ok = np.empty(n, bool)
    l_ok[order2] = _systematic(pi2[order2], rng)

    es = np.zeros_like(mask)
    el = np.zeros_like(mask)
    rows = s_ok & ~l_ok   # L-only errors, at least one
    if rows.any():
        el[rows] = _first_occurrence(q_l[rows] / (q_none[rows] + q_l[rows]), mask[rows], rng)
    rows = ~s_ok & l_ok   # S-only errors, at least one
    if rows.any():
        es[rows] = _first_occurrence(q_s[rows] / (q_none[rows] + q_s[rows]), mask[rows], rng)
    idx = np.flatnonzero(~s_ok & ~l_ok)  # >= 1 SLM error and >= 1 LLM error: rejection
    forced = 0
    for _ in range(2000):
        if idx.size == 0:
            break
        m = mask[idx]
        s_err = _first_occurrence(e_s[idx], m, rng)
        u = rng.uniform(size=m.shape)
        l_err = np.where(s_err, u < r[idx], u < f) & m
        ok = l_err.any(axis=1)
        es[idx[ok]], el[idx[ok]] = s_err[ok], l_err[ok]
        idx = idx[~ok]
    if idx.size:  # practically unreachable; keeps the class by making the first SLM error shared
        m = mask[idx]
        s_err = _first_occurrence(e_s[idx], m, rng)
        first = np.argmax(s_err, axis=1)
        l_err = np.zeros_like(s_err)
        l_err[np.arange(idx.size), first] = True
        es[idx], el[idx] = s_err, l_err
        forced = int(idx.size)
    return es, el, forced


def _prm_read(v, noise, miscal, rng):
    v = np.clip(v, _V_CLIP, 1 - _V_CLIP)
    z = (1.0 + miscal) * _logit(v) + noise * rng.normal(size=v.shape)
    return _sigmoid(z).astype(np.float32)


def generate(preset: str, seed: int = 0, problems: int | None = None,
             prm_noise: float | None = None, prm_miscalibration: float | None = None,
             prm_miss: float | None = None,
             full_depth: int | None = None, node_budget: int | None = None,
             behaviour_llm: float | None = None,
             feature_signal: float | None = None) -> tuple[TraceSet, dict]:
    """Generates a calibrated synthetic trace set.

    Args:
      preset: ``gsm8k``, ``gaokao2023en`` or ``mmlu_stem``.
      seed: seed of ``np.random.default_rng``; same seed, same arrays.
      problems: number of problems (default: the benchmark's published count).
      prm_noise: sd of the Gaussian noise on the PRM logit (default 1.0), >= 0.
      prm_miscalibration: ``m`` in ``sigmoid((1 + m) logit(v))``; 0 calibrated, > 0
        over-confident, in (-1, 0) under-confident (default 0).
      prm_miss: probability that the PRM overlooks an error in the prefix it scores and reads
        it as clean (default 0.2), in [0, 1].
      full_depth: depth above which trees are complete (default 4), >= 0.
      node_budget: per-problem node count beyond which no optional branch is expanded
        (default 64; the sticky continuations are always kept).
      behaviour_llm: P(LLM) of the behaviour policy ranking optional branches (default 0.3).
      feature_signal: strength of the draft-error signal in the features (default 0.85).

    Returns:
      ``(traces, meta)``: a ``TraceSet`` of NumPy arrays and the meta dict for ``format.save``.
    """
    pre, opts, n = _options(preset, problems, dict(
        prm_noise=prm_noise, prm_miscalibration=prm_miscalibration, prm_miss=prm_miss,
        full_depth=full_depth, node_budget=node_budget, behaviour_llm=behaviour_llm,
        feature_signal=feature_signal))
    rng = np.random.default_rng(seed)
    latent = _draw_latents(pre, opts, n, rng)
    recs = _grow_trees(pre, opts, latent, rng)
    traces = _assemble(recs, n)
    meta = {
        "benchmark": pre.benchmark,
        "synthetic": True,
        "models": {"slm": "synthetic-slm-1.5b", "llm": "synthetic-llm-7b",
                   "prm": "synthetic-prm"},
        "feature_names": list(FEATURE_NAMES),
        "generator": {
            "kind": "prada_jax.traces.synthetic", "preset": preset, "seed": int(seed),
            "problems": n, **{k: (float(v) if isinstance(v, float) else v)
                              for k, v in opts.items()},
            "targets": {"acc_slm": pre.acc_slm, "acc_llm": pre.acc_llm},
            "calibrated": {"alpha_s": latent.alpha_s, "alpha_r": latent.alpha_r},
            "preset_params": dataclasses.asdict(pre),
            "forced_class_repairs": latent.forced,
        },
        # Drawn after the set, from a stream of its own: the parts share one feature map.
        "splits": problem_split(n, seed),
    }
    return traces, meta


def _options(preset: str, problems, overrides: dict) -> tuple[Preset, dict, int]:
    """``(preset, options, problem count)`` after validation; ``overrides`` maps option names
    to values or None (use ``DEFAULTS``). Raises ``BadInput`` naming a bad argument."""
    if preset not in PRESETS:
        raise BadInput(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    pre = PRESETS[preset]
    opts = dict(DEFAULTS)
    for k, v in overrides.items():
        if v is not None:
            opts[k] = v
    n = pre.problems if problems is None else int(problems)
    if n < 1:
        raise BadInput(f"problems must be >= 1, got {problems}")
    if not opts["prm_noise"] >= 0:
        raise BadInput(f"prm_noise must be >= 0, got {opts['prm_noise']}")
    if not opts["prm_miscalibration"] > -1:
        raise BadInput(f"prm_miscalibration must be > -1, got {opts['prm_miscalibration']}")
    if not 0.0 <= opts["prm_miss"] <= 1.0:
        raise BadInput(f"prm_miss must be in [0, 1], got {opts['prm_miss']}")
    if int(opts["full_depth"]) < 0:
        raise BadInput(f"full_depth must be >= 0, got {opts['full_depth']}")
    if not 0.0 < opts["behaviour_llm"] < 1.0:
        raise BadInput(f"behaviour_llm must be in (0, 1), got {opts['behaviour_llm']}")
    return pre, opts, n


@dataclasses.dataclass(frozen=True)
class _Latents:
    """The latent problem/step model of ``n`` problems (module docstring), K = max steps.

    steps [n] int64 L_p; d [n] difficulty; err_s, err_l [n, K] bool step errors of the SLM /
    LLM; fut [n, K + 1] prior P(SLM finishes steps j.. cleanly); prompt [n] prompt tokens;
    w_proj [10, 8] the feature projection; alpha_s, alpha_r the calibrated offsets; forced the
    outcome-class repairs of ``_step_types``.
    """

    steps: np.ndarray
    d: np.ndarray
    err_s: np.ndarray
    err_l: np.ndarray
    fut: np.ndarray
    prompt: np.ndarray
    w_proj: np.ndarray
    alpha_s: float
    alpha_r: float
    forced: int

    @property
    def kmax(self) -> int:
        return int(self.steps.max())


def _draw_latents(pre: Preset, opts: dict, n: int, rng: np.random.Generator) -> _Latents:
    """Draws and calibrates the latent problem/step model (the first draws of ``rng``)."""
    steps = np.clip(pre.steps_base + rng.poisson(pre.steps_extra, size=n), pre.steps_min,
                    pre.steps_max).astype(np.int64)
    kmax = int(steps.max())
    mask = np.arange(kmax)[None, :] < steps[:, None]
    d = rng.normal(size=n)
    g = rng.normal(scale=pre.step_sd, size=(n, kmax))
    alpha_s, alpha_r = _calibrate(pre, d, g, mask)
    e_s = np.where(mask, _sigmoid(alpha_s + pre.beta * d[:, None] + g), 0.0)
    r = np.broadcast_to(_sigmoid(alpha_r + pre.beta_r * d)[:, None], e_s.shape)
    err_s, err_l, forced = _step_types(pre, e_s, r, mask, rng)
    # fut[p, j]: prior P(SLM finishes steps j.. cleanly); fut[p, L_p] = 1.
    log1m = np.where(mask, np.log1p(-e_s), 0.0)
    fut = np.exp(np.concatenate([np.cumsum(log1m[:, ::-1], axis=1)[:, ::-1],
                                 np.zeros((n, 1))], axis=1))
    prompt = np.maximum(3, np.round(rng.lognormal(np.log(pre.prompt_median), 0.35, size=n)))
    w_proj = rng.normal(scale=1 / np.sqrt(8), size=(10, 8))
    return _Latents(steps=steps, d=d, err_s=err_s, err_l=err_l, fut=fut, prompt=prompt,
                    w_proj=w_proj, alpha_s=alpha_s, alpha_r=alpha_r, forced=forced)


def _grow_trees(pre: Preset, opts: dict, latent: _Latents, rng: np.random.Generator) -> list:
    """The trees, breadth-first over all problems at once (temporary ids in creation order).

    Returns one record per depth level: a dict of node arrays (``id``, the ``TraceSet`` node
    fields and ``problem``) for the frontier expanded at that depth.
    """
    n, kmax, steps = latent.steps.size, latent.kmax, latent.steps
    full_depth, budget = int(opts["full_depth"]), int(opts["node_budget"])
    lp_b = np.log([1 - opts["behaviour_llm"], opts["behaviour_llm"]])
    recs = []
    fr_id = np.arange(n)
    fr_p = np.arange(n)
    fr_clean = np.ones(n, bool)
    fr_ctx = latent.prompt.astype(np.int64)
    fr_sticky = np.zeros(n, np.int64)
    fr_blogp = np.zeros(n)
    v_root = latent.fut[:, 0]
    fr_prm = _prm_read(v_root, opts["prm_noise"], opts["prm_miscalibration"], rng)
    count = np.ones(n, np.int64)  # nodes per problem so far
    next_id = n
    for k in range(kmax):
        m = fr_id.size
        if m == 0:
            break
        p = fr_p
        term = steps[p] - 1 == k
        cand_err = np.stack([latent.err_s[p, k], latent.err_l[p, k]], axis=1)
        child_clean = fr_clean[:, None] & ~cand_err
        terminal = np.repeat(term[:, None], 2, axis=1)
        correct = terminal & child_clean
        cand_prm, cand_tokens, feat = _observe_level(pre, opts, latent, rng, k, p, terminal,
                                                     child_clean, fr_ctx)
        if k < full_depth:
            expand = np.zeros((m, 2), bool)
            expand[:] = ~terminal
        else:
            expand = _expand_deep(latent, budget, lp_b, k, p, term, count, fr_id, fr_sticky,
                                  fr_blogp)
        child = np.full((m, 2), -1, np.int64)
        n_new = int(expand.sum())
        child[expand] = next_id + np.arange(n_new)
        next_id += n_new
        one = expand.sum(axis=1) == 1
        fallback = np.where(one, np.where(expand[:, 0], child[:, 0], child[:, 1]), -1)
        recs.append(dict(id=fr_id, feat=feat, prm=fr_prm, cand_prm=cand_prm,
                         cand_tokens=cand_tokens, ctx_tokens=fr_ctx, child=child,
                         terminal=terminal, correct=correct, fallback=fallback,
                         depth=np.full(m, k), problem=p))
        pi, ci = np.nonzero(expand)       # row-major: matches the id assignment above
        count += np.bincount(p[pi], minlength=n)
        fr_id = child[pi, ci]
        fr_p = p[pi]
        fr_clean = child_clean[pi, ci]
        fr_ctx = fr_ctx[pi] + cand_tokens[pi, ci]
        fr_sticky = ci
        fr_blogp = fr_blogp[pi] + lp_b[ci]
        fr_prm = cand_prm[pi, ci]
    return recs


def _observe_level(pre: Preset, opts: dict, latent: _Latents, rng: np.random.Generator, k: int,
                   p, terminal, child_clean, fr_ctx):
    """The observables of the m frontier nodes at depth ``k`` (problems ``p`` [m]).

    Returns ``(cand_prm [m, 2] float32, cand_tokens [m, 2] int64, feat [m, F])``.
    """
    m = p.size
    err_s, d = latent.err_s, latent.d
    v_next = latent.fut[p, np.minimum(k + 1, latent.kmax)]
    v_clean = np.where(terminal, 1.0, v_next[:, None])
    seen = rng.uniform(size=(m, 2)) >= opts["prm_miss"]   # the PRM notices the error
    v = np.where(child_clean | ~seen, v_clean, 0.0)
    cand_prm = _prm_read(v, opts["prm_noise"], opts["prm_miscalibration"], rng)
    tok_s = rng.lognormal(np.log(pre.step_median), 0.45, size=m) * np.where(err_s[p, k], 1.2, 1.0)
    tok_l = rng.lognormal(np.log(0.9 * pre.step_median), 0.40, size=m)
    cand_tokens = np.maximum(3, np.round(np.stack([tok_s, tok_l], axis=1))).astype(np.int64)
    q = (opts["feature_signal"] * (1 - 2 * err_s[p, k].astype(float)) - 0.4 * d[p]
         + rng.normal(size=m))
    lat = np.concatenate([q[:, None], -d[p][:, None], rng.normal(size=(m, 6))], axis=1)
    hid = np.einsum("mi,ji->mj", lat, latent.w_proj) + 0.5 * rng.normal(size=(m, 10))
    feat = np.concatenate([
        hid,
        (-0.30 + 0.10 * q + 0.05 * rng.normal(size=m))[:, None],
        (-2.00 + 0.50 * q + 0.30 * rng.normal(size=m))[:, None],
        (0.60 - 0.15 * q + 0.10 * rng.normal(size=m))[:, None],
        np.full((m, 1), k / 10.0),
        (fr_ctx / 1000.0)[:, None],
        (cand_tokens[:, 0] / 100.0)[:, None],
    ], axis=1)
    return cand_prm, cand_tokens, feat


def _expand_deep(latent: _Latents, budget: int, lp_b, k: int, p, term, count, fr_id, fr_sticky,
                 fr_blogp):
    """Which candidates of the frontier at depth ``k >= full_depth`` get a child: [m, 2] bool.

    The sticky continuation always; the other candidate, most behaviour-likely first, while
    the problem's projected node count stays within ``budget``.
    """
    m = p.size
    n, steps = latent.steps.size, latent.steps
    expand = np.zeros((m, 2), bool)
    rows = np.arange(m)
    expand[rows, fr_sticky] = ~term
    # Optional branches: the other candidate, most behaviour-likely first, within budget.
    n_front = np.bincount(p, minlength=n)
    projected = count + n_front * np.maximum(steps - 1 - k, 0)
    allowed = np.maximum(budget - projected, 0) // np.maximum(steps - 1 - k, 1)
    other = 1 - fr_sticky
    score = fr_blogp + lp_b[other]
    order = np.lexsort((fr_id, -score, p))
    first_of = np.searchsorted(p[order], p[order], side="left")
    rank = np.empty(m, np.int64)
    rank[order] = np.arange(m) - first_of
    extra = ~term & (rank < allowed[p])
    expand[rows, other] |= extra
    return expand


def _assemble(recs: list, n: int) -> TraceSet:
    """Renumbers the level records problem-major (creation order within a problem) into a
    ``TraceSet`` of NumPy arrays."""
    cat = {key: np.concatenate([r_[key] for r_ in recs]) for key in recs[0]}
    tmp_id = cat.pop("id")
    total = tmp_id.size
    perm = np.lexsort((tmp_id, cat["problem"]))    # new order: problem-major, creation order
    new_of_tmp = np.empty(total, np.int64)
    new_of_tmp[tmp_id[perm]] = np.arange(total)
    out = {key: val[perm] for key, val in cat.items()}
    for key in ("child", "fallback"):
        a = out[key]
        out[key] = np.where(a >= 0, new_of_tmp[np.maximum(a, 0)], -1)
    n_nodes = np.bincount(out["problem"], minlength=n)
    root = np.concatenate([[0], np.cumsum(n_nodes)[:-1]])
    return TraceSet(
        feat=out["feat"].astype(np.float32), prm=out["prm"].astype(np.float32),
        cand_prm=out["cand_prm"].astype(np.float32),
        cand_tokens=out["cand_tokens"].astype(np.int32),
        ctx_tokens=out["ctx_tokens"].astype(np.int32), child=out["child"].astype(np.int32),
        terminal=out["terminal"].astype(np.uint8), correct=out["correct"].astype(np.uint8),
        fallback=out["fallback"].astype(np.int32), depth=out["depth"].astype(np.int32),
        problem=out["problem"].astype(np.int32), root=root.astype(np.int32),
        n_nodes=n_nodes.astype(np.int32), answer_id=np.arange(n, dtype=np.int32))


def get_or_make(preset: str, cache_dir: os.PathLike | str, seed: int = 0,
                problems: int | None = None) -> Path:
    """Path of a saved synthetic trace set, generating and saving it first if missing/invalid.

    The folder is ``<cache_dir>/<preset>_seed<seed>_n<problems|full>``.
    """
    path = Path(cache_dir) / f"{preset}_seed{seed}_n{'full' if problems is None else problems}"
    if path.is_dir():
        try:
            load(path)
            return path
        except TraceFormatError:
            pass
    traces, meta = generate(preset, seed=seed, problems=problems)
    save(traces, path, meta)
    return path
