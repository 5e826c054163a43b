"""The README's main job: ``python -m train.main --workdir=checkpoints/demo [--full | --smoke]``.

Runs the whole PRADA pipeline on the embedded **synthetic** traces and writes everything under
``--workdir``:

1. ``traces/``      the three synthetic presets (gsm8k, gaokao2023en, mmlu_stem) and their
                    summary table (problems, nodes, steps, tokens, all-SLM / all-LLM accuracy,
                    PRM calibration AUC) — ``traces/summary.txt``;
2. ``ppo/``         the stage-1 screening policy (``train.ppo`` library, orbax checkpoints, TB);
   ``critic/``      the same actor with its critic refit on Monte-Carlo action values of the
                    final actor (``prada_jax.rl.critic_refit``; ``critic_check.json``): the
                    policy every later stage uses (docs/ppo.md, "Critic calibration");
3. ``dual/``        the learned multipliers λ_s, µ (``prada_jax.dual.trainer``, what
                    ``python -m train.dual`` runs, in this process);
4. ``curve/``       the load curve, the headline (``evals.curve``): latency, accuracy,
                    objective, goodput and ρ of the server LLM alone, All-SLM, RSD and PRADA
                    against load λ/M on the test split, 8 seeds, with the crossover; it picks
                    the two table points by the rule of ``table_points``;
   ``eval/``        the benchmark table at those two points (``uncontended/``,
                    ``contended/``) on the **test split** (problems of the same generated
                    set the policy never trained on, evaluation seeds of the test range; mean
                    ± 95% CI over seeds), with the paper's All-LLM row (the server LLM alone),
                    ρ and flags per row, and the headline ratios against it; results.json /
                    .csv, figures, TB;
5. ``sweep/``       (``--full`` and ``--smoke`` only) accuracy / latency / delay components
                    against M, B and λ, with the knees (test split); ``python -m evals.sweep``
                    runs it on the demo's policy;
6. ``calibration/`` PRM calibration per benchmark (AUC, reliability diagram).

Stage 2's verdict (learned multipliers against λ_s = µ = 0, FIFO-greedy and the grid's best
pair on five scenarios) is no stage here: it is its own study,
``python -m studies.stage2_verdict``.

Protocol (docs/evals.md): one generated trace set per benchmark, split by problem
(``prada_jax.traces.splits``): PPO trains on ``train``; the critic refit and the dual learner
(choices) use ``validation`` problems and validation seeds; every table reports ``test`` with
test seeds and prints which split it is.

Default (demo): gsm8k only, sized to finish in under 10 minutes on a 2-core CPU. ``--full``:
the three-benchmark study (PPO at the ppo.py config's default size per preset, longer
evaluations, the PRM miscalibration stress test). ``--smoke``: tiny sizes for the tests.
Rerunning on the same workdir reuses every finished stage (a stage is redone only if its
settings changed; PPO and dual runs resume from their checkpoints). Every number printed comes
from synthetic traces and says so.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from envs import edge  # noqa: E402
from evals import calibration, curve, suite, sweep  # noqa: E402
from evals.capacity import run as capacity  # noqa: E402
from evals import evaluate as ev  # noqa: E402
from evals import pipeline  # noqa: E402
from prada_jax import cli, config_utils, latency  # noqa: E402
from prada_jax.errors import BadInput  # noqa: E402
from prada_jax.jsonio import read_json, write_json  # noqa: E402
from prada_jax.presets import BENCHMARKS as PRESETS  # noqa: E402  (the one preset list)
from prada_jax.rl import trainer  # noqa: E402
from prada_jax.dual import trainer as dual_trainer  # noqa: E402
from prada_jax.traces import stats as tstats  # noqa: E402
from prada_jax.traces import synthetic  # noqa: E402

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so importing this module (tests, other
    launchers) never clashes with another launcher's ``--workdir``."""
    flags.DEFINE_string("workdir", None, "Run directory for every stage's outputs.")
    flags.DEFINE_bool("full", False, "Run the full three-benchmark study (long).")
    flags.DEFINE_bool("smoke", False, "Tiny sizes (tests); numbers are meaningless.")
    flags.DEFINE_integer("seeds", None, "Evaluation seeds (default: 5; smoke: 2).", lower_bound=2)
    flags.DEFINE_bool("redo", False, "Redo every stage even if it finished before.")
    flags.DEFINE_string("hardware", latency.CONFIG_PAIR, "(edge, server) hardware pair of the "
                        "clock for every stage (prada_jax.latency.PAIRS or a .json file; "
                        "docs/latency.md); paper = the FLOP-only clock.")

STAGE_FILE = "stage_done.json"


# ----------------------------------------------------------------------------- settings

def settings_for(mode: str, seeds: int | None = None,
                 hardware: str = latency.CONFIG_PAIR) -> dict:
    """All sizes of one mode ("smoke", "demo", "full") as a plain dict (JSON, compared on
    rerun to decide whether a stage must be redone). ``hardware``: the clock's pair; another
    than the configs' default (``prada_jax.latency.CONFIG_PAIR``) becomes an
    ``env.hardware`` override of the PPO and dual configs (the later stages read it from the
    policy's config)."""
    if mode not in ("smoke", "demo", "full"):
        raise ValueError(f"mode must be smoke, demo or full, got {mode!r}")
    s = {
        "mode": mode,
        "benchmarks": ["gsm8k"] if mode != "full" else list(PRESETS),
        "summary_presets": list(PRESETS),
        "summary_problems": None,          # None: each benchmark's published count
        "train_problems": None,            # problems of the generated set (seed 0) whose
                                           # parts are train / validation / test
        "split": "test",                   # what every table reports
        "choice_split": "validation",      # what the critic refit and dual learner choose on
        "ppo_variant": "",                 # prada_jax/configs/ppo.py variant
        # demo: the ppo.py default sizes with 150 instead of 300 updates (compile-dominated
        # on CPU; see docs/evals.md for timings)
        # The demo (issue 42): the policy on the serving server (the configs' default), then
        # the headline, capacity per server GPU under the registered SLO (studies/capacity at
        # its "demo" size: this policy as the one sample, 4 seeds, rates a factor 2 apart).
        # The old scenario (the legacy 4-sequence server: dual, curve, table; docs/history.md)
        # runs in --full and --smoke.
        "ppo_overrides": {"ppo.total_env_steps": 16 * 64 * 150},
        "legacy_stages": False,
        "capacity": {"size": "demo"},
        # Critic refit for the final actor (prada_jax.rl.critic_refit); None: use the PPO
        # critic as trained (docs/dual.md, "Stage-1 critic calibration").
        "critic_refit": {"fit_states": 20000, "eval_states": 2000, "steps": 2000, "seed": 0},
        "dual_variant": "",
        "dual_overrides": {"env.server_model": "legacy"},
        # Every evaluation: empty start, the cohort arriving in [warmup, slots), a drain of
        # drain_slots after it (the timeout of a measured user: drain_slots·τ = 20 s).
        "eval": {"seeds": seeds or 5, "slots": 2000, "warmup_slots": 200, "drain_slots": 400},
        # The load curve (evals.curve): 8 seeds (a crossover needs >= 8), loads λ/M in
        # arrivals/s per server sequence slot, 2^(k/2) for k = -8..2 (docs/results/
        # load_curve.md, pre-registered); U = 32 so the U cap blocks little below ρ = 1.
        "curve": {"seeds": max(seeds or 8, 8), "slots": 1600, "warmup_slots": 200,
                  "drain_slots": 400, "num_users": 32,
                  "loads": [round(2.0 ** (k / 2), 6) for k in range(-8, 3)]},
        # The two table points are evaluated with the curve's U (the nominal one elsewhere).
        "table_num_users": 32,
        # The λ axis is the load curve's; the sweep varies M and B around the nominal scenario.
        "sweep": {"seeds": seeds or 5, "slots": 2000, "warmup_slots": 200, "drain_slots": 400,
                  "num_users": None, "axes": ["M", "B"],
                  "M": [1, 2, 3, 4, 6, 8], "B": [0.25e6, 0.5e6, 1e6, 2e6, 5e6, 10e6, 20e6],
                  "lam": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0]},
        "calibration": {"problems": None, "stress_miscalibration": None},
    }
    if mode == "smoke":
        s.update(summary_problems=40, train_problems=60, ppo_variant="smoke",
                 ppo_overrides={"env.server_model": "legacy"}, dual_variant="smoke",
                 legacy_stages=True, capacity={"size": "quick"},
                 critic_refit={"fit_states": 200, "eval_states": 100, "steps": 50, "seed": 0})
        s["eval"] = {"seeds": seeds or 2, "slots": 120, "warmup_slots": 20, "drain_slots": 40}
        s["curve"] = {"seeds": seeds or 2, "slots": 120, "warmup_slots": 20, "drain_slots": 40,
                      "num_users": 16, "loads": [0.5, 2.0, 8.0]}
        s["table_num_users"] = None
        s["sweep"] = {"seeds": seeds or 2, "slots": 120, "warmup_slots": 20, "drain_slots": 40,
                      "M": [1, 4], "B": [1e6, 20e6], "lam": [2.0, 8.0], "num_users": None,
                      "axes": ["M", "B", "lam"]}
        s["calibration"] = {"problems": 40, "stress_miscalibration": None}
    elif mode == "full":
        s.update(ppo_overrides={"env.server_model": "legacy"}, legacy_stages=True,
                 capacity=None,
                 dual_overrides={"env.server_model": "legacy"},
                 critic_refit={"fit_states": 40000, "eval_states": 6000, "steps": 4000,
                               "seed": 0})
        s["eval"] = {"seeds": seeds or 5, "slots": 4000, "warmup_slots": 400,
                     "drain_slots": 400}
        s["curve"].update(seeds=max(seeds or 8, 8), slots=2000, warmup_slots=200,
                          loads=[round(2.0 ** (k / 2), 6) for k in range(-10, 7)])
        s["sweep"].update(seeds=seeds or 5, slots=4000, warmup_slots=400, num_users=64,
                          M=[1, 2, 3, 4, 5, 6, 8, 12], axes=["M", "B", "lam"],
                          lam=[1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0])
        s["calibration"] = {"problems": None, "stress_miscalibration": 1.0}
    else:
        # The demo skips the M/B sweep (≈ 90 of its ≈ 380 CPU seconds under the roofline
        # clock; issue 32 asks for about 5 minutes): ``--full`` keeps it, and
        # ``python -m evals.sweep`` with the settings above reproduces the demo's former sweep
        # bit for bit (docs/evals.md gives the command).
        s["sweep"] = None if mode == "demo" else s["sweep"]
    if hardware != latency.CONFIG_PAIR:
        s["ppo_overrides"] = dict(s["ppo_overrides"], **{"env.hardware": hardware})
        s["dual_overrides"] = dict(s["dual_overrides"], **{"env.hardware": hardware})
    return s


# ----------------------------------------------------------------------------- stage cache

def stage_done(stage_dir: Path, settings) -> dict | None:
    """The saved result of a finished stage with the same settings, else None."""
    f = Path(stage_dir) / STAGE_FILE
    if not f.is_file():
        return None
    try:   # a damaged marker (any malformed JSON) means: redo the stage
        data = read_json(f)
    except BadInput:
        return None
    if data.get("settings") != json.loads(json.dumps(settings)):
        return None
    return data


def mark_done(stage_dir: Path, settings, result: dict) -> None:
    write_json(Path(stage_dir) / STAGE_FILE, {"settings": settings, "result": result},
               newline=False)



class _Log:
    """Prints stage headers with wall-clock times to stdout."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------- stages

def stage_traces(workdir: Path, s: dict, log, redo: bool) -> dict:
    """Summary table of the synthetic presets (issue 2's main job)."""
    d = workdir / "traces"
    key = {"presets": s["summary_presets"], "problems": s["summary_problems"]}
    done = None if redo else stage_done(d, key)
    if done:
        log("traces: reusing the finished summary")
        print(done["result"]["table"])
        return done["result"]
    d.mkdir(parents=True, exist_ok=True)
    rows = []
    for preset in s["summary_presets"]:
        tr, meta = synthetic.generate(preset, seed=0, problems=s["summary_problems"])
        rows.append(tstats.trace_stats(tr, meta))
    table = tstats.summary_table(rows)
    table = "Synthetic trace presets (SYNTHETIC data, calibrated to published accuracies)\n" \
        + table
    (d / "summary.txt").write_text(table + "\n")
    print(table)
    result = {"table": table, "path": str(d / "summary.txt")}
    mark_done(d, key, result)
    return result


def _ppo_config(s: dict, preset: str):
    """The screening policy's config of one benchmark (``evals.pipeline.ppo_config``)."""
    return pipeline.ppo_config(preset, s["ppo_variant"], s["ppo_overrides"],
                               problems=s["train_problems"], progress=True)


def _table_traces(s: dict, preset: str, policy) -> "suite.LoadedTraces":
    """The problems every table reports: the ``s["split"]`` part (test) of the very trace set
    the policy was generated from (same preset, generator seed and problem count), so the
    test problems are ones it never trained on."""
    n = int(policy.config.env.get("problems", 0)) or s["train_problems"]
    return suite.load_traces(preset, n, int(policy.config.env.trace_seed)
                             + suite.HELD_OUT_SEED_OFFSET, split=s["split"])


def stage_ppo(workdir: Path, s: dict, preset: str, log, redo: bool) -> Path:
    """Trains (or resumes, or reuses) the screening policy; returns its run directory."""
    d = workdir / "ppo" / preset
    config = _ppo_config(s, preset)
    # The stage is keyed on what train.main chooses (variant, overrides, problems), not on the
    # whole config: a new field in ppo.py must not retrain a finished run.
    key = {"variant": s["ppo_variant"], "overrides": s["ppo_overrides"], "preset": preset,
           "problems": s["train_problems"]}
    if not redo and stage_done(d, key):
        log(f"ppo [{preset}]: reusing the finished run in {d}")
        return d
    log(f"ppo [{preset}]: training the screening policy ({config.ppo.total_env_steps} env "
        f"slots, U={config.env.num_users}) in {d}")
    result = trainer.train_and_evaluate(config, d)
    sc = result["scalars"][0]
    if not sc or result.get("start_update") == result["update_step"]:
        log(f"ppo [{preset}]: the run in {d} was already complete (update "
            f"{result['update_step']})")
    else:
        log(f"ppo [{preset}]: done at update {result['update_step']}, episode return "
            f"{sc.get('train/episode_return', float('nan')):.4f} (synthetic), nominate rate "
            f"{sc.get('train/nominate_rate', float('nan')):.3f}")
    mark_done(d, key, {"update_step": result["update_step"], "env_steps": result["env_steps"]})
    return d


def _dual_config(s: dict, preset: str, policy_dir: Path, env_kw: dict):
    """``(config, key)``: the ``prada_jax/configs/dual.py`` config of one benchmark (same scenario as
    the eval, the policy of ``policy_dir``) and the stage's rerun key (what train.main chose:
    variant and the fields it set)."""
    variant = ",".join(v for v in (s["dual_variant"], preset) if v)
    fields = {"policy_dir": str(policy_dir), "env.trace_seed": 0,
              "env.problems": int(s["train_problems"] or 0),
              "env.split": s.get("choice_split", "validation")}
    fields.update({f"env.{k}": env_kw[k] for k in ("num_users", "num_servers", "bandwidth_hz",
                                                   "arrival_rate_hz", "beta", "tau_s")})
    fields.update(s["dual_overrides"])
    c = pipeline.dual_config(preset, s["dual_variant"], fields)
    return c, {"variant": variant, "fields": fields}


def stage_dual(workdir: Path, s: dict, preset: str, policy_dir: Path, log, redo: bool) -> Path:
    """Learns the multipliers in this process (``prada_jax.dual.trainer``, what
    ``python -m train.dual`` runs); returns the run directory."""
    d = workdir / "dual" / preset
    policy = suite.load_policy(str(policy_dir))
    env_kw = suite.env_kwargs_from(policy.config, {})
    config, key = _dual_config(s, preset, policy_dir, env_kw)
    if not redo and stage_done(d, key):
        log(f"dual [{preset}]: reusing the finished run in {d}")
        return d
    log(f"dual [{preset}]: learning λ_s and µ in {d} on the {config.env.split} split "
        f"(seeds from {dual_trainer.learner_seed(config)})")
    result = dual_trainer.train_and_evaluate(config, d)
    for ln in dual_trainer.summary_lines(result):
        if ln.startswith(("done:", "duality gap")):
            print("    " + ln + " [synthetic traces]")
    mark_done(d, key, {})
    return d


#: The pre-registered rule for the main table's two points (docs/results/load_curve.md),
#: applied to the load curve's server-LLM-alone row (mean ρ over seeds): ``uncontended`` is
#: the largest load with ρ ≤ UNCONTENDED_RHO (nothing queues; the smallest load if none),
#: ``contended`` the stable load (ρ < 1) whose ρ is nearest CONTENDED_RHO.
UNCONTENDED_RHO = 0.3
CONTENDED_RHO = 0.9


def table_points(rho_by_load: dict) -> dict:
    """``{"uncontended": load, "contended": load | None}`` from ``{load: mean ρ of the server
    LLM alone}`` by the rule above (None: no stable load on the curve)."""
    loads = sorted(rho_by_load)
    calm = [x for x in loads if rho_by_load[x] <= UNCONTENDED_RHO]
    stable = [x for x in loads if rho_by_load[x] < 1.0]
    return {"uncontended": calm[-1] if calm else loads[0],
            "contended": (min(stable, key=lambda x: abs(rho_by_load[x] - CONTENDED_RHO))
                          if stable else None)}


def _load_pd(policy_dir: Path, dual_dir: Path | None):
    policy = suite.load_policy(str(policy_dir))
    mult, dual_info = None, {}
    if dual_dir is not None:
        lam, mu, dual_info = suite.load_multipliers(str(dual_dir))
        mult = (lam, mu)
    return policy, mult, dual_info


def stage_curve(workdir: Path, s: dict, preset: str, policy_dir: Path, dual_dir: Path | None,
                log, redo: bool) -> dict:
    """The load curve (``evals.curve``) on the test split under the policy's hardware pair;
    returns the crossover and the two table points (``table_points``)."""
    d = workdir / "curve" / preset
    c = s["curve"]
    key = {"curve": c, "problems": s["train_problems"], "policy": str(policy_dir),
           "dual": str(dual_dir), "split": s["split"]}
    done = None if redo else stage_done(d, key)
    if done:
        log(f"curve [{preset}]: reusing the finished curve in {d} (curve.txt: every point)")
        for line in done["result"]["lines"][-2:]:
            print(line)
        return done["result"]
    policy, mult, _ = _load_pd(policy_dir, dual_dir)
    traces = _table_traces(s, preset, policy)
    seed0 = suite.evaluation_seed0(traces.info, policy, c["seeds"])
    env_kw = suite.env_kwargs_from(policy.config, {"num_users": c.get("num_users")})
    params = edge.make_params(traces.traces, **env_kw)
    e = ev.Evaluator(params, c["seeds"], c["slots"], c["warmup_slots"], policy.apply_fn,
                     policy.params, seed0=seed0, drain_slots=c["drain_slots"])
    rows = curve.curve_rows(mult)
    pair = env_kw["hardware"]
    log(f"curve [{preset}]: {len(rows)} rows x {len(c['loads'])} loads λ/M {c['loads']} x "
        f"{c['seeds']} seeds, one evaluation (U={env_kw['num_users']} M="
        f"{env_kw['num_servers']}, hardware {pair}, {traces.info['split']} split)")
    results = {pair: curve.run_curve(e, rows, c["loads"])}
    timeout = c["drain_slots"] * env_kw["tau_s"]
    title = (f"{preset} (SYNTHETIC), U={env_kw['num_users']} M={env_kw['num_servers']} "
             f"B={env_kw['bandwidth_hz'] / 1e6:g} MHz β={env_kw['beta']:g}, {c['seeds']} "
             f"seeds, timeout {timeout:g} s, {traces.info['split']} split")
    meta = {"traces": traces.info, "env": env_kw, "multipliers": mult, **c,
            "split": traces.info["split"], "eval_seed_range": [seed0, seed0 + c["seeds"]]}
    res = curve.write_curve_outputs(results, d, title=title, meta=meta)
    rho = {x: float(np.mean(results[pair][x][curve.LLM_ALONE]["rho"])) for x in c["loads"]}
    points = table_points(rho)
    lines = [ln + " [synthetic traces]" for ln in res["lines"]]
    lines.append(f"table points (rule: uncontended = largest load with the server LLM alone's "
                 f"ρ ≤ {UNCONTENDED_RHO}, contended = stable load with ρ nearest "
                 f"{CONTENDED_RHO}): " + ", ".join(
                     f"{k} load {v:g} (ρ {rho[v]:.2f})" if v is not None else f"{k}: none"
                     for k, v in points.items()))
    print(f"load curve: {d / 'curve.txt'} (every point), "
          f"{res['figures'][pair]}")
    for line in lines[-2:]:
        print(line)
    result = {"lines": lines, "points": points, "rho_llm_alone": {str(k): v
                                                                   for k, v in rho.items()},
              "crossover": res["crossovers"][pair], "pair": pair,
              "figures": [str(p) for p in res["figures"].values()], "json": str(res["json"])}
    mark_done(d, key, result)
    return result


def stage_eval(workdir: Path, s: dict, preset: str, policy_dir: Path, dual_dir: Path | None,
               log, redo: bool, points: dict | None = None) -> dict:
    """The benchmark table at each table point (``{name: load λ/M}``; None: the policy's own
    scenario only, under the name ``nominal``) in ``eval/<preset>/<name>/``."""
    points = {k: v for k, v in (points or {"nominal": None}).items() if v is not None}
    d = workdir / "eval" / preset
    key = {"eval": s["eval"], "problems": s["train_problems"], "policy": str(policy_dir),
           "dual": str(dual_dir), "trace_seed_offset": suite.HELD_OUT_SEED_OFFSET,
           "split": s["split"], "points": points, "num_users": s.get("table_num_users")}
    done = None if redo else stage_done(d, key)
    if done:
        log(f"eval [{preset}]: reusing the finished evaluation in {d}")
        for r in done["result"]["points"].values():
            print(r["table"])
            print(r["headline_text"])
        return done["result"]
    policy, mult, dual_info = _load_pd(policy_dir, dual_dir)
    traces = _table_traces(s, preset, policy)
    suite.check_policy_traces(policy, traces)
    nominal = suite.env_kwargs_from(policy.config, {})
    if mult is not None:   # learned by stage_dual on the nominal scenario: a mismatch is refused
        suite.check_scenario(f"dual run {dual_dir}", dual_info, nominal, traces.info, policy,
                             allow_flag=None)
    if s.get("table_num_users"):
        nominal["num_users"] = int(s["table_num_users"])
    e = s["eval"]
    out = {"points": {}}
    for name, load in points.items():
        env_kw = dict(nominal)
        if load is not None:
            env_kw["arrival_rate_hz"] = float(load) * env_kw["num_servers"]
        lam = env_kw["arrival_rate_hz"]
        learned = suite.env_kwargs_from(policy.config, {})
        note = ("" if load is None or (lam == learned["arrival_rate_hz"]
                                       and env_kw["num_users"] == learned["num_users"]) else
                f"; PRADA's multipliers were learned at U={learned['num_users']}, "
                f"λ={learned['arrival_rate_hz']:g}/s")
        log(f"eval [{preset}] {name}: {e['seeds']} seeds x {e['slots']} slots, U="
            f"{env_kw['num_users']} M={env_kw['num_servers']} B="
            f"{env_kw['bandwidth_hz'] / 1e6:g} MHz λ={lam:g}/s on the "
            f"{suite.split_label(traces.info, policy)} (synthetic, generator seed "
            f"{traces.info.get('trace_seed')}){note}")
        per_seed, info = suite.evaluate_rows(traces, env_kw, policy=policy, multipliers=mult,
                                             seeds=e["seeds"], slots=e["slots"],
                                             warmup_slots=e["warmup_slots"],
                                             drain_slots=e["drain_slots"], progress=log)
        timeout = e["drain_slots"] * env_kw["tau_s"]
        title = (f"{preset} (SYNTHETIC traces, seed {traces.info.get('trace_seed')}) {name} "
                 f"point: U={env_kw['num_users']} M={env_kw['num_servers']} "
                 f"B={env_kw['bandwidth_hz'] / 1e6:g} MHz λ={lam:g}/s"
                 + (f" (load λ/M {load:g})" if load is not None else "")
                 + f", {e['seeds']} seeds, mean ± 95% CI, timeout {timeout:g} s; "
                 f"{suite.split_label(traces.info, policy)}")
        meta = {"traces": traces.info, "policy": str(policy_dir), "dual": str(dual_dir),
                "multipliers": {"lambda_s": mult[0], "mu_per_hz": mult[1]} if mult else None,
                "dual_info": dual_info, "point": name, "load": load, **info}
        res = suite.write_outputs(per_seed, d / name, title=title, meta=meta)
        print(f"Benchmark table, {name} point, on the {traces.info['split']} split "
              f"(evaluation seeds {info['eval_seed_range'][0]}.."
              f"{info['eval_seed_range'][1] - 1}); All-LLM = the server LLM alone (the paper's "
              f"baseline), '{suite.DRAFT_RECOMPUTE}' = draft then recompute{note}:")
        print(res["table"])
        print(res["headline_text"])
        h = res["headline"]
        out["points"][name] = {
            "table": res["table"], "headline_text": res["headline_text"], "load": load,
            "arrival_rate_hz": lam, "split": traces.info["split"],
            "eval_seed_range": info["eval_seed_range"],
            "headline": {k: (v.to_json_dict() if hasattr(v, "to_json_dict") else v)
                         for k, v in h.items()},
            "json": str(res["json"]), "csv": str(res["csv"]),
            "figures": [str(p) for p in res["figures"].values()]}
    first = next(iter(out["points"].values()))
    out.update(split=first["split"], headline_text="\n".join(
        f"{k}: {v['headline_text']}" for k, v in out["points"].items()))
    mark_done(d, key, out)
    return out


def stage_sweep(workdir: Path, s: dict, preset: str, policy_dir: Path, dual_dir: Path | None,
                log, redo: bool) -> dict | None:
    """Sweeps M, B and λ around the policy's scenario (None: the mode has no sweep). The multipliers of ``dual_dir`` are not
    checked against the scenario (``suite.check_scenario``): the sweep varies M/B/λ (and U)
    away from the scenario they were learned for on purpose."""
    if s["sweep"] is None:
        return None
    d = workdir / "sweep" / preset
    key = {"sweep": s["sweep"], "problems": s["train_problems"], "policy": str(policy_dir),
           "dual": str(dual_dir), "trace_seed_offset": suite.HELD_OUT_SEED_OFFSET,
           "split": s["split"]}
    done = None if redo else stage_done(d, key)
    if done:
        log(f"sweep [{preset}]: reusing the finished sweep in {d}")
        for line in done["result"]["knee_lines"]:
            print(line)
        return done["result"]
    policy = suite.load_policy(str(policy_dir))
    mult = None
    if dual_dir is not None:
        lam, mu, _ = suite.load_multipliers(str(dual_dir))
        mult = (lam, mu)
    traces = _table_traces(s, preset, policy)
    sw = s["sweep"]
    seed0 = suite.evaluation_seed0(traces.info, policy, sw["seeds"])
    env_kw = suite.env_kwargs_from(policy.config, {"num_users": sw.get("num_users")})
    params = edge.make_params(traces.traces, **env_kw)
    evaluator = ev.Evaluator(params, sw["seeds"], sw["slots"], sw["warmup_slots"],
                             policy.apply_fn, policy.params, seed0=seed0,
                             drain_slots=sw["drain_slots"])
    rows = sweep.sweep_rows(True, mult)
    axes = sw.get("axes", ["M", "B", "lam"])
    log(f"sweep [{preset}]: " + ", ".join(
        f"{a} {[b / 1e6 for b in sw[a]] if a == 'B' else sw[a]}" for a in axes)
        + f"; {sw['seeds']} seeds x {sw['slots']} slots per point")
    results = {a: sweep.run_sweep(evaluator, rows, a, sw[a]) for a in axes}
    title = (f"{preset} (SYNTHETIC), U={env_kw['num_users']}, {sw['seeds']} seeds, 95% CI, "
             f"{traces.info['split']} split")
    meta = {"traces": traces.info, "env": env_kw, "multipliers": mult, **sw,
            "split": traces.info["split"], "eval_seed_range": [seed0, seed0 + sw["seeds"]]}
    res = sweep.write_sweep_outputs(results, d, title=title, meta=meta)
    lines = [ln + f" [synthetic traces, {traces.info['split']} split]"
             for ln in res["knee_lines"]]
    for line in lines:
        print(line)
    result = {"knee_lines": lines, "knees": res["knees"],
              "figures": [str(p) for p in res["figures"].values()]}
    mark_done(d, key, result)
    return result


def stage_capacity(workdir: Path, s: dict, preset: str, policy_dir: Path, hardware: str, log,
                   redo: bool) -> dict | None:
    """Capacity per server GPU under the registered SLO (``studies.capacity`` at the
    settings' size, this run's policy as the one sample) for the run's hardware pair; None
    when the mode has none or the pair is the paper clock (no serving server)."""
    cfg = s.get("capacity")
    if not cfg or hardware == latency.PAPER:
        return None
    d = workdir / "capacity" / preset
    key = {"capacity": cfg, "policy": str(policy_dir), "hardware": hardware}
    done = None if redo else stage_done(d, key)
    if done:
        log(f"capacity [{preset}]: reusing the finished table in {d}")
        print(done["result"]["text"])
        return done["result"]
    size = cfg["size"]
    log(f"capacity [{preset}]: studies.capacity at size {size!r} on {hardware} "
        f"({len(capacity.SIZES[size].rates)} rates, "
        f"{capacity.SIZES[size].seeds} test seeds; prices fitted per rate on "
        "validation)")
    res = capacity.run_study(d, [hardware], size, log=lambda m: log(f"capacity: {m}"),
                                   policy_dirs=[policy_dir])
    a = res["results"]["same split"][hardware]
    text = "\n".join([
        f"Capacity per server GPU under the SLO (users/s; {preset} SYNTHETIC, test split; SLO "
        "p90 ≤ 2 × and accuracy ≥ 0.95 × the LLM alone's at the lightest rate on the same "
        f"problems; size {size!r}: 1 policy sample, {capacity.SIZES[size].seeds} seeds, rates "
        f"{list(capacity.SIZES[size].rates)} — fewer than the registered study "
        "(studies/capacity/README.md), so no verdict; the study's numbers are in "
        "studies/capacity/results):", res["tables"]["same split"],
        f"gate: {'passed' if a['gate']['passed'] else 'not passed'}; report "
        f"{d / 'report.md'}, plot {d / 'capacity_slo_same_split.png'}"])
    print(text)
    result = {"text": text, "report": str(d / "report.md")}
    mark_done(d, key, result)
    return result


def stage_calibration(workdir: Path, s: dict, policy_dirs: dict, log, redo: bool) -> dict:
    d = workdir / "calibration"
    key = s["calibration"]
    done = None if redo else stage_done(d, key)
    if done:
        log("calibration: reusing the finished report")
        print(done["result"]["text"])
        return done["result"]
    reports = calibration.calibration_for(s["summary_presets"], key["problems"], 0)
    res = calibration.write_calibration(reports, d)
    print(res["text"])
    result = {"text": res["text"], "figure": str(res["figure"])}
    m = key.get("stress_miscalibration")
    if m:
        preset = s["benchmarks"][0]
        log(f"calibration: PRM miscalibration stress test (m={m}) on {preset}")
        r = calibration.stress_test(
            preset, float(m), _ppo_config(s, preset), d / "stress", problems=s["train_problems"],
            trace_seed=0, seeds=s["eval"]["seeds"], slots=s["eval"]["slots"],
            warmup_slots=s["eval"]["warmup_slots"], policy_dir=str(policy_dirs[preset]),
            progress=log)
        result["stress"] = calibration.stress_text(r)
        print(result["stress"])
    mark_done(d, key, result)
    return result


def stage_critic(workdir: Path, s: dict, preset: str, ppo_dir: Path, log, redo: bool) -> Path:
    """Refits the critic of the PPO run for its final actor (``prada_jax.rl.critic_refit``)
    into ``critic/<preset>`` and returns that policy folder (the PPO folder itself when
    ``settings["critic_refit"]`` is None)."""
    cfg = s.get("critic_refit")
    if not cfg:
        return ppo_dir
    d = workdir / "critic" / preset
    key = {"critic_refit": cfg, "policy": str(ppo_dir), "split": s["choice_split"]}
    if not redo and stage_done(d, key):
        log(f"critic [{preset}]: reusing the refit critic in {d}")
        return d
    if d.exists():   # an interrupted or outdated refit: start again
        shutil.rmtree(d)
    log(f"critic [{preset}]: refitting the critic for the final actor ({cfg['fit_states']} "
        f"Monte-Carlo states; judged and early-stopped on the {s['choice_split']} split) in "
        f"{d}")
    summary = pipeline.refit_critic(ppo_dir, d, cfg, s["choice_split"],
                                    log=lambda m: log(f"critic [{preset}]: {m.strip()}"))
    mark_done(d, key, summary)
    return d


# ----------------------------------------------------------------------------- main

def check_envs(s: dict, hardware: str) -> None:
    """Every stage's env under ``hardware``, checked before anything is written: the PPO
    stage's (``trainer.build_env``, its M against the server's KV memory included) and the
    largest M the later stages run (the policy's ``env.num_servers``, the sweep's M grid).
    ``BadInput`` naming ``--hardware`` (the refusal came after ``main_settings.json`` and the
    trace summary were written)."""
    for preset in s["benchmarks"]:
        c = _ppo_config(s, preset)
        try:
            trainer.validate_config(c)
            traces, _ = trainer.load_traces(c)
            trainer.build_env(c, traces)
            sweep_m = s["sweep"]["M"] if s["sweep"] and "M" in s["sweep"]["axes"] else []
            edge.check_num_servers(latency.pair_latency_params(hardware), traces,
                                   max([int(c.env.num_servers), *sweep_m]), hardware)
        except BadInput as e:
            msg = str(e)
            raise BadInput(msg if msg.startswith("--hardware") else
                           f"--hardware={hardware}: {msg}") from None


def run_pipeline(workdir: str | Path, mode: str = "demo", seeds: int | None = None,
                 redo: bool = False, hardware: str = latency.CONFIG_PAIR) -> dict:
    """Runs (or resumes) every stage; returns a dict of where things are."""
    suite.check_hardware(hardware, "--hardware")   # before anything is written
    s = settings_for(mode, seeds, hardware)
    check_envs(s, hardware)
    workdir = config_utils.prepare_workdir(workdir)
    (workdir / "main_settings.json").write_text(json.dumps(s, indent=2) + "\n")
    log = _Log()
    log(f"train.main ({mode}) in {workdir}; all data below is SYNTHETIC")
    stage_traces(workdir, s, log, redo)
    out = {"workdir": str(workdir), "benchmarks": {}}
    policy_dirs = {}
    for preset in s["benchmarks"]:
        ppo_dir = stage_ppo(workdir, s, preset, log, redo)
        pol = stage_critic(workdir, s, preset, ppo_dir, log, redo)
        policy_dirs[preset] = pol
        cap_res = stage_capacity(workdir, s, preset, pol, hardware, log, redo)
        b = {"ppo": str(ppo_dir), "policy": str(pol), "capacity": cap_res, "dual": None,
             "curve": None, "eval": None, "sweep": None}
        if s.get("legacy_stages", True):   # the old scenario (docs/history.md)
            dual = stage_dual(workdir, s, preset, pol, log, redo)
            cv_res = stage_curve(workdir, s, preset, pol, dual, log, redo)
            b.update(dual=str(dual) if dual else None, curve=cv_res,
                     eval=stage_eval(workdir, s, preset, pol, dual, log, redo,
                                     cv_res["points"]),
                     sweep=stage_sweep(workdir, s, preset, pol, dual, log, redo))
        out["benchmarks"][preset] = b
    out["calibration"] = stage_calibration(workdir, s, policy_dirs, log, redo)
    log("done")
    print()
    print("Where things are (all numbers from SYNTHETIC traces):")
    print(f"  trace summary:     {workdir / 'traces' / 'summary.txt'}")
    for preset, b in out["benchmarks"].items():
        print(f"  [{preset}] policy checkpoints: {Path(b['ppo']) / 'checkpoints'}")
        if b["policy"] != b["ppo"]:
            print(f"  [{preset}] refit critic:       {Path(b['policy'])} (critic_check.json; "
                  "the policy the later stages use)")
        if b["capacity"]:
            print(f"  [{preset}] capacity (headline): {b['capacity']['report']} "
                  f"(+ capacity_slo_*.png, curve_*.png, study.json)")
        if b["dual"]:
            print(f"  [{preset}] multipliers:        {b['dual']}")
        if b["curve"]:
            print(f"  [{preset}] load curve (old scenario): {workdir / 'curve' / preset}/"
                  "curve_*.png (+ curve.json per seed, curve.txt)")
        for name in (b["eval"] or {}).get("points", {}):
            print(f"  [{preset}] results table:      "
                  f"{workdir / 'eval' / preset / name / 'table.txt'} (+ results.json, "
                  f"results.csv, *.png; {b['eval'].get('split', '?')} split)")
        if b["sweep"]:
            print(f"  [{preset}] sweep figures:      {workdir / 'sweep' / preset}/*.png "
                  f"(knees in knees.txt)")
        for line in (b["curve"] or {}).get("lines", [])[-2:]:
            print(f"  [{preset}] {line}")
        for name, r in (b["eval"] or {}).get("points", {}).items():
            print(f"  [{preset}] {name}: {r['headline_text']}")
        if b["capacity"]:
            print(f"  [{preset}] " + b["capacity"]["text"].replace("\n", f"\n  [{preset}] "))
    print(f"  calibration:       {workdir / 'calibration'}")
    print(f"tensorboard --logdir {workdir}")
    return out


def main(argv):
    config_utils.reject_extra_argv(argv)
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required, e.g. --workdir=checkpoints/demo")
    if FLAGS.full and FLAGS.smoke:
        raise app.UsageError("--full and --smoke exclude each other")
    # Library INFO logs (orbax's checkpoint manager in particular) are hidden by prada_jax.cli
    # unless --verbosity is given (--verbosity=0 brings them back).
    print(config_utils.runtime_info(), flush=True)
    mode = "full" if FLAGS.full else ("smoke" if FLAGS.smoke else "demo")
    run_pipeline(FLAGS.workdir, mode, FLAGS.seeds, FLAGS.redo, FLAGS.hardware)


if __name__ == "__main__":
    cli.run(main, define_flags=_define_flags)
