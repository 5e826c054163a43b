"""Library side of ``python -m evals.run``: load traces, policy and multipliers with clear errors,
evaluate every row over seeds, and write the table, JSON, CSV, figures and TensorBoard.

Defines no flags: the flags the evaluation commands share, and the loader of what they name,
are ``evals.command_flags``; ``train.main`` and the commands call the same functions here.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from envs import edge
from evals import evaluate as ev
from evals import plots, report
from prada_jax import latency, stats
from prada_jax.errors import BadInput
from prada_jax.jsonio import write_json
from prada_jax.metric_writer import MetricWriter
from prada_jax.rl import policy as policy_files
from prada_jax.rl.policy import LoadedPolicy
from prada_jax.dual import files as dual_lib
from prada_jax.traces import format as tf
from prada_jax.traces import splits
from prada_jax.traces.loader import load_trace_set

# Added to the policy run's generator seed to pick the evaluation trace set of a synthetic
# preset: 0, the same generated set, whose test split holds the problems the policy did not
# train on (``prada_jax.traces.splits``; ``--split``). A different seed would redraw the random
# feature projection of ``prada_jax.traces.synthetic`` (a distribution shift, not a held-out
# split), so other synthetic seeds are opt-in (``--trace_seed``).
HELD_OUT_SEED_OFFSET = 0
#: The part of the trace set every table reports unless told otherwise.
DEFAULT_SPLIT = "test"

#: The paper's All-LLM baseline: the server LLM alone, no edge draft (``envs.edge``
#: ``llm_only``), every step offloaded; the server keeps the context it generated, and a
#: request waits for a unit however long (there is no draft to fall back on).
ALL_LLM = "All-LLM"
LLM_ONLY_OVERRIDES = {"llm_only": True, "server_kv_cache": True, "max_wait_slots": 2 ** 30}
#: The SLM drafts every step, then the server LLM recomputes it (slower than the paper's
#: baseline by the drafts): ``evals.evaluate``'s offload-all row, under a name that says so.
DRAFT_RECOMPUTE = "Draft then LLM (recompute)"


def baseline_rows() -> list:
    """The rows that need no trained policy: All-SLM, the paper's All-LLM, the
    draft-then-recompute row and RSD (``evals.evaluate.PolicySpec``; run them with
    :func:`run_row`)."""
    out = []
    for spec in ev.baseline_specs():
        if spec.name == ALL_LLM:
            out += [spec, spec._replace(name=DRAFT_RECOMPUTE)]
        else:
            out.append(spec)
    return out


def run_row(evaluator, spec, **overrides) -> dict:
    """Per-seed metrics of one row: ``evaluator.run(spec, **overrides)``, with the LLM-alone
    env for :data:`ALL_LLM`."""
    if spec.name == ALL_LLM:
        overrides = {**overrides, **LLM_ONLY_OVERRIDES}
    return evaluator.run(spec, **overrides)


class LoadedTraces(NamedTuple):
    traces: Any
    info: dict     # source, benchmark, synthetic, counts, feature_dim


class EvalError(BadInput):
    """A bad evaluation input (checkpoint, traces, flag); the message names it."""


def load_traces(spec: str, problems: int | None = None, trace_seed: int = 0,
                name: str = "--traces", split: str | None = None,
                split_name: str = "--split") -> LoadedTraces:
    """A trace folder (validated) or a synthetic preset name (``gsm8k`` ...), through the
    shared loader ``prada_jax.traces.loader.load_trace_set``; errors name ``name=spec``.

    Args:
      spec: a directory with ``meta.json`` + ``nodes.safetensors``, or a preset name.
      problems: for a preset, the number of problems (None: the benchmark's count).
      trace_seed: for a preset, the generator seed.
      split: ``train`` / ``validation`` / ``test`` / ``all`` (None: ``all``, every problem).
    """
    try:
        traces, full = load_trace_set(spec, problems=problems, seed=int(trace_seed), name=name,
                                      split=split, split_name=split_name)
    except BadInput as e:
        raise EvalError(str(e)) from None
    info = {k: full[k] for k in ("source", "benchmark", "synthetic", "trace_seed", "stand_in")
            if k in full}
    info.update(problems=full["num_problems"], nodes=full["num_nodes"],
                feature_dim=full["feature_dim"], split=full["split"],
                problems_total=full["problems_total"])
    return LoadedTraces(traces, info)


def split_label(traces_info: dict, policy: "LoadedPolicy | None" = None) -> str:
    """How a table names the problems it was measured on, e.g. ``test split (198 of 1319
    problems)``; ``all`` (and a policy trained on every problem) are labelled as including
    training problems."""
    split = traces_info.get("split", "all")
    n, total = traces_info.get("problems"), traces_info.get("problems_total", "?")
    if split == "all":
        text = f"all {n} problems (includes training problems)"
    else:
        text = f"{split} split ({n} of {total} problems)"
    trained_on = policy_split(policy)
    if policy is not None and split != "train" and trained_on != "train":
        text += f"; the policy trained on {trained_on or 'all'} problems of its set"
    return text


def policy_split(policy: "LoadedPolicy | None") -> str | None:
    """The split a policy run trained on (``policy_meta.json``; None for runs before splits
    or without a policy)."""
    if policy is None:
        return None
    return policy.meta.get("traces", {}).get("split")


def evaluation_seed0(traces_info: dict, policy: "LoadedPolicy | None", seeds: int,
                     seed0: int = 0, flag: str = "--seed0/--seeds") -> int:
    """The first ``jax.random.key`` seed of an evaluation: the split's seed range
    (``prada_jax.traces.splits``: validation for ``validation``, else test) + ``seed0``.
    Checked at start, before anything is written: ``EvalError`` naming ``flag`` if the
    range leaves its own or meets the policy run's training seeds."""
    train_seeds = policy.meta.get("seeds", []) if policy is not None else []
    try:
        first, _ = splits.evaluation_seeds(traces_info.get("split"), seed0, seeds,
                                           train_seeds=train_seeds, flag=flag)
    except BadInput as e:
        raise EvalError(str(e)) from None
    return first


def resolve_traces(policy, traces_flag, problems, trace_seed):
    """(trace spec, problems, generator seed) for evaluation.

    A folder is used as it is. A synthetic preset (the flag, else the policy run's preset,
    else gsm8k) defaults to the policy run's trace seed (0 without a policy) +
    ``HELD_OUT_SEED_OFFSET`` (0: the training problems) and the policy run's problem count.
    """
    env = None
    if policy is not None and policy.config is not None and "env" in policy.config:
        env = policy.config.env
    if traces_flag and Path(traces_flag).exists():
        return traces_flag, problems, 0
    if not traces_flag and env is not None and env.get("trace_dir"):
        return env.trace_dir, problems, 0
    spec = traces_flag or (env.get("preset", "gsm8k") if env is not None else "gsm8k")
    base_seed = int(env.get("trace_seed", 0)) if env is not None else 0
    seed = trace_seed if trace_seed is not None else base_seed + HELD_OUT_SEED_OFFSET
    if problems is None and env is not None:
        problems = int(env.get("problems", 0)) or None
    return spec, problems, seed


def load_policy(workdir: str, step: int | None = None, flag: str = "--policy") -> LoadedPolicy:
    """``prada_jax.rl.policy.load_checked`` (checked, cached) with failures raised as
    ``EvalError``."""
    return policy_files.load_checked(workdir, step, flag, error=EvalError)


def params_sha256(params: Any) -> str:
    """sha256 of a parameter pytree's content: every leaf's tree path, dtype, shape and bytes,
    in tree order. The same restored parameters give the same hash wherever the run folder is
    stored (copied, moved, on another machine)."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def policy_record(policy_dir: str | Path, root: str | Path) -> dict:
    """How a results file names the policy it evaluated: ``policy`` = the run folder relative
    to ``root`` (the results' own folder) when it lies inside it, else None; and
    ``policy_sha256`` = ``params_sha256`` of its restored parameters, which names it wherever
    it is stored (committed results recorded paths in a temporary folder of the machine that
    ran them, which name nothing)."""
    policy = load_policy(str(policy_dir))
    try:
        rel = str(Path(policy_dir).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        rel = None
    return {"policy": rel, "policy_sha256": params_sha256(policy.params)}


def check_policy_traces(policy: LoadedPolicy, traces: LoadedTraces) -> None:
    """Refuses a trace set whose observation size differs from the policy's."""
    want = policy.meta.get("traces", {}).get("feature_dim")
    obs_dim = int(policy.meta.get("obs_dim", -1))
    got = int(traces.info["feature_dim"])
    if (want is not None and int(want) != got) or (obs_dim >= 0 and obs_dim != got + 2):
        raise EvalError(
            f"--policy={policy.workdir} was trained on traces with feature_dim {want} "
            f"(obs_dim {obs_dim}, source {policy.meta.get('traces', {}).get('source')}) but "
            f"--traces={traces.info['source']} has feature_dim {got}: a checkpoint only runs on "
            "trace sets of the shape it was trained on")


def load_multipliers(dual_workdir: str) -> tuple[float, float, dict]:
    """(λ_s, µ per Hz, info) from a ``train.dual`` run; ``EvalError`` naming the folder.

    ``info`` holds ``file`` and every other field of ``multipliers.json`` (the ``scenario`` it
    was learned for, ...), read by ``prada_jax.dual.files.read_multipliers`` (the range
    checks live there).
    """
    path = Path(dual_workdir)
    if not path.is_dir():
        raise EvalError(f"--dual={dual_workdir}: no such run directory")
    try:
        mult, stored = dual_lib.read_multipliers(path, error=EvalError)
    except EvalError as e:
        raise EvalError(f"--dual={dual_workdir}: cannot load the multipliers: {e}") from None
    return mult.lambda_s, mult.mu, dict(file=str(path / dual_lib.MULTIPLIERS_FILE), **stored)


_SCENARIO_KEYS = (("num_users", "U", 1.0, ""), ("num_servers", "M", 1.0, ""),
                  ("bandwidth_hz", "B", 1e-6, " MHz"), ("arrival_rate_hz", "λ", 1.0, "/s"),
                  ("beta", "β", 1.0, ""), ("tau_s", "τ", 1.0, " s"))


def scenario_mismatch(dual_info: dict, env_kw: dict, traces_info: dict,
                      policy: LoadedPolicy | None) -> str | None:
    """None if the ``--dual`` multipliers were learned for this scenario, else one line naming
    both scenarios (the dual run's as recorded in ``multipliers.json``, and this evaluation's).

    Compared: U, M, B, λ, β, τ, the arrival schedule (``envs.scenarios`` preset name, and its
    length unless nominal; ``env_kw["scenario"]`` / ``["scenario_length"]``, absent = a
    stationary "nominal" evaluation), the clock's hardware pair (absent = ``paper``), the
    benchmark of the traces and the policy run directory.
    A ``multipliers.json`` without a ``scenario`` record (older runs) is not compared.
    """
    sc = dual_info.get("scenario")
    if not isinstance(sc, dict):
        return None
    theirs, ours, differ = [], [], []
    for key, sym, scale, unit in _SCENARIO_KEYS:
        if key not in sc or key not in env_kw:
            continue
        a, b = float(sc[key]), float(env_kw[key])
        theirs.append(f"{sym}={a * scale:g}{unit}")
        ours.append(f"{sym}={b * scale:g}{unit}")
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0):
            differ.append(sym)
    theirs_hw = str(sc.get("hardware", latency.PAPER))   # absent: learned before pairs existed
    mine_hw = str(env_kw.get("hardware", latency.PAPER))
    if theirs_hw != mine_hw or mine_hw != latency.PAPER:
        theirs.append(f"hardware {theirs_hw}")
        ours.append(f"hardware {mine_hw}")
        if theirs_hw != mine_hw:
            differ.append("hardware")
    if sc.get("scenario") is not None:   # the schedule (envs.scenarios preset) learned on
        mine_sc = str(env_kw.get("scenario", "nominal"))
        theirs_len = sc.get("scenario_length")
        mine_len = env_kw.get("scenario_length")
        theirs.append(f"schedule {sc['scenario']}"
                      + (f"/{theirs_len}" if theirs_len is not None else ""))
        ours.append(f"schedule {mine_sc}" + (f"/{mine_len}" if mine_len is not None else ""))
        if str(sc["scenario"]) != mine_sc or (
                mine_sc != "nominal" and None not in (theirs_len, mine_len)
                and int(theirs_len) != int(mine_len)):
            differ.append("schedule")
    tr = sc.get("traces") if isinstance(sc.get("traces"), dict) else {}
    if tr.get("benchmark") is not None:
        theirs.append(f"traces {tr['benchmark']}")
        ours.append(f"traces {traces_info.get('benchmark')}")
        if tr["benchmark"] != traces_info.get("benchmark"):
            differ.append("traces")
    pol = sc.get("policy") if isinstance(sc.get("policy"), dict) else {}
    if pol:
        mine = str(Path(policy.workdir).resolve()) if policy is not None else None
        if pol.get("kind") == "ppo":
            theirs.append(f"policy {pol.get('workdir')}")
            same = mine is not None and Path(str(pol.get("workdir"))).resolve() == Path(mine)
        else:
            theirs.append(f"policy {pol.get('kind')}")
            same = False
        ours.append(f"policy {policy.workdir if policy is not None else None}")
        if not same:
            differ.append("policy")
    if not differ:
        return None
    return (f"multipliers learned for another scenario (differs in {', '.join(differ)}): "
            f"dual run {' '.join(theirs)}; this evaluation {' '.join(ours)}")


def check_scenario(dual_flag: str, dual_info: dict, env_kw: dict, traces_info: dict,
                   policy: LoadedPolicy | None, allow: bool = False,
                   allow_flag: str = "--allow_scenario_mismatch") -> str | None:
    """The one check of stored multipliers against the scenario they are applied to (every
    command that takes a ``train.dual`` run: ``evals.run``, ``evals.sweep``, ``train.main``).

    Raises ``EvalError`` (exit 2) with one line ``<dual_flag>: <scenario_mismatch line> (pass
    <allow_flag> to apply them anyway)``; with ``allow`` prints that line as ``warning: ...`` on
    stderr instead and returns it. None when the scenarios match (or none was recorded)."""
    mismatch = scenario_mismatch(dual_info, env_kw, traces_info, policy)
    if mismatch is None:
        return None
    if not allow:
        hint = f" (pass {allow_flag} to apply them anyway)" if allow_flag else ""
        raise EvalError(f"{dual_flag}: {mismatch}{hint}")
    print(f"warning: {dual_flag}: {mismatch}", file=sys.stderr, flush=True)
    return mismatch


def load_inputs(policy_dir: str | None, step: int | None, dual_dir: str | None,
                traces_flag: str | None, problems: int | None, trace_seed: int,
                split: str | None = None):
    """What ``evals.run`` and ``evals.sweep`` load from their flags, checked together
    (``split``: the part of the trace set, ``--split``; None = every problem).

    Returns ``(policy or None, (lambda_s, mu) or None, dual_info dict, traces)``. Raises
    ``EvalError`` naming the flag and folder.
    """
    policy = load_policy(policy_dir, step) if policy_dir else None
    mult, dual_info = None, {}
    if dual_dir:
        if policy is None:
            raise EvalError("--dual needs --policy (PRADA = policy + multipliers)")
        lam, mu, dual_info = load_multipliers(dual_dir)
        mult = (lam, mu)
    spec, n, tseed = resolve_traces(policy, traces_flag, problems, trace_seed)
    traces = load_traces(spec, n, tseed, split=split)
    if policy is not None:
        check_policy_traces(policy, traces)
    return policy, mult, dual_info, traces


#: The largest U (user slots) or M (server sequences) a command-line flag or grid may ask for
#: (2^20). The env indexes users, slots and jobs with int32 arithmetic, so a count at or above
#: 2^31 overflows; every size well below that is still far beyond what one machine evaluates
#: (the size a machine can hold is a separate, smaller limit). Checked where the flags are
#: parsed (``check_env_overrides``, ``evals.sweep.parse_grid``), before anything is loaded.
MAX_ENV_COUNT = 2 ** 20
def check_server_model_applies(server_model: str | None, pairs: Sequence[str],
                               flag: str = "--hardware") -> None:
    """Refuses ``--server_model`` when every pair of the evaluation is the ``paper`` clock,
    which has one server (fixed-slot jobs) and ignores it: the run would record a server model
    that had no effect. ``EvalError`` naming the flag; None (not given) passes."""
    if server_model is None or not pairs:
        return
    if all(latency.PAIRS.get(p, ()) is None for p in pairs):
        raise EvalError(f"--server_model={server_model}: has no effect under the "
                        f"{latency.PAPER} clock ({flag}={','.join(pairs)}); the server model "
                        "applies to a roofline pair only")


def users_for(rate_hz: float, worst_latency_s: float, margin: float = 1.25) -> int:
    """User slots U a population needs so that arrivals at ``rate_hz`` are (almost) never
    blocked while users stay up to ``worst_latency_s`` (Little's law with a margin):
    ``ceil(margin · λ · L / 64) · 64``, at least 16. An evaluation that sizes U this way and
    still blocks arrivals has users staying longer than ``worst_latency_s`` (an overloaded
    row), which its ``U binds`` flag shows."""
    need = margin * max(float(rate_hz), 0.0) * max(float(worst_latency_s), 0.0)
    return max(16, int(math.ceil(need / 64.0)) * 64)


#: Memory one user slot of one vmapped env costs an evaluation, upper estimate [bytes]: measured
#: 1.08 GB peak for 16 envs × 2 048 users (an ``evals.curve`` point, process included) and
#: 1.09 GB for 6 rows × 1 seed × 100 000 users run one row at a time (docs/BENCHMARKS.md).
BYTES_PER_USER_ENV = 32e3
#: Memory one latency-histogram bin of one vmapped env costs an evaluation [bytes]: the
#: evaluator keeps a float32 histogram of ``drain_slots + 1`` bins per env (``latency_hist``
#: [S, D + 1], evals.evaluate) in the scan's carry; counted twice (the carry and the updated
#: copy a step may hold), an upper estimate.
BYTES_PER_HIST_BIN_ENV = 2 * 4


def physical_memory_bytes() -> float | None:
    """This machine's physical memory [bytes], or None where POSIX ``sysconf`` cannot say."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(num_envs: int, num_users: int, flag: str = "--num_users",
               drain_slots: int = 0) -> None:
    """Refuses an evaluation of ``num_envs`` vmapped envs × ``num_users`` user slots (and a
    latency histogram of ``drain_slots + 1`` bins each, when ``drain_slots`` > 0) whose
    estimated memory (``BYTES_PER_USER_ENV`` a user slot, ``BYTES_PER_HIST_BIN_ENV`` a bin)
    exceeds 80 % of this machine's physical memory, before anything is compiled:
    ``EvalError`` naming ``flag`` (or ``--drain_slots`` when the histogram is the larger
    part), the estimate and the limit."""
    total = physical_memory_bytes()
    if total is None:   # not a POSIX sysconf: no check
        return
    users = float(num_envs) * float(num_users) * BYTES_PER_USER_ENV
    hist = (float(num_envs) * (float(drain_slots) + 1.0) * BYTES_PER_HIST_BIN_ENV
            if drain_slots > 0 else 0.0)
    need = users + hist
    if need > 0.8 * total:
        if hist > users:
            raise EvalError(f"--drain_slots={drain_slots}: {num_envs} envs × a latency "
                            f"histogram of {drain_slots + 1} bins (and {num_users} user slots) "
                            f"need about {need / 1e9:.1f} GB, more than 80 % of this "
                            f"machine's {total / 1e9:.1f} GB; use fewer drain slots or seeds")
        raise EvalError(f"{flag}={num_users}: {num_envs} envs × {num_users} user slots need about "
                        f"{need / 1e9:.1f} GB, more than 80 % of this machine's "
                        f"{total / 1e9:.1f} GB; use fewer user slots, seeds, rows or loads")


def check_env_overrides(overrides: dict) -> None:
    """Refuses scenario flags that cannot describe an env: U, M, B, λ must be > 0 and β >= 0
    (finite), U and M at most ``MAX_ENV_COUNT``; ``EvalError`` naming the flag. ``None``
    values (not given) pass."""
    for key, v in overrides.items():
        if v is None:
            continue
        ok = math.isfinite(float(v)) and (float(v) >= 0 if key == "beta" else float(v) > 0)
        if not ok:
            raise EvalError(f"--{key}={v}: must be a finite number "
                            f"{'>= 0' if key == 'beta' else '> 0'}")
        if key in ("num_users", "num_servers") and v > MAX_ENV_COUNT:
            raise EvalError(f"--{key}={v}: must be at most {MAX_ENV_COUNT} (2^20; the env's "
                            "int32 index arithmetic overflows at 2^31)")


def check_hardware(hardware: str, flag: str) -> None:
    """Refuses an unknown hardware pair or a pair file with a profile out of range:
    ``EvalError`` naming ``flag``."""
    try:
        latency.check_pair(hardware, flag)
    except BadInput as e:
        raise EvalError(str(e)) from None


def env_kwargs_from(config: Any | None, overrides: dict) -> dict:
    """Env settings for evaluation: the contention env (M, B, λ, outages on) with the policy
    run's U, β, τ, M, B, λ and hardware pair where it has them, then ``overrides`` (non-None
    flags). A ``hardware`` override other than the policy's prints one ``note:`` line on
    stderr (the policy is evaluated under a clock it was not trained under)."""
    kw = dict(num_users=16, num_servers=4, bandwidth_hz=20e6, arrival_rate_hz=4.0, beta=0.02,
              tau_s=0.05, hardware=latency.CONFIG_PAIR,
              server_model="serving")   # β, pair, server: the configs' defaults
    if config is not None:
        env = config.env
        kw["hardware"] = latency.DEFAULT_PAIR   # a run stored without a pair ran the paper clock
        kw["server_model"] = "legacy"           # ... and without a server model, the legacy one
        for k in ("num_users", "num_servers", "bandwidth_hz", "arrival_rate_hz", "beta", "tau_s",
                  "hardware", "server_model"):
            if k in env:
                kw[k] = type(kw[k])(env[k])
        hw = overrides.get("hardware")
        if hw is not None and hw != kw["hardware"]:
            print(f"note: the policy was trained under hardware {kw['hardware']}; evaluating "
                  f"under {hw}", file=sys.stderr, flush=True)
        if not bool(env.get("contention", True)):
            # The policy trained on the per-user MDP; evaluate it on the multi-user env with the
            # contention defaults (U = 16 unless overridden).
            kw["num_users"] = max(int(kw["num_users"]), 16)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    for k in ("num_users", "num_servers"):
        kw[k] = int(kw[k])
    return kw


def evaluate_rows(traces: LoadedTraces, env_kw: dict, *, policy: LoadedPolicy | None,
                  multipliers: tuple[float, float] | None, seeds: int, slots: int,
                  warmup_slots: int, extra_policies: Sequence[LoadedPolicy] = (),
                  random_row: bool = True, seed0: int = 0,
                  progress=None, drain_slots: int = ev.DEFAULT_DRAIN_SLOTS
                  ) -> tuple[dict, dict]:
    """Evaluates every row over seeds (``evals.evaluate``'s measurement: empty start, the
    cohort arriving in ``[warmup_slots, slots)``, ``drain_slots`` after it, timeout
    ``drain_slots``·τ).

    ``seed0`` is an offset inside the split's seed range (``evaluation_seed0``, checked
    against the policy's training seeds before anything runs).

    Returns:
      (per_seed, info): ``per_seed[row][metric]`` [S] arrays; ``info`` has the matched random
      probability, the env settings, the split and the ``jax.random.key`` seeds used.
    """
    for extra in extra_policies:   # their training seeds are checked too
        evaluation_seed0(traces.info, extra, seeds, seed0)
    seed0 = evaluation_seed0(traces.info, policy, seeds, seed0)
    params = edge.make_params(traces.traces, **env_kw)
    rows: dict[str, dict] = {}
    info: dict = {"env": env_kw, "seeds": seeds, "slots": slots, "warmup_slots": warmup_slots,
                  "drain_slots": drain_slots,
                  "timeout_s": drain_slots * float(env_kw.get("tau_s", 0.05)),
                  "split": traces.info.get("split", "all"),
                  "split_label": split_label(traces.info, policy),
                  "eval_seed_range": [seed0, seed0 + seeds]}
    say = progress or (lambda msg: None)
    base = ev.Evaluator(params, seeds, slots, warmup_slots, seed0=seed0,
                        drain_slots=drain_slots) if policy is None else \
        ev.Evaluator(params, seeds, slots, warmup_slots, policy.apply_fn, policy.params,
                     seed0=seed0, drain_slots=drain_slots)
    for spec in baseline_rows():
        say(f"evaluating {spec.name}")
        rows[spec.name] = run_row(base, spec)
    target = None
    if policy is not None:
        lam, mu = multipliers if multipliers is not None else (None, None)
        for spec in ev.policy_specs(lam, mu):
            say(f"evaluating {spec.name}")
            rows[spec.name] = base.run(spec)
        target_row = "PRADA" if "PRADA" in rows else "PRADA (λ=µ=0)"
        target = float(np.nanmean(rows[target_row]["offload_rate"]))
        info["random_matched_to"] = target_row
    if random_row:
        if target is None:
            target = 0.5
            info["random_matched_to"] = "fixed 0.5 (no policy)"
        say("evaluating Random (matched)")
        p, rows["Random (matched)"] = ev.matched_random_probability(base, target)
        info["random_nomination_prob"] = p
    for extra in extra_policies:
        check_policy_traces(extra, traces)
        e2 = ev.Evaluator(params, seeds, slots, warmup_slots, extra.apply_fn, extra.params,
                          seed0=seed0, drain_slots=drain_slots)
        name = f"ckpt:{Path(extra.workdir).name}"
        say(f"evaluating {name}")
        lam, mu = multipliers if multipliers is not None else (0.0, 0.0)
        rows[name] = e2.run(ev.PolicySpec(name, "policy", "threshold", lam, mu))
    order = ["All-SLM", ALL_LLM, DRAFT_RECOMPUTE, "Random (matched)", "RSD (online PRM)",
             "Policy (no limits)",
             "Policy + FIFO-greedy", "PRADA (λ=µ=0)", "PRADA"]
    ordered = {k: rows[k] for k in order if k in rows}
    ordered.update({k: v for k, v in rows.items() if k not in ordered})
    return ordered, info


def headline(per_seed: dict, reference: str = ALL_LLM) -> dict[str, Any]:
    """PRADA (or its λ=µ=0 variant) accuracy and latency as shares of ``reference`` (the
    paper's All-LLM, the server LLM alone)."""
    name = "PRADA" if "PRADA" in per_seed else ("PRADA (λ=µ=0)" if "PRADA (λ=µ=0)" in per_seed
                                                else None)
    if name is None or reference not in per_seed:
        return {}
    r = report.ratios(per_seed, name, reference, ("accuracy", "latency_mean_s"))
    out = {"policy": name, "reference": reference,
           "accuracy_share": r["accuracy"], "latency_share": r["latency_mean_s"],
           "objective_diff": stats.mean_ci(np.asarray(per_seed[name]["objective"])
                                           - np.asarray(per_seed[reference]["objective"]))}
    summ = report.summarize({k: per_seed[k] for k in (name, reference)})
    out["flags"] = {k: report.row_flags(summ[k]) for k in (name, reference)}
    out["rho"] = {k: summ[k]["rho"].mean for k in (name, reference) if "rho" in summ[k]}
    if any(report.UNSTABLE in f for f in out["flags"].values()):
        out["latency_share"] = None   # a latency of an unstable row is not reported
    if "All-SLM" in per_seed:
        # Context: what keeping every draft already retains, and PRADA's paired accuracy gain
        # over it (both on the same seeds).
        s = report.ratios(per_seed, "All-SLM", reference, ("accuracy", "latency_mean_s"))
        out["slm_accuracy_share"] = s["accuracy"]
        out["slm_latency_share"] = (None if report.UNSTABLE in out["flags"][reference]
                                    else s["latency_mean_s"])
        out["accuracy_gain_over_slm"] = stats.mean_ci(
            np.asarray(per_seed[name]["accuracy"]) - np.asarray(per_seed["All-SLM"]["accuracy"]))
    return out


def _share_text(what: str, share, reference: str) -> str:
    """``what`` as a share of ``reference`` with its CI, or why there is none (the
    reference's mean is 0 on a seed, e.g. All-LLM solving nothing: the ratio is undefined)."""
    if not (math.isfinite(share.mean) and math.isfinite(share.low)
            and math.isfinite(share.high)):
        return f"{what} share undefined ({reference}'s {what} is 0 on some seed)"
    return (f"{what} {share.fmt(1, 100)} %  (95% CI [{100 * share.low:.1f}, "
            f"{100 * share.high:.1f}])")


def headline_text(h: dict, synthetic: bool) -> str:
    if not h:
        return ""
    tag = " [synthetic traces]" if synthetic else ""
    a, l = h["accuracy_share"], h["latency_share"]
    lat = ("mean latency withheld (an unstable row, ρ ≥ 1)" if l is None else
           _share_text("mean latency", l, h["reference"]))
    text = (f"{h['policy']} / {h['reference']}{tag}: "
            f"{_share_text('accuracy', a, h['reference'])}, {lat}")
    if "objective_diff" in h:
        o = h["objective_diff"]
        rho = h.get("rho", {})
        text += (f"; objective {h['policy']} − {h['reference']} (paired) {o.fmt(3)} "
                 f"(95% CI [{o.low:.3f}, {o.high:.3f}])"
                 + "".join(f"; ρ {k} {v:.2f}" for k, v in rho.items()))
    if "slm_accuracy_share" in h:
        g = h["accuracy_gain_over_slm"]
        sl = h["slm_latency_share"]
        sa = h["slm_accuracy_share"]
        text += (f"\n  for context, All-SLM / {h['reference']}: accuracy "
                 + (f"{sa.fmt(1, 100)} %" if math.isfinite(sa.mean) else "share undefined")
                 + ", mean latency "
                 + ("withheld (unstable reference)" if sl is None else f"{sl.fmt(1, 100)} %")
                 + f"; {h['policy']} − All-SLM accuracy (paired): {g.fmt(1, 100)} points")
    return text


#: The mark of a table row whose numbers come from a stand-in model (``mark_stand_in_rows``).
STAND_IN_MARK = "†"


def mark_stand_in_rows(table: str, stand_in: dict | None) -> str:
    """``table`` (``report.format_table``) with the rows that rest on a stand-in role
    (``prada_jax.traces.format.STAND_IN_ROWS``: All-LLM and Draft-then-LLM on the LLM role,
    RSD on the PRM role) marked ``†`` after their name, and a footnote naming each stand-in
    role with its ``meta.json`` note. Unchanged when ``stand_in`` is empty."""
    if not stand_in:
        return table
    rows = {name: role for role in stand_in for name in tf.STAND_IN_ROWS.get(role, ())}
    lines = table.split("\n")
    for i, line in enumerate(lines):
        for name in rows:
            if line.startswith(name + "   "):   # the name column has room for the mark
                lines[i] = name + " " + STAND_IN_MARK + line[len(name) + 2:]
            elif line.startswith(name + "  "):
                lines[i] = name + STAND_IN_MARK + line[len(name) + 1:]
    notes = "; ".join(f"{role}: {note}" for role, note in stand_in.items())
    marked = ", ".join(sorted(rows))
    return "\n".join(lines) + (f"\n{STAND_IN_MARK} stand-in: {marked} rest on a role this trace "
                               f"set's models fill only as stand-ins (meta.json roles — "
                               f"{notes})")


def write_outputs(per_seed: dict, out_dir: str | Path, *, title: str, meta: dict,
                  tb_step: int = 0) -> dict:
    """Writes results.json, results.csv, table.txt, figures and TensorBoard under ``out_dir``.

    Returns a dict of the paths, the table text and the headline.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = report.summarize(per_seed)
    table = mark_stand_in_rows(report.format_table(summary, title=title),
                               meta.get("traces", {}).get("stand_in"))
    h = headline(per_seed)
    synthetic = bool(meta.get("traces", {}).get("synthetic", False))
    htext = headline_text(h, synthetic)
    extra = {"meta": meta}
    if h:
        extra["headline"] = {k: (v.to_json_dict() if hasattr(v, "to_json_dict") else v)
                             for k, v in h.items()}
    write_json(out / "results.json", report.to_json_dict(per_seed, summary, extra))
    report.write_csv(out / "results.csv", summary)
    (out / "table.txt").write_text(table + ("\n\n" + htext if htext else "") + "\n")
    names = list(summary)
    figs = {}
    for metric, label in (("accuracy", "accuracy"), ("latency_mean_s", "mean latency (s)")):
        nan = float("nan")   # a withheld latency (unstable row) is drawn as no bar
        cis = [summary[n][metric] if not report.withheld(summary[n], metric)
               else stats.MeanCI(nan, nan, nan, nan, 0) for n in names]
        band = ([c.mean for c in cis], [c.low for c in cis], [c.high for c in cis])
        figs[metric] = plots.plot_bars(names, band, ylabel=label,
                                       title=(f"{label} — {title}" if "95% CI" in title
                                              else f"{label} (mean ± 95% CI) — {title}"),
                                       path=out / f"{metric}.png")
    comps = {c: [float("nan") if report.withheld(summary[n], m) else summary[n][m].mean
                 for n in names] for c, m in
             (("processing", "processing_s"), ("communication", "communication_s"),
              ("queueing", "queueing_s"))}
    figs["delay_split"] = plots.plot_delay_split_bars(names, comps, title=title,
                                                      path=out / "delay_split.png")
    finite = lambda d: {k: v for k, v in d.items() if math.isfinite(float(v))}  # noqa: E731
    with MetricWriter(out / "tb") as w:   # an undefined value (NaN) is left out, not drawn
        w.write_scalars(tb_step, finite(report.tb_scalars(summary)))
        if h:
            w.write_scalars(tb_step, finite(
                {"eval/headline/accuracy_share": h["accuracy_share"].mean}))
            if h["latency_share"] is not None:
                w.write_scalars(tb_step, finite(
                    {"eval/headline/latency_share": h["latency_share"].mean}))
        w.write_texts(tb_step, {"eval/table": "```\n" + table + "\n\n" + htext + "\n```",
                                "eval/meta": "```\n" + json.dumps(meta, indent=2, default=str)
                                + "\n```"})
        w.write_images(tb_step, {f"eval/{k}": plots.png_to_rgb(p) for k, p in figs.items()})
    return {"table": table, "headline": h, "headline_text": htext,
            "json": out / "results.json", "csv": out / "results.csv", "figures": figs,
            "tb": out / "tb"}
