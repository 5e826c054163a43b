"""The flags the evaluation commands share (``evals.run``, ``evals.curve``, ``evals.sweep``,
``evals.screening``) and the loader of what they name (:func:`inputs_from_flags`, built on
``evals.suite``'s loaders and checks)."""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

from absl import flags

from envs import edge
from evals import evaluate as ev
from evals.suite import (DEFAULT_SPLIT, EvalError, check_env_overrides, check_hardware,
                         check_scenario, check_server_model_applies, env_kwargs_from,
                         load_inputs)
from prada_jax import latency
from prada_jax.errors import BadInput
from prada_jax.rl.policy import LoadedPolicy

_ENV_FLAGS = ("num_users", "num_servers", "bandwidth_hz", "arrival_rate_hz", "beta")

#: The largest slot count (``--slots``, ``--warmup_slots``, ``--drain_slots``) a command takes
#: (2^30): slot indices are int32 in the env's state, so a run of 2^31 slots overflows them.
MAX_SLOTS = 2 ** 30


def define_window_flags(seeds: int, seeds_help: str, slots: int, warmup_slots: int) -> None:
    """Defines the measured window's flags of ``evals.sweep`` and ``evals.curve``: ``--seeds``,
    ``--slots`` (the window ends there), ``--warmup_slots`` (it starts there) and
    ``--drain_slots`` (run after it; a measured user's timeout), with these defaults."""
    kw = {"module_name": sys.argv[0]}   # the command's own flags in --help
    flags.DEFINE_integer("seeds", seeds, seeds_help, lower_bound=1, **kw)
    flags.DEFINE_integer("slots", slots, "the measured window ends at this slot.", lower_bound=2,
                         upper_bound=MAX_SLOTS, **kw)
    flags.DEFINE_integer("warmup_slots", warmup_slots, "the measured window starts at this "
                         "slot.", lower_bound=0, upper_bound=MAX_SLOTS, **kw)
    flags.DEFINE_integer("drain_slots", ev.DEFAULT_DRAIN_SLOTS, "slots run after the window; "
                         "the timeout of a measured user is drain_slots·τ.", lower_bound=1,
                         upper_bound=MAX_SLOTS, **kw)


def define_input_flags(env_note: str = "") -> None:
    """Defines the input flags ``evals.run`` and ``evals.sweep`` share (listed by their
    ``--help``): ``--policy``, ``--step``, ``--dual``, ``--allow_scenario_mismatch``,
    ``--traces``, ``--problems``, ``--trace_seed`` and the env overrides ``--num_users``,
    ``--num_servers``, ``--bandwidth_hz`` [Hz], ``--arrival_rate_hz`` [users/s], ``--beta``
    [PRM units/s]. ``env_note`` is appended to the M, B and λ help texts."""
    kw = {"module_name": sys.argv[0]}   # the command's own flags in --help
    flags.DEFINE_string("policy", None, "train.ppo run directory of the screening policy "
                        "(omit for the baseline rows only).", **kw)
    flags.DEFINE_integer("step", None, "checkpoint step of --policy (default: latest).", **kw)
    flags.DEFINE_string("dual", None, "train.dual run directory with the learned multipliers.",
                        **kw)
    flags.DEFINE_bool("allow_scenario_mismatch", False, "apply --dual multipliers learned for "
                      "another scenario (U, M, B, λ, β, τ, schedule, traces) or another "
                      "policy, with a one-line warning, instead of refusing (exit 2).", **kw)
    flags.DEFINE_string("traces", None, "trace folder or synthetic preset (gsm8k, gaokao2023en, "
                        "mmlu_stem). Default: the policy's trace set (same preset, generator "
                        "seed and problems), else gsm8k.", **kw)
    flags.DEFINE_integer("problems", None, "problems of a synthetic preset (default: the "
                         "policy's, else the benchmark's count).", **kw)
    flags.DEFINE_integer("trace_seed", None, "generator seed of a synthetic preset (default: the "
                         "policy's; another seed also redraws the synthetic feature "
                         "projection).", **kw)
    flags.DEFINE_string("split", DEFAULT_SPLIT, "part of the trace set to report: test "
                        "(default; problems no policy trained on), validation (for choices), "
                        "train, or all (every problem, labelled as including training "
                        "problems). A trace folder needs 'splits' in its meta.json.", **kw)
    flags.DEFINE_integer("num_users", None, "U user slots (default: the policy run's, >= 16).",
                         **kw)
    flags.DEFINE_integer("num_servers", None, f"M, server jobs at once{env_note}.", **kw)
    flags.DEFINE_float("bandwidth_hz", None, f"B, total bandwidth [Hz]{env_note}.", **kw)
    flags.DEFINE_float("arrival_rate_hz", None, f"λ, Poisson arrival rate [users/s]{env_note}.",
                       **kw)
    flags.DEFINE_float("beta", None, "β, quality-latency trade-off [PRM units/s].", **kw)
    flags.DEFINE_string("hardware", None, "(edge, server) hardware pair of the clock: "
                        f"{', '.join(latency.PAIRS)}, or a .json file of two profiles "
                        "(docs/latency.md). Default: the policy run's (env.hardware; paper "
                        f"for runs stored without one), else {latency.CONFIG_PAIR}.", **kw)
    flags.DEFINE_enum("server_model", None, list(edge.SERVER_MODELS), "server of a roofline "
                      "pair: serving (continuous batching, chunked prefill, the online PRM as a "
                      "server job; envs.serving) or legacy (the server before issue 41). "
                      "Default: the policy run's (env.server_model; legacy for runs stored "
                      "without one), else serving.", **kw)


class FlagInputs(NamedTuple):
    policy: LoadedPolicy | None
    multipliers: tuple[float, float] | None   # (λ_s, µ per Hz)
    dual_info: dict
    traces: Any
    env_kw: dict


def inputs_from_flags(F) -> FlagInputs:
    """Loads and checks what the flags of :func:`define_input_flags` name, in one place: the
    env overrides (``check_env_overrides``), policy, multipliers and traces
    (``load_inputs``), the evaluation env (``env_kwargs_from``) and the multipliers' scenario
    (``check_scenario``, honouring ``--allow_scenario_mismatch``). Raises ``EvalError``."""
    overrides = {k: getattr(F, k) for k in _ENV_FLAGS}
    check_env_overrides(overrides)
    hardware = getattr(F, "hardware", None)
    if hardware is not None:
        check_hardware(hardware, "--hardware")
        overrides["hardware"] = hardware
    server_model = getattr(F, "server_model", None)
    if server_model is not None:
        overrides["server_model"] = server_model
    policy, mult, dual_info, traces = load_inputs(F.policy, F.step, F.dual, F.traces,
                                                  F.problems, F.trace_seed, split=F.split)
    env_kw = env_kwargs_from(policy.config if policy else None, overrides)
    if getattr(F, "pairs", None) is None:   # evals.curve checks its --pairs itself
        check_server_model_applies(server_model, [env_kw["hardware"]])
    try:   # the env the flags describe, checked before anything runs (e.g. M vs KV memory)
        edge.make_params(traces.traces, **env_kw)
    except BadInput as e:
        raise EvalError(str(e)) from None
    if mult is not None:
        check_scenario(f"--dual={F.dual}", dual_info, env_kw, traces.info, policy,
                       allow=F.allow_scenario_mismatch)
    return FlagInputs(policy, mult, dual_info, traces, env_kw)
