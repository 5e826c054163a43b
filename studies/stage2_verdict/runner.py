"""Stage-2 verdict, the runner: paired evaluation of every row on one scenario (``Runner``, the
multiplier grid, ``evaluate_scenario``), the learners it trains and the whole ``run``."""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from envs import edge, scenarios, stage2
from evals import evaluate as ev
from evals import grid, suite
from studies.stage2_verdict.report import (BUDGET_TOLERANCE, METRICS, ROW_BEST, ROW_COND, ROW_CONST,
                                 ROW_FIFO, ROW_FILTER, ROW_HINDSIGHT, ROW_LLM, ROW_NOLIM,
                                 ROW_ZERO, budget_report, scenario_report, schedule_report,
                                 write_outputs)
from prada_jax import config_utils, latency
from prada_jax.errors import BadInput
from prada_jax.sched.registry import SCHEDULER_NAMES
from prada_jax.dual import learner
from prada_jax.configs import dual as dual_cfg
from train import pipeline, policy_samples


_ENV_KEYS = ("num_users", "num_servers", "bandwidth_hz", "arrival_rate_hz", "beta", "tau_s")

# Sizes. ``full`` is what studies/stage2_verdict/results/issue14/stage2.md was measured with (unless it says otherwise).
# ``scenario_length`` L: slot t of every seed reads the preset's schedule at index t mod L, so a
# preset whose own cycle does not divide L is cut at L and restarts (``outage_burst*``: a
# 400-slot outage cycle in L = 600 puts outages at slots [0, 120) and [400, 520) of every 600).
# The measured window [warmup, slots) counts every slot as the env ran it; each scenario's
# ``schedule`` report (``schedule_report``) gives the share of measured slots with fewer
# units, M_t < M, so partial cycles are stated, not hidden.
# ``env``: overrides of the policy run's env (the scarce server of these scenarios: M = 1 LLM
# job at a time; an assumption chosen so that the contended presets load it, see docs/dual.md).
SIZES = {
    "quick": dict(seeds=2, slots=240, warmup=40, scenario_length=240, num_users=16,
                  eval_problems=60, env={"num_servers": 1, "arrival_rate_hz": 12.0},
                  ppo_variant="smoke", ppo_overrides={},
                  dual={"train.num_envs": 4, "train.rollout_len": 40, "train.num_chunks": 3,
                        "train.sgd_steps": 5, "dual.anneal_steps": 15},
                  grid=dict(lam=(0.0, 0.01, 0.1), mu_per_mhz=(0.0,), fine=False),
                  hindsight=True),
    "demo": dict(seeds=5, slots=1200, warmup=100, scenario_length=600, num_users=32,
                 eval_problems=None, env={"num_servers": 1, "arrival_rate_hz": 12.0},
                 ppo_variant="", ppo_overrides={"ppo.total_env_steps": 16 * 64 * 150},
                 dual={"train.num_envs": 8, "train.rollout_len": 50, "train.num_chunks": 8,
                       "train.sgd_steps": 10, "dual.anneal_steps": 80},
                 grid=dict(lam=None, mu_per_mhz=(0.0,), fine=True), hindsight=False),
    "full": dict(seeds=8, slots=1200, warmup=150, scenario_length=600, num_users=32,
                 eval_problems=None, env={"num_servers": 1, "arrival_rate_hz": 12.0},
                 ppo_variant="", ppo_overrides={"ppo.total_env_steps": 16 * 64 * 150},
                 dual={"train.num_envs": 8, "train.rollout_len": 100, "train.num_chunks": 8,
                       "train.sgd_steps": 20, "dual.anneal_steps": 160},
                 grid=dict(lam=None, mu_per_mhz=(0.0, 1e-2), fine=True), hindsight=True),
}



# ----------------------------------------------------------------------------- evaluation

GRID_BATCH = 8  # grid pairs per vmapped call (memory: 8 × seeds × one env rollout)


@functools.lru_cache(maxsize=8)
def conditioned_mult_fn(dcfg):
    """``mult_fn(learner_state, env_state, params, action, env_key) -> (λ_s, µ per Hz)`` of a
    conditioned learner with static config ``dcfg``: the slot's load features exactly as the
    learner computed them (``envs.stage2.env_slot`` on the noise ``edge.step``
    will draw from ``env_key``). Cached: one compiled evaluator per config."""
    def fn(learner_state, state, params, action, env_key):
        _, batch = stage2.env_slot(state, action, params, edge.draw_noise(env_key, params))
        m = learner.multipliers(learner_state, dcfg, batch.load)
        return m.lambda_s.astype(jnp.float32), m.mu.astype(jnp.float32)

    return fn


@functools.lru_cache(maxsize=8)
def _grid_fn(fn):
    """``fn`` (an ``evals.evaluate`` evaluator) vmapped over multiplier pairs (λ_s [G], µ [G])."""
    def one(keys, params, net_params, lam, mu, screen):
        p = params.replace(lambda_s=lam, mu=mu)
        return fn(keys, p, net_params, screen, jnp.float32(0.0))
    return jax.jit(jax.vmap(one, in_axes=(None, None, None, 0, 0, None)))


class Runner:
    """Evaluates rows on one env (params) over S paired seeds with ``evals.evaluate``'s
    evaluator (one for constant prices, one per conditioned learner config).

    Args:
      params: env params of the scenario (trace set, U, M, B, λ, schedule); ``runner.params``
        may be replaced between scenarios (same shapes).
      seeds: S; seed s uses ``jax.random.key(seed0 + s)`` in every row.
      slots, warmup: slots simulated per seed and discarded at the start.
      apply_fn, net_params: the screening policy.
      nominate_by: "actor" (the policy's greedy action) or "critic" (ΔQ > 0) in every row
        that runs the policy.
    """

    def __init__(self, params, seeds, slots, warmup, apply_fn, net_params, seed0=0,
                 nominate_by: str = "actor"):
        self.params = params
        self.screen = "policy" if nominate_by == "actor" else "critic"  # evals.evaluate mode
        self._args = dict(seeds=seeds, num_slots=int(slots), warmup_slots=int(warmup),
                          apply_fn=apply_fn, net_params=net_params, seed0=seed0)
        self.evaluator = ev.Evaluator(params, **self._args)

    def run(self, spec: ev.PolicySpec, evaluator: ev.Evaluator | None = None,
            mult_params=None) -> dict:
        """Per-seed metrics [S] of a row (``evaluator``: the constant-price one if None)."""
        evaluator = evaluator or self.evaluator
        evaluator.base_params = self.params
        return evaluator.run(spec, mult_params)

    def prada_spec(self, sched_index: int, lambda_s: float = 0.0, mu: float = 0.0
                   ) -> ev.PolicySpec:
        """The PRADA row at constant (λ_s, µ per Hz) under scheduler ``sched_index``."""
        return ev.PolicySpec("PRADA", self.screen, SCHEDULER_NAMES[sched_index],
                             float(lambda_s), float(mu))

    def run_prada(self, sched_index: int, lambda_s: float, mu: float) -> dict:
        """Per-seed metrics of PRADA at the constant pair (λ_s, µ per Hz)."""
        return self.run(self.prada_spec(sched_index, lambda_s, mu))

    def run_conditioned(self, sched_index: int, learner_state, dcfg) -> dict:
        """Per-seed metrics of PRADA with per-slot multipliers from the conditioned map."""
        evaluator = ev.Evaluator(self.params, **self._args,
                                 mult_fn=conditioned_mult_fn(dcfg))
        return self.run(self.prada_spec(sched_index), evaluator, learner_state)

    def run_grid(self, sched_index: int, lams, mus, batch: int = GRID_BATCH,
                 budget: float | None = None) -> np.ndarray:
        """Objective per seed [G, S] of PRADA at G constant pairs, vmapped over the pairs in
        batches of ``batch`` (the last one padded, so every call reuses one compilation).
        With an occupancy ``budget`` (share of M), a pair whose mean server utilisation over
        the seeds exceeds it gets NaN on every seed (``evals.grid`` ranks it last)."""
        lams = np.asarray(lams, np.float32)
        mus = np.asarray(mus, np.float32)
        n = lams.shape[0]
        e = self.evaluator
        p = ev.apply_spec(self.params, self.prada_spec(sched_index))
        out = []
        for i in range(0, n, batch):
            la, mu = lams[i:i + batch], mus[i:i + batch]
            pad = batch - la.shape[0]
            la = np.concatenate([la, np.repeat(la[-1:], pad)])
            mu = np.concatenate([mu, np.repeat(mu[-1:], pad)])
            totals = jax.device_get(_grid_fn(e.evaluate_fn)(
                e.keys, p, e.net_params, jnp.asarray(la), jnp.asarray(mu),
                ev.screen_mode(self.screen)))
            for g in range(batch - pad):
                m = e.metrics({k: v[g] for k, v in totals.items()}, p)
                obj = np.asarray(m["objective"], np.float64)
                if budget is not None and not np.nanmean(m["server_util"]) <= budget:
                    obj = np.full_like(obj, np.nan)
                out.append(obj)
        return np.asarray(out)


# ----------------------------------------------------------------------------- one scenario

def baseline_specs(screen: str = "policy") -> dict:
    """The baseline rows of a stage-2 table by name (``ROW_ZERO`` maps to None: the PRADA rule
    at zero prices, run with the dual run's scheduler); ``studies.stage2_pooled.headroom`` runs
    ``ROW_NOLIM`` from it."""
    return {ROW_ZERO: None,  # PRADA rule at 0 (scheduler of the dual run)
            ROW_FIFO: ev.PolicySpec(ROW_FIFO, screen, "fifo_greedy"),
            ROW_FILTER: ev.PolicySpec(ROW_FILTER, screen, "threshold_fifo"),
            ROW_NOLIM: ev.PolicySpec(ROW_NOLIM, screen, "offload_all", unlimited=True),
            ROW_LLM: ev.PolicySpec(ROW_LLM, "always", "offload_all")}


def evaluate_scenario(runner: Runner, sched_index: int, const, cond_state, dcfg_cond,
                      grid_kw: dict, log=print, choice_runner: Runner | None = None,
                      hindsight: bool = True, budget: float | None = None,
                      best_grid: dict | None = None) -> dict:
    """Per-seed metrics of every row plus the grid reports on one scenario.

    The reference constant pair is chosen by the grid on ``choice_runner`` (validation
    problems and seeds; ``runner`` itself if None) and evaluated on ``runner``; with
    ``hindsight`` the grid is also searched on ``runner``'s own seeds (an optimistic,
    labelled row). With an occupancy ``budget`` the grids keep only budget-feasible pairs
    (mean server utilisation ≤ budget on the seeds they are searched on). ``best_grid``: the
    validation grid's report from an earlier call with the same policy, scenario, choice
    seeds and budget (it does not depend on the learner; ``run``'s ``grid_cache``), reused
    instead of searched again."""
    per_seed = {}
    per_seed[ROW_CONST] = runner.run_prada(sched_index, const[0], const[1])
    if cond_state is not None:
        per_seed[ROW_COND] = runner.run_conditioned(sched_index, cond_state, dcfg_cond)
    chooser = choice_runner or runner
    grids = {}
    for row, r in ((ROW_BEST, chooser), (ROW_HINDSIGHT, runner if hindsight else None)):
        if r is None:
            continue
        if row == ROW_BEST and best_grid is not None:
            g = best_grid
            log(f"    grid ({row}): reused ({g['evaluated']} pairs), best "
                f"λ_s={g['best']['lambda_s']:.4g} µ={g['best']['mu_per_mhz']:.4g}/MHz")
            per_seed[row] = runner.run_prada(sched_index, g["best"]["lambda_s"],
                                             g["best"]["mu_per_mhz"] / 1e6)
            grids[row] = g
            continue
        t0 = time.perf_counter()
        g = grid.search(lambda lams, mus, r=r: r.run_grid(sched_index, lams, mus,
                                                          budget=budget), **grid_kw)
        log(f"    grid ({row}): {g['evaluated']} pairs in {time.perf_counter() - t0:.0f}s, "
            f"best λ_s={g['best']['lambda_s']:.4g} µ={g['best']['mu_per_mhz']:.4g}/MHz")
        if budget is not None:   # every pair over the cap scores -inf: say if none was left
            g["budget_feasible"] = g["best"]["objective"] is not None
            if not g["budget_feasible"]:
                log(f"    grid ({row}): no pair of the grid meets the budget {budget:g}; "
                    "the row shows its smallest pair")
        per_seed[row] = runner.run_prada(sched_index, g["best"]["lambda_s"],
                                         g["best"]["mu_per_mhz"] / 1e6)
        grids[row] = g
    g = dict(grids[ROW_BEST], chosen_on="validation" if choice_runner is not None
             else "the evaluated seeds")
    if ROW_HINDSIGHT in grids:
        g["hindsight"] = grids[ROW_HINDSIGHT]
    for row, spec in baseline_specs(runner.screen).items():
        per_seed[row] = (runner.run_prada(sched_index, 0.0, 0.0) if spec is None
                         else runner.run(spec))
    return {"per_seed": per_seed, "grid": g}


def check_budget(budget, flag: str = "--budget") -> float:
    """The occupancy cap as a float in (0, 1]; ``BadInput`` naming ``flag`` otherwise."""
    try:
        b = float(budget)
    except (TypeError, ValueError):
        b = float("nan")
    if not (math.isfinite(b) and 0.0 < b <= 1.0):
        raise BadInput(f"{flag}={budget}: the average server occupancy cap must be a number "
                       "in (0, 1]")
    return b


# ----------------------------------------------------------------------------- pipeline

def train_policy(out: Path, size: dict, log=print, hardware: str | None = None) -> Path:
    """Trains the screening policy (train.ppo library) into ``out/ppo`` or reuses it
    (``hardware``: its clock's pair, ``env.hardware``; None = the config's default)."""
    d = out / "ppo"
    c = pipeline.ppo_config("gsm8k", size["ppo_variant"], dict(
        size["ppo_overrides"], **({} if hardware is None else {"env.hardware": str(hardware)})))
    log(f"  ppo: training the screening policy ({c.ppo.total_env_steps} env slots) in {d}")
    pipeline.train_policy(c, d)
    return d


def parse_dual_overrides(text: str) -> dict:
    """``"utilisation=0.5,mode=subgradient"`` → ``{"dual.utilisation": 0.5, "dual.mode":
    "subgradient"}`` (numbers become floats). Keys must be fields of ``config.dual``; a bad
    one raises ``BadInput`` naming it. ``mode`` applies to the constant learner only (the
    conditioned map needs the differentiable mode)."""
    out = {}
    names = {f.name for f in dataclasses.fields(learner.DualConfig)}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        key, sep, val = item.partition("=")
        key = key.strip().removeprefix("dual.")
        if not sep or key not in names:
            raise BadInput(f"--dual_overrides: {item!r} is not FIELD=VALUE with FIELD in "
                           f"config.dual ({sorted(names)})")
        try:
            out[f"dual.{key}"] = float(val)
        except ValueError:
            out[f"dual.{key}"] = val.strip()
    # finite and float32-representable, like every --config field (config_utils.check_float32)
    try:
        config_utils.check_float32(out, "")
    except BadInput as e:
        raise BadInput(f"--dual_overrides: {e}") from None
    try:  # range checks before anything is written (the learner checks again)
        learner.config_from({k.split(".", 1)[1]: v for k, v in out.items()})
    except (ValueError, TypeError) as e:
        raise BadInput(f"--dual_overrides: {e}") from None
    return out


def _default_dual():
    """``config.dual`` of prada_jax/configs/dual.py (the learner's defaults)."""
    return dual_cfg.get_config().dual


def learn_multipliers(out: Path, scenario: str, policy_dir: Path, env_kw: dict, size: dict,
                      conditioned: bool, seed: int = 0, nominate_by: str = "actor",
                      dual_overrides: dict | None = None, tag: str = ""):
    """Runs the stage-2 learner on one scenario; returns (run dir, result dict, dcfg, the
    env params it trained on: their scheduler and value accounting are what PRADA rows run).
    ``seed``: the learner's ``config.seed`` (its rollouts' seeds in the validation range);
    ``tag``: a suffix of the run folder (one run per setting, e.g. a budget margin)."""
    d = out / "dual" / scenario / (("conditioned" if conditioned else "constant") + tag)
    if nominate_by != "actor":
        d = d.parent / f"{d.name}_{nominate_by}"
    fields = {"seed": int(seed), "policy_dir": str(policy_dir),
              **{f"env.{k}": env_kw[k] for k in _ENV_KEYS},
              "env.server_speed": float(env_kw.get("server_speed", 1.0)),
              **({"env.hardware": str(env_kw["hardware"])} if "hardware" in env_kw else {}),
              "env.scenario": scenario, "env.scenario_length": int(size["scenario_length"]),
              "env.problems": int(env_kw.get("train_problems", 0)),
              "env.split": str(env_kw.get("choice_split", "validation")),   # a choice
              "dual.conditioned": bool(conditioned), "policy.nominate_by": nominate_by}
    if conditioned:
        fields["dual.mode"] = "differentiable"  # the map is learned by gradient (Adam)
    fields.update(size["dual"])
    fields.update({k: v for k, v in (dual_overrides or {}).items()
                   if not (k == "dual.mode" and conditioned)})  # the map: by gradient
    c = pipeline.dual_config("gsm8k", "", fields)
    c.log.checkpoint_every = int(c.train.num_chunks)
    c.log.progress = False
    c.eval.gap_slots = 0
    result, dcfg, env_params = pipeline.learn_multipliers(c, d)
    return d, result, dcfg, env_params


def _value_accounting(dual_env, *runners_):
    """Every PRADA row runs the value accounting of the policy the dual run trained with."""
    for r in runners_:
        r.params = r.params.replace(policy_true_reward=dual_env.policy_true_reward)


def margin_tag(margin: float) -> str:
    """Run-folder suffix of the learners at budget margin δ (``_margin0.05``)."""
    return f"_margin{float(margin):g}"


#: Budget tightening (issue 33 item 2): the margins tried, ascending, and the share of
#: validation seeds on which the learned constant must keep the cap (within the tolerance).
TIGHTEN_DEFAULT = {"confidence": 0.9, "margins": (0.0, 0.05, 0.1, 0.2)}


def choose_margin(out: Path, scenario: str, policy_dir: Path, env_kw: dict, size: dict,
                  budget: float, tighten: dict, choice_runner: "Runner", runner: "Runner",
                  nominate_by: str = "actor", dual_overrides: dict | None = None,
                  seed: int = 0, log=print) -> dict:
    """The smallest margin δ of ``tighten["margins"]`` (ascending, each in [0, 1)) such that
    the constant pair learned with cap ``budget·(1 − δ)`` (validation split and seeds, learner
    ``seed``) keeps the per-seed occupancy ≤ ``budget·(1 + BUDGET_TOLERANCE)`` on at least a
    share ``tighten["confidence"]`` of the validation seeds (``choice_runner``). If none does,
    the largest δ, with ``met`` False. Returns ``{"margin", "met", "confidence", "limit",
    "tried": [{"margin", "lambda_s", "mu_per_mhz", "share_within", "occupancy_mean",
    "occupancy_per_seed"}]}`` (occupancy = busy units / M on validation seeds)."""
    q = float(tighten.get("confidence", TIGHTEN_DEFAULT["confidence"]))
    margins = sorted(float(m) for m in tighten.get("margins", TIGHTEN_DEFAULT["margins"]))
    if not (0.0 < q <= 1.0) or not margins or margins[0] < 0.0 or margins[-1] >= 1.0:
        raise BadInput(f"budget tightening: confidence must be in (0, 1] and margins in [0, 1), "
                       f"got {q}, {margins}")
    limit = budget * (1.0 + BUDGET_TOLERANCE)
    tried = []
    for m in margins:
        over = dict(dual_overrides or {}, **{"dual.utilisation": budget * (1.0 - m)})
        _, r, _, dual_env = learn_multipliers(out, scenario, policy_dir, env_kw, size, False,
                                              seed=seed, nominate_by=nominate_by,
                                              dual_overrides=over, tag=margin_tag(m))
        _value_accounting(dual_env, choice_runner, runner)
        lam, mu = float(r["multipliers"].lambda_s), float(r["multipliers"].mu)
        occ = np.asarray(choice_runner.run_prada(int(dual_env.scheduler), lam, mu)
                         ["server_util"], np.float64)
        share = float(np.mean(occ <= limit))
        tried.append({"margin": m, "lambda_s": lam, "mu_per_mhz": mu * 1e6,
                      "share_within": share, "occupancy_mean": float(np.nanmean(occ)),
                      "occupancy_per_seed": [float(v) for v in occ]})
        log(f"    margin {m:g}: learned λ_s={lam:.4g}; validation occupancy "
            f"{np.nanmean(occ):.3f}, within {limit:.4f} on {100 * share:.0f}% of seeds")
        if share >= q:
            return {"margin": m, "met": True, "confidence": q, "limit": limit, "tried": tried}
    return {"margin": margins[-1], "met": False, "confidence": q, "limit": limit,
            "tried": tried}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The keyword settings of :func:`run` (what each does: its docstring)."""
    seeds: int | None = None
    quick: bool = False
    policy_dir: str | None = None
    num_users: int | None = None
    size: str | None = None
    nominate_by: str = "actor"
    dual_overrides: dict | None = None
    split: str = suite.DEFAULT_SPLIT
    choice_split: str = "validation"
    budget: float | None = None
    seed0: int = 0
    hardware: str | None = None
    learner_seed: int = 0
    hindsight: bool | None = None
    tighten: dict | None = None


@dataclasses.dataclass
class _Setup:
    """What every scenario of one ``run`` shares: the size, the policy, its env and the two
    trace sets with their seed offsets."""
    size_name: str
    size: dict
    pol_dir: Path
    policy: object
    env_kw: dict
    traces: object
    choice_traces: object
    seed0: int
    choice_seed0: int


def run(out, scenario_names, log=print, grid_cache: dict | None = None, **settings) -> dict:
    """The whole verdict; writes stage2.json / .md / .png under ``out`` and returns the dict.

    ``settings`` are the fields of :class:`Settings`:
    ``size``: a key of ``SIZES`` (default "quick" if ``quick`` else "full"). ``nominate_by``:
    the policy nominates by its actor's greedy action ("actor") or iff its critic's ΔQ > 0
    ("critic"), in learning and in every policy row. ``dual_overrides``: ``config.dual``
    values for the learner (``parse_dual_overrides``; ``dual.mode`` for the constant pair
    only), recorded in ``meta``. ``split``: the part of the policy's trace set every row is
    evaluated on (test, with test-range seeds); ``choice_split``: the part the multipliers are
    learned on and the grid's reference pair is chosen on (validation, validation seeds).
    ``budget``: an operator's cap on the long-run average server occupancy (busy units / M,
    in (0, 1]): the learners enforce it as the time-averaged constraint Σ admissions × their
    own service time ≤ budget·M_t (``config.dual.utilisation``; an upper bound of the
    measured occupancy, ``prada_jax.dual.problem``), the grid reference is the best
    budget-feasible constant pair, and each scenario reports every row's occupancy against the cap.
    ``seed0``: the first evaluation seed as an offset into ``split``'s seed range (fresh seeds
    for a confirmation run; the validation seeds of the choices stay the same).
    ``learner_seed``: the learners' ``config.seed`` (a learner sample; issue 33).
    ``grid_cache``: a dict shared by calls with the same policy: the validation grid of a
    (policy, scenario, budget) is searched once and reused (it does not depend on the learner).
    ``hindsight``: overrides the size's hindsight row (False skips its per-call grid).
    ``tighten`` (with ``budget``): ``{"confidence": q, "margins": (δ, ...)}``: the learners'
    cap is ``budget·(1 − δ)`` with the smallest δ (ascending) whose learned constant keeps the
    occupancy ≤ budget·(1 + BUDGET_TOLERANCE) on at least a share q of the validation seeds
    (:func:`choose_margin`); the report's ``budget.margin`` says which and why."""
    s = Settings(**settings)
    if s.budget is not None:
        check_budget(s.budget)
        s = dataclasses.replace(s, dual_overrides=dict(
            s.dual_overrides or {}, **{"dual.utilisation": float(s.budget)}))
    out = Path(out)
    t_start = time.perf_counter()
    setup = _setup(out, s, log)
    result = {"scenarios": {}, "meta": _meta(out, s, setup)}
    hindsight = bool(setup.size.get("hindsight", True)) if s.hindsight is None else s.hindsight
    for name in scenario_names:
        result["scenarios"][name] = _run_scenario(out, name, s, setup, hindsight, grid_cache,
                                                  log, t_start)
        write_outputs(result, out)
    result["meta"]["wall_s"] = time.perf_counter() - t_start
    write_outputs(result, out)
    return result


def _setup(out: Path, s: Settings, log) -> _Setup:
    """The size, the policy (checked before anything is written: bad input exits 2 with no
    ``out``; trained under ``out/ppo`` when none is given), its env and the trace sets."""
    size_name = s.size or ("quick" if s.quick else "full")
    size = dict(SIZES[size_name])
    if s.seeds is not None:
        size["seeds"] = int(s.seeds)
    if s.num_users is not None:
        size["num_users"] = int(s.num_users)
    policy = suite.load_policy(str(s.policy_dir)) if s.policy_dir else None
    if policy is not None and s.hardware is not None:   # one clock in every step (issue 33)
        policy_samples.check_policy_pair(policy.meta, s.hardware, f"--policy={s.policy_dir}")
    out.mkdir(parents=True, exist_ok=True)
    pol_dir = Path(s.policy_dir) if s.policy_dir else train_policy(out, size, log, s.hardware)
    if policy is None:
        policy = suite.load_policy(str(pol_dir))
    env_kw = suite.env_kwargs_from(policy.config, dict(size.get("env", {}),
                                                       num_users=size["num_users"],
                                                       hardware=s.hardware))
    env_kw["train_problems"] = int(policy.config.env.get("problems", 0))
    env_kw["choice_split"] = s.choice_split
    # The same generated set the policy trained on (its problem count), restricted to a part.
    n_problems = env_kw["train_problems"] or None
    tseed = int(policy.config.env.trace_seed) + suite.HELD_OUT_SEED_OFFSET
    traces = suite.load_traces("gsm8k", n_problems, tseed, split=s.split)
    choice_traces = suite.load_traces("gsm8k", n_problems, tseed, split=s.choice_split)
    suite.check_policy_traces(policy, traces)
    seed0 = suite.evaluation_seed0(traces.info, policy, size["seeds"], seed0=int(s.seed0),
                                   flag="--seed0/--seeds")
    choice_seed0 = suite.evaluation_seed0(choice_traces.info, policy, size["seeds"],
                                          flag="--seeds")
    if traces.info["split"] == choice_traces.info["split"] and s.split != "all":
        raise BadInput(f"--split={s.split}: the table and the choices need different splits")
    return _Setup(size_name, size, pol_dir, policy, env_kw, traces, choice_traces, seed0,
                  choice_seed0)


def _meta(out: Path, s: Settings, st: _Setup) -> dict:
    """``stage2.json``'s ``meta`` (before ``wall_s``)."""
    size = st.size
    return {
        "synthetic": True, "traces": st.traces.info, **suite.policy_record(st.pol_dir, out),
        "split": st.traces.info["split"],
        "split_label": suite.split_label(st.traces.info, st.policy),
        "eval_seed_range": [st.seed0, st.seed0 + size["seeds"]],
        "choice_split": st.choice_traces.info["split"],
        "choice_seed_range": [st.choice_seed0, st.choice_seed0 + size["seeds"]],
        "env": {k: st.env_kw[k] for k in _ENV_KEYS + ("hardware",) if k in st.env_kw},
        "seeds": size["seeds"], "slots": size["slots"], "warmup_slots": size["warmup"],
        "scenario_length": size["scenario_length"], "size": st.size_name,
        "nominate_by": s.nominate_by,
        "dual_overrides": dict(size["dual"], **(s.dual_overrides or {})),
        "constant_mode": (s.dual_overrides or {}).get("dual.mode", _default_dual().mode),
        "budget": s.budget, "learner_seed": int(s.learner_seed), "tighten": s.tighten,
        "ci95": "half-width of the 95% Student-t interval"}


def _runners(st: _Setup, kw: dict, scenario: str, nominate_by: str):
    """(test runner, validation runner) on the env ``kw`` under ``scenario``."""
    args = {k: kw[k] for k in _ENV_KEYS}
    out = []
    for tr, s0 in ((st.traces, st.seed0), (st.choice_traces, st.choice_seed0)):
        p = edge.make_params(tr.traces, **args, **scenarios.latency_overrides(kw),
                             hardware=kw.get("hardware", latency.DEFAULT_PAIR),
                             scenario=scenarios.preset(scenario, st.size["scenario_length"]))
        out.append(Runner(p, st.size["seeds"], st.size["slots"], st.size["warmup"],
                          st.policy.apply_fn, st.policy.params, seed0=s0,
                          nominate_by=nominate_by))
    return out


def _learn_scenario(out: Path, name: str, s: Settings, st: _Setup, env_s: dict, runner,
                    choice_runner, log, t_start: float):
    """The budget margin (with ``budget`` and ``tighten``) and both learners of one scenario:
    returns (margin or None, constant result, conditioned result, its dcfg, the dual env)."""
    margin = None
    over = s.dual_overrides
    if s.budget is not None and s.tighten:
        log(f"[{time.perf_counter() - t_start:6.0f}s] scenario {name}: choosing the "
            "budget margin on validation")
        margin = choose_margin(out, name, st.pol_dir, env_s, st.size, s.budget, s.tighten,
                               choice_runner, runner, nominate_by=s.nominate_by,
                               dual_overrides=s.dual_overrides, seed=s.learner_seed, log=log)
        over = dict(s.dual_overrides or {},
                    **{"dual.utilisation": s.budget * (1.0 - margin["margin"])})
    tag = "" if margin is None else margin_tag(margin["margin"])
    log(f"[{time.perf_counter() - t_start:6.0f}s] scenario {name}: learning multipliers")
    _, r_const, _, dual_env = learn_multipliers(out, name, st.pol_dir, env_s, st.size, False,
                                                seed=s.learner_seed,
                                                nominate_by=s.nominate_by,
                                                dual_overrides=over, tag=tag)
    _, r_cond, dcfg_cond, _ = learn_multipliers(out, name, st.pol_dir, env_s, st.size, True,
                                                seed=s.learner_seed,
                                                nominate_by=s.nominate_by,
                                                dual_overrides=over, tag=tag)
    return margin, r_const, r_cond, dcfg_cond, dual_env


def _run_scenario(out: Path, name: str, s: Settings, st: _Setup, hindsight: bool,
                  grid_cache: dict | None, log, t_start: float) -> dict:
    """Learns, evaluates and reports one scenario (its entry of ``stage2.json``)."""
    size = st.size
    env_s = dict(st.env_kw, **scenarios.preset_env(name))   # the preset's own M, B, speed
    runner, choice_runner = _runners(st, env_s, name, s.nominate_by)
    margin, r_const, r_cond, dcfg_cond, dual_env = _learn_scenario(
        out, name, s, st, env_s, runner, choice_runner, log, t_start)
    const = (float(r_const["multipliers"].lambda_s), float(r_const["multipliers"].mu))
    sched = int(dual_env.scheduler)
    _value_accounting(dual_env, runner, choice_runner)
    log(f"[{time.perf_counter() - t_start:6.0f}s] scenario {name}: evaluating (learned "
        f"λ_s={const[0]:.4g}, µ={const[1] * 1e6:.4g}/MHz)")
    gkey = (str(Path(st.pol_dir).resolve()), name, s.budget, st.choice_seed0, size["seeds"],
            s.nominate_by, st.size_name)
    cached_grid = None if grid_cache is None else grid_cache.get(gkey)
    grid_kw = {k: v for k, v in size["grid"].items() if v is not None}
    ev_res = evaluate_scenario(runner, sched, const, r_cond["dual_state"], dcfg_cond,
                               grid_kw, log, choice_runner=choice_runner,
                               hindsight=hindsight, budget=s.budget, best_grid=cached_grid)
    if grid_cache is not None:
        grid_cache[gkey] = {k: v for k, v in ev_res["grid"].items()
                            if k not in ("chosen_on", "hindsight")}
    rep = scenario_report(ev_res["per_seed"])
    if s.budget is not None:
        rep["budget"] = budget_report(ev_res["per_seed"], s.budget)
        if margin is not None:
            rep["budget"]["margin"] = margin
    rep["multipliers"] = {"learned_constant": {"lambda_s": const[0],
                                               "mu_per_mhz": const[1] * 1e6},
                          "learned_conditioned_at_mean_load": {
                              "lambda_s": float(r_cond["multipliers"].lambda_s),
                              "mu_per_mhz": float(r_cond["multipliers"].mu) * 1e6},
                          "scheduler": SCHEDULER_NAMES[sched]}
    rep["grid"] = ev_res["grid"]
    rep["env"] = {k: env_s[k] for k in _ENV_KEYS + ("server_speed",) if k in env_s}
    rep["schedule"] = schedule_report(name, size["scenario_length"], size["slots"],
                                      size["warmup"], env_s["num_servers"])
    rep["per_seed"] = {r: {k: [float(x) for x in np.asarray(v[k])] for k in METRICS}
                       for r, v in ev_res["per_seed"].items()}
    return rep
