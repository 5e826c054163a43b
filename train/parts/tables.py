"""The parts of ``train.main`` that evaluate a trained policy: the load curve and its two
table points, the benchmark table at those points, the M / B / λ sweep, capacity per server GPU
under the SLO and the PRM calibration."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from envs import edge
from evals import calibration, curve, suite, sweep
from evals import evaluate as ev
from evals.capacity import study as capacity
from prada_jax import latency
from train.parts.cache import (load_policy_and_multipliers, mark_done, reuse_finished,
                               table_traces)
from train.parts.training import ppo_config

#: The pre-registered rule for the main table's two points (studies/load_curve), applied to
#: the load curve's server-LLM-alone row (mean ρ over seeds): ``uncontended`` is the largest
#: load with ρ ≤ UNCONTENDED_RHO (nothing queues; the smallest load if none), ``contended`` the
#: stable load (ρ < 1) whose ρ is nearest CONTENDED_RHO.
UNCONTENDED_RHO = 0.3
CONTENDED_RHO = 0.9

#: The sweep's axes by the env field each varies (``config.sweep.axes``) → ``evals.sweep``'s
#: axis names.
SWEEP_AXES = {field: axis for axis, (field, *_rest) in sweep.AXES.items()}


def table_points(rho_by_load: dict) -> dict:
    """``{"uncontended": load, "contended": load | None}`` from ``{load: mean ρ of the server
    LLM alone}`` by the rule above (None: no stable load on the curve)."""
    loads = sorted(rho_by_load)
    calm = [x for x in loads if rho_by_load[x] <= UNCONTENDED_RHO]
    stable = [x for x in loads if rho_by_load[x] < 1.0]
    return {"uncontended": calm[-1] if calm else loads[0],
            "contended": (min(stable, key=lambda x: abs(rho_by_load[x] - CONTENDED_RHO))
                          if stable else None)}


def _evaluator(config, section, preset: str, policy):
    """``(evaluator, traces, env_kw, seed0)`` of one evaluation section (``config.curve`` or
    ``config.sweep``) on the test split, under the policy's scenario with the section's U."""
    traces = table_traces(config, preset, policy)
    seed0 = suite.evaluation_seed0(traces.info, policy, section.seeds)
    env_kw = suite.env_kwargs_from(policy.config, {"num_users": section.num_users or None})
    params = edge.make_params(traces.traces, **env_kw)
    e = ev.Evaluator(params, section.seeds, section.slots, section.warmup_slots,
                     policy.apply_fn, policy.params, seed0=seed0,
                     drain_slots=section.drain_slots)
    return e, traces, env_kw, seed0


def _curve_settings(config) -> dict:
    """The curve's sizes under their names in the part key and in curve.json's meta."""
    c = config.curve
    return {"seeds": c.seeds, "slots": c.slots, "warmup_slots": c.warmup_slots,
            "drain_slots": c.drain_slots, "num_users": c.num_users,
            "loads": list(c.loads_per_server_hz)}


def part_curve(workdir: Path, config, preset: str, policy_dir: Path, dual_dir: Path | None,
                log, redo: bool) -> dict:
    """The load curve (``evals.curve``) on the test split under the policy's hardware pair;
    returns the crossover and the two table points (``table_points``)."""
    d = workdir / "curve" / preset
    c = _curve_settings(config)
    key = {"curve": c, "problems": config.train_problems or None, "policy": str(policy_dir),
           "dual": str(dual_dir), "split": config.split}
    done = reuse_finished(d, key, redo, log, f"curve [{preset}]: reusing the finished curve in "
                          f"{d} (curve.txt: every point)")
    if done:
        for line in done["result"]["lines"][-2:]:
            print(line)
        return done["result"]
    policy, mult, _ = load_policy_and_multipliers(policy_dir, dual_dir)
    e, traces, env_kw, seed0 = _evaluator(config, config.curve, preset, policy)
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
    print(f"load curve: {d / 'curve.txt'} (every point), {res['figures'][pair]}")
    for line in lines[-2:]:
        print(line)
    result = {"lines": lines, "points": points,
              "rho_llm_alone": {str(k): v for k, v in rho.items()},
              "crossover": res["crossovers"][pair], "pair": pair,
              "figures": [str(p) for p in res["figures"].values()], "json": str(res["json"])}
    mark_done(d, key, result)
    return result


def _eval_point(config, preset: str, name: str, load, nominal: dict, run: dict, log) -> dict:
    """The benchmark table at one point (``load`` λ/M; None: the policy's own scenario) into
    ``run["dir"] / name``; ``run``: the policy, multipliers, dual run and traces."""
    policy, mult, traces, e = run["policy"], run["mult"], run["traces"], config.eval
    env_kw = dict(nominal)
    if load is not None:
        env_kw["arrival_rate_hz"] = float(load) * env_kw["num_servers"]
    lam = env_kw["arrival_rate_hz"]
    learned = suite.env_kwargs_from(policy.config, {})
    note = ("" if load is None or (lam == learned["arrival_rate_hz"]
                                   and env_kw["num_users"] == learned["num_users"]) else
            f"; PRADA's multipliers were learned at U={learned['num_users']}, "
            f"λ={learned['arrival_rate_hz']:g}/s")
    split_label = suite.split_label(traces.info, policy)
    log(f"eval [{preset}] {name}: {e.seeds} seeds x {e.slots} slots, U="
        f"{env_kw['num_users']} M={env_kw['num_servers']} B="
        f"{env_kw['bandwidth_hz'] / 1e6:g} MHz λ={lam:g}/s on the {split_label} (synthetic, "
        f"generator seed {traces.info.get('trace_seed')}){note}")
    per_seed, info = suite.evaluate_rows(traces, env_kw, policy=policy, multipliers=mult,
                                         seeds=e.seeds, slots=e.slots,
                                         warmup_slots=e.warmup_slots,
                                         drain_slots=e.drain_slots, progress=log)
    title = (f"{preset} (SYNTHETIC traces, seed {traces.info.get('trace_seed')}) {name} "
             f"point: U={env_kw['num_users']} M={env_kw['num_servers']} "
             f"B={env_kw['bandwidth_hz'] / 1e6:g} MHz λ={lam:g}/s"
             + (f" (load λ/M {load:g})" if load is not None else "")
             + f", {e.seeds} seeds, mean ± 95% CI, timeout {e.drain_slots * env_kw['tau_s']:g}"
             f" s; {split_label}")
    meta = {"traces": traces.info, "policy": str(run["policy_dir"]), "dual": str(run["dual_dir"]),
            "multipliers": {"lambda_s": mult[0], "mu_per_hz": mult[1]} if mult else None,
            "dual_info": run["dual_info"], "point": name, "load": load, **info}
    res = suite.write_outputs(per_seed, run["dir"] / name, title=title, meta=meta)
    print(f"Benchmark table, {name} point, on the {traces.info['split']} split "
          f"(evaluation seeds {info['eval_seed_range'][0]}.."
          f"{info['eval_seed_range'][1] - 1}); All-LLM = the server LLM alone (the paper's "
          f"baseline), '{suite.DRAFT_RECOMPUTE}' = draft then recompute{note}:")
    print(res["table"])
    print(res["headline_text"])
    return {"table": res["table"], "headline_text": res["headline_text"], "load": load,
            "arrival_rate_hz": lam, "split": traces.info["split"],
            "eval_seed_range": info["eval_seed_range"],
            "headline": {k: (v.to_json_dict() if hasattr(v, "to_json_dict") else v)
                         for k, v in res["headline"].items()},
            "json": str(res["json"]), "csv": str(res["csv"]),
            "figures": [str(p) for p in res["figures"].values()]}


def part_eval(workdir: Path, config, preset: str, policy_dir: Path, dual_dir: Path | None,
               log, redo: bool, points: dict | None = None) -> dict:
    """The benchmark table at each table point (``{name: load λ/M}``; None: the policy's own
    scenario only, under the name ``nominal``) in ``eval/<preset>/<name>/``."""
    points = {k: v for k, v in (points or {"nominal": None}).items() if v is not None}
    d = workdir / "eval" / preset
    key = {"eval": config.eval.to_dict(), "problems": config.train_problems or None,
           "policy": str(policy_dir), "dual": str(dual_dir),
           "trace_seed_offset": suite.HELD_OUT_SEED_OFFSET, "split": config.split,
           "points": points, "num_users": config.table_num_users or None}
    done = reuse_finished(d, key, redo, log,
                          f"eval [{preset}]: reusing the finished evaluation in {d}")
    if done:
        for r in done["result"]["points"].values():
            print(r["table"])
            print(r["headline_text"])
        return done["result"]
    policy, mult, dual_info = load_policy_and_multipliers(policy_dir, dual_dir)
    traces = table_traces(config, preset, policy)
    suite.check_policy_traces(policy, traces)
    nominal = suite.env_kwargs_from(policy.config, {})
    if mult is not None:   # learned by part_dual on the nominal scenario: a mismatch is refused
        suite.check_scenario(f"dual run {dual_dir}", dual_info, nominal, traces.info, policy,
                             allow_flag=None)
    if config.table_num_users:
        nominal["num_users"] = int(config.table_num_users)
    run = {"policy": policy, "mult": mult, "dual_info": dual_info, "traces": traces,
           "policy_dir": policy_dir, "dual_dir": dual_dir, "dir": d}
    out = {"points": {name: _eval_point(config, preset, name, load, nominal, run, log)
                      for name, load in points.items()}}
    first = next(iter(out["points"].values()))
    out.update(split=first["split"], headline_text="\n".join(
        f"{k}: {v['headline_text']}" for k, v in out["points"].items()))
    mark_done(d, key, out)
    return out


def _sweep_settings(config) -> dict:
    """The sweep's sizes and grids under ``evals.sweep``'s axis names (part key, meta)."""
    sw = config.sweep
    return {"seeds": sw.seeds, "slots": sw.slots, "warmup_slots": sw.warmup_slots,
            "drain_slots": sw.drain_slots, "num_users": sw.num_users or None,
            "axes": [SWEEP_AXES[a] for a in sw.axes],
            **{SWEEP_AXES[f]: list(sw[f]) for f in SWEEP_AXES}}


def part_sweep(workdir: Path, config, preset: str, policy_dir: Path, dual_dir: Path | None,
                log, redo: bool) -> dict | None:
    """Sweeps M, B and λ around the policy's scenario (None: ``config.sweep.axes`` is empty).
    The multipliers of ``dual_dir`` are not checked against the scenario
    (``suite.check_scenario``): the sweep varies M/B/λ (and U) away from the scenario they were
    learned for on purpose."""
    if not config.sweep.axes:
        return None
    d = workdir / "sweep" / preset
    sw = _sweep_settings(config)
    key = {"sweep": sw, "problems": config.train_problems or None, "policy": str(policy_dir),
           "dual": str(dual_dir), "trace_seed_offset": suite.HELD_OUT_SEED_OFFSET,
           "split": config.split}
    done = reuse_finished(d, key, redo, log, f"sweep [{preset}]: reusing the finished sweep in {d}")
    if done:
        for line in done["result"]["knee_lines"]:
            print(line)
        return done["result"]
    policy, mult, _ = load_policy_and_multipliers(policy_dir, dual_dir)
    evaluator, traces, env_kw, seed0 = _evaluator(config, config.sweep, preset, policy)
    rows = sweep.sweep_rows(True, mult)
    log(f"sweep [{preset}]: " + ", ".join(
        f"{a} {[b / 1e6 for b in sw[a]] if a == 'B' else sw[a]}" for a in sw["axes"])
        + f"; {sw['seeds']} seeds x {sw['slots']} slots per point")
    results = {a: sweep.run_sweep(evaluator, rows, a, sw[a]) for a in sw["axes"]}
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


def part_capacity(workdir: Path, config, preset: str, policy_dir: Path, log, redo: bool
                   ) -> dict | None:
    """Capacity per server GPU under the registered SLO (``studies.capacity`` at the config's
    ``capacity_size``, this run's policy as the one sample) for the run's hardware pair; None
    when the config has none or the pair is the paper clock (no serving server)."""
    size, hardware = config.capacity_size, config.hardware
    if not size or hardware == latency.PAPER:
        return None
    d = workdir / "capacity" / preset
    key = {"capacity": {"size": size}, "policy": str(policy_dir), "hardware": hardware}
    done = reuse_finished(d, key, redo, log,
                          f"capacity [{preset}]: reusing the finished table in {d}")
    if done:
        print(done["result"]["text"])
        return done["result"]
    sizes = capacity.SIZES[size]
    log(f"capacity [{preset}]: studies.capacity at size {size!r} on {hardware} "
        f"({len(sizes.rates)} rates, {sizes.seeds} test seeds; prices fitted per rate on "
        "validation)")
    res = capacity.run_study(d, [hardware], size, log=lambda m: log(f"capacity: {m}"),
                             policy_dirs=[policy_dir])
    a = res["results"]["same split"][hardware]
    text = "\n".join([
        f"Capacity per server GPU under the SLO (users/s; {preset} SYNTHETIC, test split; SLO "
        "p90 ≤ 2 × the LLM alone's at the lightest rate on the same problems, accuracy pooled "
        "over seeds not shown below 0.95 × its exact test-pool accuracy; size "
        f"{size!r}: 1 policy sample, {sizes.seeds} seeds, rates "
        f"{list(sizes.rates)} — fewer than the registered study "
        "(studies/capacity/README.md), so no verdict; the study's numbers are in "
        "studies/capacity/results):", res["tables"]["same split"],
        f"gate: {'passed' if a['gate']['passed'] else 'not passed'}; report "
        f"{d / 'report.md'}, plot {d / 'capacity_slo_same_split.png'}"])
    print(text)
    result = {"text": text, "report": str(d / "report.md")}
    mark_done(d, key, result)
    return result


def part_calibration(workdir: Path, config, policy_dirs: dict, log, redo: bool) -> dict:
    """PRM calibration per summary preset (AUC, reliability diagram) and, when
    ``config.calibration.stress_miscalibration`` is nonzero, the miscalibration stress test
    on the first benchmark's policy."""
    d = workdir / "calibration"
    problems = config.calibration.problems or None
    m = config.calibration.stress_miscalibration
    key = {"problems": problems, "stress_miscalibration": m or None}
    done = reuse_finished(d, key, redo, log, "calibration: reusing the finished report")
    if done:
        print(done["result"]["text"])
        return done["result"]
    reports = calibration.calibration_for(list(config.summary_presets), problems, 0)
    res = calibration.write_calibration(reports, d)
    print(res["text"])
    result = {"text": res["text"], "figure": str(res["figure"])}
    if m:
        preset, e = config.benchmarks[0], config.eval
        log(f"calibration: PRM miscalibration stress test (m={m}) on {preset}")
        r = calibration.stress_test(
            preset, float(m), ppo_config(config, preset), d / "stress",
            problems=config.train_problems or None, trace_seed=0, seeds=e.seeds,
            slots=e.slots, warmup_slots=e.warmup_slots, policy_dir=str(policy_dirs[preset]),
            progress=log)
        result["stress"] = calibration.stress_text(r)
        print(result["stress"])
    mark_done(d, key, result)
    return result
