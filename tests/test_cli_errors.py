"""The error contract of every command, swept over a corpus of bad inputs (README, "Errors and
exit codes"): each case runs the command (each command's first default case in a subprocess,
``python -m``, to test the real entry; the others in-process through the same ``__main__``,
the conftest's ``run_command``) and asserts

* the exit code (2 bad input, 3 non-finite training, 1 a bug);
* stderr is exactly one non-empty line ``error: ...`` that names the flag, file or field
  (``Case.names``, a regex);
* nothing was written: the tree of the case's tmp folder (inputs, the working directory the
  command runs in, the output paths it was given) is the same before and after.

The corpus is data: ``INPUTS`` builds named bad (or good) inputs on demand, ``CASES`` lists the
commands with their arguments, where ``{name}`` is the path of input ``name`` (built only when
a case uses it), ``{out}`` a path that must not appear, ``{repo}`` the repository root. Add a
command's cases by appending to ``CASES`` (and ``INPUTS``); ``slow=True`` keeps a case out of
the default run (only cases that need a trained policy; every command keeps at least one
default case).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import string
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[1]
PPO_CFG = "{repo}/prada_jax/configs/ppo.py"
DUAL_CFG = "{repo}/prada_jax/configs/dual.py"
DISTILL_CFG = "{repo}/prada_jax/configs/distill.py"


# ----------------------------------------------------------------------------- inputs

def _valid_traces(path: Path) -> None:
    """A small valid synthetic trace folder (gsm8k, 6 problems)."""
    from prada_jax.traces import format as tf
    from prada_jax.traces import synthetic

    traces, meta = synthetic.generate("gsm8k", seed=0, problems=6)
    tf.save(traces, path, meta)


def _nested_json(depth: int = 200_000) -> str:
    """JSON that is valid but nested deeper than Python's recursion limit."""
    return "[" * depth + "]" * depth


def _traces_with_meta(text: str) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        _valid_traces(path)
        (path / "meta.json").write_text(text)
    return build


def _corrupt_nodes(path: Path) -> None:
    _valid_traces(path)
    (path / "nodes.safetensors").write_bytes(b"garbage")


def _run_dir(files: dict[str, str], dirs: tuple[str, ...] = ()) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        path.mkdir(parents=True)
        for name, text in files.items():
            (path / name).write_text(text)
        for d in dirs:
            (path / d).mkdir()
    return build


def _smoke_policy(path: Path) -> None:
    """A real train.ppo smoke run (a few seconds of training; slow cases only)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, "-m", "train.ppo",
                    f"--config={REPO}/prada_jax/configs/ppo.py:smoke", f"--workdir={path}"],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=900)


def _smoke_policy_garbage_metadata(path: Path) -> None:
    """A train.ppo smoke run whose newest checkpoint step has a garbage
    ``_CHECKPOINT_METADATA`` (orbax logs an ``E...`` line when it lists the steps)."""
    _smoke_policy(path)
    newest = max(int(p.name) for p in (path / "checkpoints").iterdir() if p.name.isdigit())
    (path / "checkpoints" / str(newest) / "_CHECKPOINT_METADATA").write_text("garbage{")


def _dual_for(num_servers: int) -> Callable[[Path], None]:
    """A train.dual-like folder whose multipliers.json records a scenario with M servers
    (the rest as the ppo.py:smoke env) and a policy run that is not the one evaluated."""
    scenario = {"num_users": 16, "num_servers": num_servers, "bandwidth_hz": 20e6,
                "arrival_rate_hz": 4.0, "beta": 0.2, "tau_s": 0.05,
                "traces": {"benchmark": "gsm8k"},
                "policy": {"kind": "ppo", "workdir": "/elsewhere/ppo"}}
    return _run_dir({"multipliers.json": json.dumps(
        {"lambda_s": 0.1, "mu": 0.0, "scenario": scenario})})


def _config_of(cfg: str, variant: str):
    """``get_config(variant)`` of a config file given as in CASES (``{repo}/...py``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_cfg", cfg.format(repo=REPO))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(variant)


def _damaged_run(cfg: str, variant: str, damage: str) -> Callable[[Path], None]:
    """A run folder of ``cfg:variant`` (its config.json, run.json) whose checkpoints/ holds two
    steps, both damaged: ``damage="truncate"`` cuts every array file short,
    ``"metadata"`` writes garbage into each step's ``_CHECKPOINT_METADATA``. A resume with the
    same config must be refused before anything in the folder is touched."""
    def build(path: Path) -> None:
        import jax.numpy as jnp

        from prada_jax import checkpointing, config_utils

        path.mkdir(parents=True)
        config_utils.write_config_json(_config_of(cfg, variant), path)
        (path / "run.json").write_text(json.dumps({"provenance": [
            {"time": "2026-01-01T00:00:00+00:00", "event": "start", "changed": {}}]}))
        ck = checkpointing.Checkpointer(path / "checkpoints", max_to_keep=10)
        for step in (1, 2):
            ck.save(step, {"w": jnp.arange(4.0) * step}, meta={"step": step}, force=True)
        ck.close()
        for step in (1, 2):
            root = path / "checkpoints" / str(step)
            if damage == "metadata":
                (root / "_CHECKPOINT_METADATA").write_text("garbage{")
            else:
                for f in (root / "state").rglob("*"):
                    if f.is_file() and f.parent.name == "d":
                        f.write_bytes(f.read_bytes()[:3])
    return build


def _pair_file(**server) -> Callable[[Path], None]:
    """A folder holding ``pair.json``, a hardware pair (``prada_jax.latency.pair_profiles``):
    the A100 server profile with ``server`` fields replaced, the Orin INT4 edge."""
    def build(path: Path) -> None:
        from prada_jax import latency

        hw = {f: float(getattr(latency.a100_80gb_bf16(), f))
              for f in latency.HardwareProfile.__dataclass_fields__}
        path.mkdir(parents=True)
        (path / "pair.json").write_text(json.dumps({"edge": "orin_agx_64gb_int4",
                                                    "server": dict(hw, **server)}))
    return build


def _pair_file_text(text: str, size: int | None = None) -> Callable[[Path], None]:
    """A folder holding ``pair.json`` with ``text``, extended (sparse) to ``size`` bytes."""
    def build(path: Path) -> None:
        path.mkdir(parents=True)
        with open(path / "pair.json", "w") as f:
            f.write(text)
            if size is not None:
                f.truncate(size)
    return build


_MIN_PPO_CONFIG = json.dumps({"env": {"preset": "gsm8k", "num_users": 16}})


def _pooled_meta(split: str, trace_seed: int, hardware: str | None = None) -> str:
    return json.dumps({"obs_dim": 18, "traces": {
        "source": "synthetic:gsm8k", "split": split, "trace_seed": trace_seed,
        "problems_total": 1319, "feature_dim": 16},
        **({"hardware": hardware} if hardware else {})})

def _kg_fake_cache(path: Path) -> None:
    """A folder with the files ``studies.reopd_kg`` fingerprints (contents arbitrary)."""
    from studies.reopd_kg.resume import CACHE_FILES
    for rel in CACHE_FILES:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(f"fake {rel}")


def _kg_study_with(field: str) -> Callable[[Path], None]:
    """A ``studies.reopd_kg`` study folder whose fingerprint.json was made against the fake
    cache (:func:`_kg_fake_cache`) and the registered config, but with ``field`` changed."""
    def build(path: Path) -> None:
        from studies import reopd_kg as S
        from studies.reopd_kg import resume
        cache = path.parent / "kg_cache_for_study"
        _kg_fake_cache(cache)
        fp = resume.study_fingerprint(cache, S.FULL)
        sec, key = field.split(".", 1)
        fp[sec][key] = "another" if sec == "cache" else [0.5, 1.0]
        path.mkdir(parents=True)
        (path / "fingerprint.json").write_text(json.dumps(fp))
        (path / "study.json").write_text(json.dumps({"cold": {}}))   # pilot's prerequisite
    return build


INPUTS: dict[str, Callable[[Path], None]] = {
    # study folders (issue 43): malformed files, the other ReOPD study's folder
    "study_json_5": _run_dir({"study.json": "5"}),
    "study_json_nested_list": _run_dir({"study.json": "[[1]]"}),
    "kg_fingerprint_list": _run_dir({"fingerprint.json": "[1, 2]"}),
    "kg_fingerprint_types": _run_dir({"fingerprint.json": '{"cache": [1], "config": 5}'}),
    "kg_study": _run_dir({"study.json": json.dumps({"task": "kg_lookup_v1", "cold": {}}),
                               "fingerprint.json": "{}"}),
    "vs_opd_study": _run_dir({"study.json": json.dumps(
        {"task": "arith", "cold_starts": [], "studies": []})}),
    "kg_fake_cache": _kg_fake_cache,
    "kg_study_other_pool": _kg_study_with("cache.pool/pool.json"),
    "kg_study_other_kappas": _kg_study_with("config.kappas"),
    "traces_ok": _valid_traces,
    "traces_corrupt": _corrupt_nodes,
    "traces_badjson": _traces_with_meta("{not json"),
    "traces_nested": _traces_with_meta(_nested_json()),
    "traces_toplist": _traces_with_meta("[1, 2]"),
    "empty_dir": _run_dir({}),
    "policy_nockpt": _run_dir({"config.json": _MIN_PPO_CONFIG,
                               "policy_meta.json": json.dumps({"obs_dim": 18})}),
    "policy_nested": _run_dir({"config.json": _nested_json()}, ("checkpoints",)),
    "dual_nested": _run_dir({"multipliers.json": _nested_json()}),
    "dual_badjson": _run_dir({"multipliers.json": '{"lambda_s": 0.1, "mu": '}),
    "policy_smoke": _smoke_policy,
    # policy folders (metadata only) for studies.stage2_pooled's trace-set check, which reads
    # policy_meta.json before any checkpoint
    "pol_train": _run_dir({"config.json": _MIN_PPO_CONFIG,
                           "policy_meta.json": _pooled_meta("train", 0)}),
    "pol_valsplit": _run_dir({"config.json": _MIN_PPO_CONFIG,
                              "policy_meta.json": _pooled_meta("validation", 0)}),
    "pol_traceseed5": _run_dir({"config.json": _MIN_PPO_CONFIG,
                                "policy_meta.json": _pooled_meta("train", 5)}),
    # the clock's pair (issue 33 item 5): absent = paper
    "pol_a100": _run_dir({"config.json": _MIN_PPO_CONFIG,
                          "policy_meta.json": _pooled_meta("train", 0, "a100_orin_int4")}),
    "pol_paper": _run_dir({"config.json": _MIN_PPO_CONFIG,
                           "policy_meta.json": _pooled_meta("train", 0, "paper")}),
    "dual_m2": _dual_for(2),
    "policy_garbage_meta": _smoke_policy_garbage_metadata,
    "ppo_damaged": _damaged_run(PPO_CFG, "smoke", "truncate"),
    "ppo_garbage_meta": _damaged_run(PPO_CFG, "smoke", "metadata"),
    "dual_damaged": _damaged_run(DUAL_CFG, "smoke", "metadata"),
    "distill_damaged": _damaged_run(DISTILL_CFG, "smoke", "truncate"),
    "hw_zero_flops": _pair_file(peak_flops=0.0),
    "hw_zero_bw": _pair_file(mem_bw=-1.0),
    "hw_zero_mem": _pair_file(mem_bytes=0.0),
    # figures float32 cannot hold (issue 43): they became inf (or 0) with a NumPy warning
    "hw_1e300_flops": _pair_file(peak_flops=1e300),
    "hw_1e39_bw": _pair_file(mem_bw=1e39),
    "hw_1e39_mem": _pair_file(mem_bytes=1e39),
    "hw_1e-45_flops": _pair_file(peak_flops=1e-45),
    "hw_small_kv": _pair_file(mem_bytes=14.3e9),   # the 7B weights and three sequences
    "hw_tiny_flops": _pair_file(peak_flops=1e-30),   # a normal float32; FLOPs/rate is not
    "hw_bigint": _pair_file_text('{"edge": "orin_agx_64gb_int4", "server": {"peak_flops": '
                                 + "9" * 400 + ', "mem_bw": 1, "mem_bytes": 1, "eta": 1, '
                                 '"eta_mem": 1, "weight_bytes": 1, "kv_bytes": 1}}'),
    "hw_2gb": _pair_file_text('{"edge": "orin_agx_64gb_int4", "server": "a100_80gb_bf16"} ',
                              size=2 << 30),
}


# ----------------------------------------------------------------------------- cases

@dataclasses.dataclass(frozen=True)
class Case:
    """One command line and what it must do. ``names``: regex the single stderr line must
    contain (the flag, field or file at fault)."""
    command: str
    args: tuple[str, ...]
    names: str
    code: int = 2
    slow: bool = False

    @property
    def id(self) -> str:
        return f"{self.command} {' '.join(self.args)}"[:90]


CASES: list[Case] = [
    # train.ppo: flags, config fields, variants, values, trace folders
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}", "--config.ppo.lrr=1e-3"),
         r"--config\.ppo\.lrr\b.*lr"),
    Case("train.ppo", (f"--config={PPO_CFG}:smok", "--workdir={out}"), r"smok"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}", "--config.ppo.lr=abc"),
         r"--config\.ppo\.lr=abc"),
    Case("train.ppo", ("--bogus",), r"bogus"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.server_model=bogus"), r"config\.env\.server_model"),
    Case("train.ppo", ("--config={repo}/prada_jax/configs/nope.py", "--workdir={out}"),
         r"--config=.*nope\.py"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke",), r"--workdir"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}", "stray"), r"stray"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.bandwidth_hz=-1"), r"config\.env\.bandwidth_hz"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.num_servers=0"), r"config\.env\.num_servers"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.trace_dir={traces_nested}"), r"traces_nested/meta\.json"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.trace_dir={traces_corrupt}"),
         r"traces_corrupt/nodes\.safetensors"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.trace_dir={out}"), r"config\.env\.trace_dir"),
    # a resume with no intact checkpoint: refused before config.json, policy_meta.json or
    # run.json is touched, in one line (no orbax E... line for a garbage _CHECKPOINT_METADATA)
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={ppo_damaged}"),
         r"no intact checkpoint .*ppo_damaged/checkpoints \(damaged: steps 1, 2\).*step 2"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={ppo_garbage_meta}"),
         r"no intact checkpoint .*step 2 is damaged: .*2/_CHECKPOINT_METADATA"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={dual_damaged}"),
         r"no intact checkpoint .*dual_damaged/checkpoints.*_CHECKPOINT_METADATA"),
    Case("train.distill", (f"--config={DISTILL_CFG}:smoke", "--workdir={distill_damaged}"),
         r"no intact checkpoint .*distill_damaged/checkpoints"),
    # a float config value float32 cannot hold: refused before the run (not exit 3 later)
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--config.dual.step_size=1e300"),
         r"--config\.dual\.step_size=1e\+300: does not fit float32"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}", "--config.ppo.lr=1e-60"),
         r"--config\.ppo\.lr=1e-60: rounds to 0 in float32", slow=True),
    # hardware pairs of the clock (docs/latency.md): unknown name, a profile out of range, an
    # M beyond what the server's KV memory holds
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.hardware=tpu9"), r"config\.env\.hardware=tpu9.*unknown"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.hardware={hw_zero_flops}/pair.json"),
         r"config\.env\.hardware=.*pair\.json: server\.peak_flops must be"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.hardware=a100_orin_int4", "--config.env.contention=True",
                       "--config.env.num_servers=100000"),
         r"num_servers \(M\) = 100000 .*KV memory"),
    Case("evals.run", ("--hardware=tpu9", "--out={out}"), r"--hardware=tpu9.*unknown"),
    Case("evals.run", ("--hardware={hw_zero_bw}/pair.json", "--out={out}"),
         r"--hardware=.*server\.mem_bw must be"),
    Case("evals.run", ("--hardware={hw_zero_mem}/pair.json", "--out={out}"),
         r"--hardware=.*server\.mem_bytes must be"),
    Case("evals.run", ("--hardware=a100_orin_int4", "--num_servers=100000", "--out={out}",
                       "--slots=20", "--warmup_slots=2", "--seeds=1"),
         r"num_servers \(M\) = 100000 .*KV memory"),
    Case("studies.stage2_verdict", ("--hardware=tpu9", "--out={out}"), r"--hardware=tpu9.*unknown"),
    Case("evals.run", ("--hardware={hw_1e300_flops}/pair.json", "--out={out}"),
         r"--hardware=.*server\.peak_flops = 1e\+300: does not fit float32"),
    Case("evals.curve", ("--pairs={hw_1e39_bw}/pair.json", "--out={out}"),
         r"--pairs=.*server\.mem_bw = 1e\+39: does not fit float32"),
    Case("evals.sweep", ("--hardware={hw_1e39_mem}/pair.json", "--out={out}"),
         r"--hardware=.*server\.mem_bytes = 1e\+39: does not fit float32"),
    Case("evals.run", ("--hardware={hw_1e-45_flops}/pair.json", "--out={out}"),
         r"--hardware=.*server\.peak_flops = 1e-45: is below float32's normal range"),
    Case("evals.run", ("--hardware={hw_tiny_flops}/pair.json", "--out={out}"),
         r"--hardware=.*server\.\(llm FLOPs per token\)/\(peak_flops·eta\) overflows float32"),
    Case("evals.run", ("--hardware={hw_bigint}/pair.json", "--out={out}"),
         r"--hardware=.*server\.peak_flops does not fit float32"),
    Case("evals.run", ("--hardware={hw_2gb}/pair.json", "--out={out}"),
         r"--hardware=.*pair\.json: 2147483648 bytes; a hardware file is at most"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.env.hardware={hw_1e300_flops}/pair.json"),
         r"config\.env\.hardware=.*server\.peak_flops = 1e\+300"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--config.env.hardware={hw_1e39_bw}/pair.json"),
         r"config\.env\.hardware=.*server\.mem_bw = 1e\+39"),
    Case("train.main", ("--workdir={out}", "--smoke", "--hardware={hw_1e39_mem}/pair.json"),
         r"--hardware=.*server\.mem_bytes = 1e\+39"),
    # the smoke run's M = 4 beyond the 3 sequences the server holds: refused before
    # main_settings.json and the trace summary are written (issue 43)
    Case("train.main", ("--workdir={out}", "--smoke", "--hardware={hw_small_kv}/pair.json"),
         r"--hardware=.*pair\.json: num_servers \(M\) = 4 .*KV memory"),
    Case("train.main", ("--workdir={out}", "--hardware=tpu9"), r"--hardware=tpu9.*unknown"),
    # inf or NaN in any float field of any config: refused before the run (it trained for
    # 100 s, wrote files, then exited 3); every field the issue found, and ppo/distill ones
    *[Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                          f"--config.{field}={bad}"),
           rf"--config\.{re.escape(field)}={bad}: must be finite")
      for field, bad in (("dual.step_size", "inf"), ("dual.learning_rate", "inf"),
                         ("dual.init_lambda_s", "inf"), ("dual.temperature", "inf"),
                         ("dual.kp", "inf"), ("dual.decay_steps", "inf"),
                         ("dual.bw_scale_hz", "inf"), ("policy.rule_threshold", "inf"),
                         ("env.bandwidth_hz", "-inf"))],
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--config.dual.step_size=nan"), r"--config\.dual\.step_size=nan: NaN"),
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}", "--config.ppo.lr=inf"),
         r"--config\.ppo\.lr=inf: must be finite"),
    Case("train.distill", (f"--config={DISTILL_CFG}:smoke", "--workdir={out}",
                           "--config.loss.temperature=inf"),
         r"--config\.loss\.temperature=inf: must be finite"),
    # seeds outside the PRNG's range (jax.random.key keeps 32 bits: 2**32 is seed 0 again)
    Case("train.ppo", (f"--config={PPO_CFG}:smoke", "--workdir={out}",
                       "--config.seed=4294967296"), r"--config\.seed=4294967296: must lie in"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--config.env.trace_seed=-1"), r"--config\.env\.trace_seed=-1: must lie"),
    # train.dual
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}", "--config.dual.lrr=1"),
         r"--config\.dual\.lrr"),
    Case("train.dual", (f"--config={DUAL_CFG}:smok", "--workdir={out}"), r"smok"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--config.env.num_servers=0"), r"config\.env\.num_servers"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--config.env.trace_dir={traces_badjson}"),
         r"traces_badjson/meta\.json"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--policy={policy_nockpt}"), r"--policy=.*policy_nockpt"),
    Case("train.dual", (f"--config={DUAL_CFG}:smoke", "--workdir={out}",
                        "--policy={policy_nested}"), r"policy_nested/config\.json"),
    # train.main
    Case("train.main", ("--workdir={out}", "--seeds=1"), r"--seeds"),
    Case("train.main", ("--workdir={out}", "--full", "--smoke"), r"--full"),
    Case("train.main", ("--workdir={out}", "--smoke", "--config={repo}/prada_jax/configs/main.py"),
         r"--smoke and --config exclude"),
    Case("train.main", ("--workdir={out}", "--config={repo}/prada_jax/configs/main.py:smoke",
                        "--config.eval.sedes=3"), r"--config\.eval\.sedes"),
    # evals.run
    Case("evals.run", ("--traces={traces_nested}", "--out={out}"), r"traces_nested/meta\.json"),
    Case("evals.run", ("--traces=nope", "--out={out}"), r"--traces=nope"),
    Case("evals.run", ("--traces={traces_toplist}", "--out={out}"),
         r"traces_toplist/meta\.json"),
    Case("evals.run", ("--policy={policy_nockpt}", "--out={out}"),
         r"--policy=.*policy_nockpt.*checkpoints"),
    Case("evals.run", ("--checkpoints={policy_nockpt}", "--out={out}"),
         r"--checkpoints=.*policy_nockpt"),
    Case("evals.run", ("--policy={policy_nested}", "--out={out}"),
         r"policy_nested/config\.json"),
    Case("evals.run", ("--dual={dual_nested}", "--out={out}"), r"--dual"),
    Case("evals.run", ("--policy={policy_garbage_meta}", "--out={out}", "--slots=20",
                       "--warmup_slots=2", "--seeds=1"),
         r"step \d+ is damaged: .*policy_garbage_meta/checkpoints/\d+/_CHECKPOINT_METADATA",
         slow=True),
    Case("evals.run", ("--slots=10", "--warmup_slots=10", "--out={out}"), r"--warmup_slots"),
    Case("evals.run", ("--num_servers=0", "--out={out}"), r"--num_servers"),
    Case("evals.run", ("--bandwidth_hz=-1", "--out={out}"), r"--bandwidth_hz"),
    Case("evals.run", ("--seeds=0", "--out={out}"), r"--seeds"),
    Case("evals.run", ("--seed0=9223372036854775807", "--out={out}"),
         r"--seed0=9223372036854775807: must lie in \[0, "),
    Case("evals.run", ("--seeds=100000000", "--out={out}"), r"--seeds=100000000: must lie in"),
    Case("evals.run", ("--beta=inf", "--out={out}"), r"--beta=inf: must be finite"),
    Case("evals.sweep", ("--seeds=99999999999", "--out={out}"), r"--seeds=99999999999"),
    Case("evals.calibration", ("--prm_miscalibration=nan", "--out={out}"),
         r"--prm_miscalibration=nan: NaN"),
    Case("evals.open_loop_bound", ("--lambda_s=1e39",), r"--lambda_s=1e\+39: does not fit float32"),
    Case("evals.open_loop_bound", ("--seed=-5",), r"--seed=-5: must lie"),
    Case("studies.distill_claims", ("--margin=inf", "--out={out}"), r"--margin=inf"),
    Case("evals.run", ("--policy={policy_smoke}", "--dual={dual_m2}", "--out={out}",
                       "--num_servers=4", "--slots=20", "--warmup_slots=2", "--seeds=2"),
         r"--dual=.*dual_m2.*M=2.*M=4.*--allow_scenario_mismatch", slow=True),
    # distillation commands (their specialised cases: tests/prada_jax/distill/test_cli.py,
    # test_export.py, tests/train/test_distill.py)
    Case("train.distill", (f"--config={DISTILL_CFG}:smoke", "--workdir={out}",
                           "--config.sampler.kappa=2"), r"config\.sampler\.kappa"),
    Case("train.distill", (f"--config={DISTILL_CFG}:smoke", "--workdir={out}", "--kappa=x"),
         r"--kappa"),
    Case("prada_jax.distill.export", ("--teacher={out}", "--pool={empty_dir}",
                                      "--out={out}"), r"--teacher.*out/run"),
    Case("prada_jax.distill.pool", ("validate", "--pool={out}"), r"out/run"),
    Case("prada_jax.distill.ratio", ("--pool={out}", "--logits={empty_dir}",
                                     "--student={empty_dir}"), r"out/run"),
    Case("prada_jax.distill.task.teacher", ("--cache={out}", "--steps=0"), r"--steps"),
    Case("prada_jax.distill.task.kg_teacher", ("--cache={out}", "--temperature=-1"),
         r"--temperature"),
    Case("prada_jax.distill.task.evaluate", ("--student={out}",), r"--student.*out/run"),
    Case("studies.distill_claims", ("--methods=nope", "--out={out}"), r"--methods.*nope"),
    Case("studies.distill_claims", ("--seeds=a", "--out={out}"), r"--seeds=a"),
    Case("studies.distill_claims", ("--merge_from={dual_badjson}", "--out={out}"),
         r"dual_badjson/runs\.json"),
    # evals.sweep
    Case("evals.sweep", ("--m_grid=0,2", "--out={out}"), r"--m_grid"),
    # issue 43: an M beyond the server's KV memory (a100_orin_int4 holds ~1300 sequences)
    Case("evals.sweep", ("--m_grid=4,100000", "--axes=M", "--hardware=a100_orin_int4",
                         "--out={out}"), r"--m_grid.*KV memory"),
    Case("evals.sweep", ("--traces={traces_corrupt}", "--out={out}"),
         r"traces_corrupt/nodes\.safetensors"),
    Case("evals.sweep", ("--axes=Q", "--out={out}"), r"--axes"),
    Case("evals.sweep", ("--policy={policy_smoke}", "--dual={dual_m2}", "--out={out}",
                         "--num_servers=4", "--axes=M", "--m_grid=1", "--slots=20",
                         "--warmup_slots=2", "--seeds=1"),
         r"--dual=.*dual_m2.*M=2.*M=4.*--allow_scenario_mismatch", slow=True),
    # studies.stage2_verdict (a given --policy is checked before --out is created)
    Case("studies.stage2_verdict", ("--scenarios=nominal,nope", "--out={out}"), r"--scenarios.*nope"),
    Case("studies.stage2_verdict", ("--policy={policy_nockpt}", "--out={out}", "--quick"),
         r"--policy=.*policy_nockpt.*checkpoints"),
    Case("studies.stage2_verdict", ("--seeds=1", "--out={out}"), r"--seeds"),
    Case("evals.open_loop_bound", ("--slots=0",), r"--slots"),
    # train.critic_refit (the policy is loaded before --out is created)
    Case("train.critic_refit", ("--policy={policy_nockpt}", "--out={out}"),
         r"--policy=.*policy_nockpt.*checkpoints"),
    Case("evals.open_loop_bound", ("--scenario=nope",), r"nope"),
    Case("studies.stage2_verdict", ("--policy={out}", "--out={out}"), r"--policy="),
    Case("studies.stage2_verdict", ("--out={out}", "stray"), r"stray"),
    Case("studies.stage2_verdict", ("--quick", "--out={traces_ok}/meta.json/sub"),
         r"--out=.*meta\.json is not a folder"),
    Case("studies.stage2_verdict", ("--quick", "--num_users=2147483648", "--out={out}"),
         r"--num_users must lie in \[1, 1048576\]"),
    # evals.calibration
    Case("evals.calibration", ("--traces=nope", "--out={out}"), r"--traces=nope"),
    Case("evals.calibration", ("--bins=0", "--out={out}"), r"--bins"),
    Case("evals.calibration", ("--traces={traces_badjson}", "--out={out}"),
         r"traces_badjson/meta\.json"),
    # prada_jax.traces
    Case("prada_jax.traces", ("validate", "{traces_nested}"), r"traces_nested/meta\.json"),
    Case("prada_jax.traces", ("validate", "{traces_corrupt}"),
         r"traces_corrupt/nodes\.safetensors"),
    Case("prada_jax.traces", ("synth", "--preset=nope", "--out={out}"), r"--preset"),
    Case("prada_jax.traces", ("synth", "--preset=gsm8k", "--problems=0", "--out={out}"),
         r"--problems"),
    Case("prada_jax.traces", ("synth", "--preset=gsm8k", "--prm_miss=2", "--out={out}"),
         r"prm_miss"),
    Case("prada_jax.traces", ("stats", "{traces_toplist}", "--json={out}"),
         r"traces_toplist/meta\.json"),
    Case("prada_jax.traces", ("frobnicate",), r"frobnicate"),
    # benchmarks (argument parsing and input folders)
    Case("benchmarks", ("--only=nope", "--out={out}"), r"--only"),
    # an output the suite could not write: refused before the benchmarks run (issue 43)
    Case("benchmarks", ("--only=env", "--out={empty_dir}"), r"--out=.*empty_dir: is a folder"),
    Case("benchmarks", ("--only=,", "--out={out}"), r"--only=,: no part named"),
    Case("benchmarks", ("--only=env", "--md={empty_dir}"), r"--md=.*empty_dir: is a folder"),
    Case("benchmarks", ("--only=env", "--out={traces_toplist}/meta.json/r.json"),
         r"--out=.*meta\.json is not a folder"),
    Case("benchmarks.duality_gap", ("--workdir={dual_nested}",), r"dual_nested"),
    Case("benchmarks.duality_gap", ("--workdir={empty_dir}",), r"empty_dir/config\.json"),
    Case("benchmarks.binding", ("--out={out}",), r"--policy"),
    Case("benchmarks.binding", ("--policy={empty_dir}", "--scenarios=rush", "--out={out}"),
         r"--scenarios"),
    Case("benchmarks.binding", ("--policy={empty_dir}", "--split=train", "--out={out}"),
         r"--split"),
    Case("studies.stage2_verdict", ("--out={out}", "--budget=1.5"), r"--budget"),
    Case("studies.stage2_verdict", ("--out={out}", "--quick", "--budget=1e-320"),
         r"--budget=1e-320: rounds to 0 in float32"),
    Case("studies.stage2_verdict", ("--out={out}", "--quick", "--dual_overrides=step_size=1e300"),
         r"--dual_overrides: dual\.step_size=1e\+300: does not fit float32"),
    Case("studies.stage2_verdict", ("--out={out}", "--quick", "--dual_overrides=kp=inf"),
         r"--dual_overrides: dual\.kp=inf: must be finite"),
    Case("studies.stage2_verdict", ("--out={out}", "--quick", "--seed0=2147483647"), r"--seed0=2147483647"),
    Case("prada_jax.traces", ("synth", "--preset=gsm8k", "--seed=-1", "--out={out}"),
         r"--seed=-1: must lie"),
    Case("prada_jax.traces", ("synth", "--preset=gsm8k", "--prm_noise=inf", "--out={out}"),
         r"--prm_noise=inf: must be finite"),
    Case("benchmarks.duality_gap", ("--workdir={empty_dir}", "--seed=99999999999"),
         r"--seed=99999999999: must lie"),
    # studies.stage2_pooled (issue 33): every policy folder is checked before --out is created
    Case("studies.stage2_pooled", ("--policies={pol_train}", "--out={out}"),
         r"--policies.*>= 2"),
    Case("studies.stage2_pooled", ("--policies={pol_train},{pol_valsplit}", "--out={out}"),
         r"--policies.*pol_valsplit.*split 'validation'"),
    Case("studies.stage2_pooled", ("--policies={pol_train},{pol_traceseed5}", "--out={out}"),
         r"--policies.*pol_traceseed5.*trace_seed 5"),
    Case("studies.stage2_pooled", ("--policies={pol_train},{pol_train}", "--out={out}"),
         r"--policies.*twice"),
    Case("studies.stage2_pooled", ("--policies={pol_train},{empty_dir}", "--out={out}"),
         r"--policies.*empty_dir.*policy_meta\.json"),
    Case("studies.stage2_pooled", ("--policies={pol_train},{pol_valsplit}", "--out={out}",
                                 "--budget=0.3", "--budget_margins=0,1.5"),
         r"--budget_margins"),
    # one clock in every step: a policy trained under another pair than the verdict's
    Case("studies.stage2_pooled", ("--policies={pol_a100},{pol_paper}", "--out={out}"),
         r"--hardware=a100_orin_int4: --policies: .*pol_paper.*trained under hardware 'paper'"),
    Case("studies.stage2_pooled", ("--policies={pol_paper},{pol_train}", "--out={out}",
                                 "--hardware=a100_orin_int4"),
         r"--hardware=a100_orin_int4: --policies: .*pol_paper.*'paper'"),
    Case("studies.stage2_pooled", ("--policies={pol_a100},{pol_train}", "--out={out}",
                                 "--hardware=paper"),
         r"--hardware=paper: --policies: .*pol_a100.*'a100_orin_int4'"),
    Case("studies.stage2_pooled", ("--policies={pol_a100},{pol_paper}", "--out={out}",
                                 "--hardware=tpu9"), r"--hardware=tpu9"),
    Case("studies.stage2_verdict", ("--policy={policy_smoke}", "--out={out}", "--quick",
                          "--hardware=paper"),
         r"--hardware=paper: --policy=.*trained under hardware 'a100_orin_int4'"),
    Case("studies.stage2_pooled.headroom", ("--out={out}/h.json",), r"--policy=None"),
    Case("studies.stage2_pooled.headroom", ("--policy={empty_dir}", "--out={empty_dir}"),
         r"--out=.*empty_dir: is a folder"),
    Case("studies.stage2_pooled.headroom", ("--policy={empty_dir}", "--out={traces_ok}/meta.json/h.json"),
         r"--out=.*meta\.json is not a folder"),
    Case("studies.stage2_pooled.headroom", ("--policy={policy_smoke}", "--out={out}/h.json",
                                   "--candidates=nominal;rush"), r"--candidates.*'rush'"),
    Case("studies.stage2_pooled.headroom", ("--policy={policy_smoke}", "--out={out}/h.json",
                                   "--candidates=nominal:num_servers=0"),
         r"--candidates.*num_servers=0.*> 0"),
    Case("train.policy_samples", ("--seeds=0,x", "--out={out}"), r"--seeds"),
    Case("train.policy_samples", ("--seeds=1,1", "--out={out}"), r"--seeds"),
    Case("train.policy_samples", ("--hardware=tpu9", "--out={out}", "--quick"),
         r"tpu9.*unknown"),
    Case("evals.prefix_cache", (), r"--policy"),
    Case("evals.prefix_cache", ("--policy={policy_nockpt}", "--json={out}/r.json"),
         r"--policy=.*policy_nockpt"),
    # evals.screening (issue 51): the oracle and PRADA vs random at equal share
    Case("evals.screening", ("--out={out}",), r"--policy"),
    Case("evals.screening", ("--policy={empty_dir}", "--shares=0.1,1.5", "--out={out}"),
         r"--shares"),
    Case("evals.screening", ("--policy={empty_dir}", "--shares=0.1,x", "--out={out}"),
         r"--shares"),
    Case("evals.screening", ("--policy={empty_dir}", "--slots=10", "--warmup_slots=10",
                             "--out={out}"), r"--warmup_slots"),
    Case("evals.screening", ("--policy={empty_dir}", "--out={out}"), r"--policy"),
    # studies.stage2_price_target / the stage-2 studies' --report_only (issue 46)
    Case("studies.stage2_price_target", ("--out={out}",), r"--policy=None"),
    Case("studies.stage2_price_target", ("--policy={empty_dir}", "--learner_seeds=0,x",
                                         "--out={out}"), r"--learner_seeds"),
    Case("studies.stage2_price_target", ("--report_only", "--out={empty_dir}"),
         r"--out=.*no flatness_seed"),
    Case("studies.stage2_verdict", ("--report_only", "--out={empty_dir}"),
         r"--out=.*stage2_verdict_nominal\.json"),
    Case("studies.stage2_pooled", ("--report_only", "--out={empty_dir}"),
         r"--out=.*pooled records"),
    Case("benchmarks.sched_vs_milp", ("--candidates=0", "--json={out}"), r"--candidates"),
    Case("benchmarks.env_scaling", ("--envs=a,b", "--json={out}"), r"--envs"),
    Case("benchmarks.serving_scale", ("--users=a,b", "--json={out}"), r"--users"),
    Case("benchmarks.serving_capacity", ("--pair=paper", "--json={out}"), r"--pair"),
    Case("benchmarks.load_curve", ("--loads=0", "--json={out}"), r"--loads"),
    Case("evals.curve", ("--loads=0,1", "--out={out}"), r"--loads"),
    Case("evals.curve", ("--pairs=tpu9", "--out={out}"), r"--pairs"),
    # issue 43: values the float32 env cannot hold, counts its int32 arithmetic overflows on
    Case("evals.curve", ("--loads=1,inf", "--out={out}"), r"--loads: inf: must be finite"),
    Case("evals.curve", ("--loads=1e39", "--out={out}"), r"--loads: 1e39: does not fit float32"),
    Case("evals.curve", ("--num_servers=1000000000000", "--pairs=paper", "--out={out}"),
         r"--num_servers=1000000000000: must be at most"),
    Case("evals.run", ("--num_servers=2147483648", "--out={out}"),
         r"--num_servers=2147483648: must be at most"),
    Case("evals.run", ("--num_users=2147483648", "--out={out}"),
         r"--num_users=2147483648: must be at most"),
    # issue 43: a size this machine cannot hold is refused before compiling, with the estimate
    Case("evals.run", ("--num_users=1000000", "--seeds=8", "--out={out}"),
         r"--num_users=1000000: 8 envs .* GB"),
    Case("evals.curve", ("--policy={policy_smoke}", "--num_users=100000", "--out={out}"),
         r"--num_users=100000: \d+ envs .* GB"),
    Case("evals.sweep", ("--m_grid=4,3000000000", "--out={out}"), r"--m_grid: 3000000000"),
    Case("evals.sweep", ("--lam_grid=1,nan", "--out={out}"), r"--lam_grid: nan: NaN"),
    Case("evals.run", ("--slots=3000000000", "--out={out}"), r"--slots=3000000000"),
    # an --out that cannot be a folder: refused before the evaluation (it was a traceback
    # after it)
    Case("evals.run", ("--out={traces_ok}/meta.json",), r"--out=.*meta\.json: exists and is not"),
    Case("evals.run", ("--out={traces_ok}/meta.json/sub",), r"--out=.*meta\.json is not a folder"),
    Case("evals.sweep", ("--out={traces_ok}/meta.json",), r"--out=.*meta\.json: exists and is"),
    Case("evals.calibration", ("--out={traces_ok}/meta.json",), r"--out=.*meta\.json: exists"),
    Case("evals.sweep", ("--axes=", "--out={out}"), r"--axes: empty"),
    Case("evals.curve", ("--drain_slots=3000000000", "--out={out}"), r"--drain_slots=3000000000"),
    Case("evals.sweep", ("--warmup_slots=3000000000", "--out={out}"),
         r"--warmup_slots=3000000000"),
    Case("benchmarks.trace_load", ("--preset=nope", "--dir={out}"), r"--preset"),
    Case("benchmarks.lm_forward", ("--batch=0", "--json={out}"), r"--batch"),
    Case("benchmarks.ppo_learning", ("--workdir={policy_nockpt}",), r"policy_nockpt"),
    Case("benchmarks.ppo_throughput", ("--num_envs=x", "--json={out}"), r"--num_envs"),
    Case("benchmarks.env_throughput", ("--num_users=x", "--json={out}"), r"--num_users"),
    Case("benchmarks.roofline", ("--num_envs=0", "--json={out}"), r"--num_envs"),
    Case("benchmarks.distill_seeds", ("--num_seeds=0", "--json={out}"), r"--num_seeds"),
    Case("benchmarks.distill_bucket", ("--pairs=0", "--json={out}"), r"--pairs"),
    Case("benchmarks.distill_bucket", ("--modes=offline,sideways", "--json={out}"), r"--modes"),
    Case("studies.opd_pilot", ("--latency_s=-1", "--json={out}"), r"--latency_s"),
    Case("studies.real_smollm2", ("--step=chats", "--workdir={empty_dir}"), r"--workdir"),
    Case("prada_jax.lm.convert", ("--gguf={empty_dir}/x.gguf", "--out={out}"), r"--gguf"),
    Case("studies.reopd_vs_opd", ("--latency_s=-1", "--out={out}"), r"--latency_s"),
    Case("studies.reopd_vs_opd", ("--episodes=0", "--out={out}"), r"--episodes"),
    Case("studies.reopd_vs_opd", ("--cache={empty_dir}", "--out={out}"), r"--cache"),
    Case("studies.reopd_vs_opd", ("--pilot_seeds=5-6", "--out={out}"), r"--pilot_seeds"),
    Case("studies.reopd_vs_opd.addendum", ("--parts=nope", "--out={out}"), r"--parts"),
    Case("studies.reopd_vs_opd.addendum", ("--out={out}",), r"--study_json"),
    Case("studies.reopd_prefix_source", ("--teacher_cache={empty_dir}",
                                            "--generator_cache={empty_dir}", "--out={out}"),
         r"--teacher_cache"),
    Case("studies.reopd_prefix_source", ("--updates=0", "--out={out}"), r"--updates"),
    Case("studies.reopd_prefix_source.diag", ("--teacher_pool={out}",), r"--teacher_pool"),
    # studies (issue 35: κ outside (0, 1], a negative latency, seeds overlapping the pilot's)
    Case("studies.reopd_kg", ("--kappas=0.6,1.5", "--cache={empty_dir}", "--out={out}"),
         r"--kappas"),
    Case("studies.reopd_kg", ("--kappas=0", "--quick", "--out={out}"), r"--kappas"),
    Case("studies.reopd_regime", ("--parts=nope", "--out={out}"), r"--parts"),
    Case("studies.reopd_gate", ("--parts=nope", "--out={out}"), r"--parts"),
    Case("studies.reopd_gate", ("--seeds=90-91", "--out={out}"), r"--seeds"),
    Case("studies.reopd_gate.feasibility", ("--bogus",), r"--bogus"),
    Case("studies.reopd_gate.feasibility", ("--out={empty_dir}",), r"--out=.*empty_dir"),
    Case("studies.capacity", ("--pairs=nope", "--out={out}"), r"--pairs"),
    Case("studies.capacity", ("--pairs=paper", "--out={out}"), r"--pairs=paper"),
    Case("studies.capacity", ("--report_only", "--out={empty_dir}"), r"--report_only"),
    Case("studies.capacity", ("--out={traces_ok}/meta.json",), r"--out=.*meta\.json"),
    # studies.frontier (issue 52)
    Case("studies.frontier", ("--pairs=nope", "--out={out}"), r"--pairs"),
    Case("studies.frontier", ("--pairs=paper", "--out={out}"), r"--pairs=paper"),
    Case("studies.frontier", ("--pairs=", "--out={out}"), r"--pairs: empty"),
    Case("studies.frontier", ("--report_only", "--out={empty_dir}"), r"--report_only.*lacks"),
    Case("studies.frontier", ("--out={traces_ok}/meta.json",), r"--out=.*meta\.json"),
    Case("studies.frontier", ("--size=huge", "--out={out}"), r"--size"),
    Case("studies.frontier", ("--policies={traces_ok}/meta.json", "--out={out}"),
         r"--policies=.*meta\.json"),
    Case("studies.reopd_regime", ("--inject_rate=1.5", "--out={out}"), r"--inject_rate"),
    Case("studies.reopd_regime.sleepcheck", ("--latency=-1", "--out={out}"), r"--latency"),
    Case("studies.reopd_regime.sleepcheck", ("--study_out={empty_dir}", "--out={out}"),
         r"--study_out"),
    Case("studies.reopd_kg", ("--latencies_ms=10,-1", "--cache={empty_dir}", "--out={out}"),
         r"--latencies_ms"),
    Case("studies.reopd_kg", ("--seeds=0-19", "--pilot_seeds=19-21", "--cache={empty_dir}",
                              "--out={out}"), r"--seeds.*--pilot_seeds"),
    Case("studies.reopd_kg", ("--parts=compare", "--cache={empty_dir}", "--out={out}"),
         r"--parts"),
    Case("studies.reopd_kg", ("--cache={empty_dir}", "--out={out}"), r"--cache"),
    # a study folder made against another cache or config: refused, nothing written
    Case("studies.reopd_kg", ("--cache={kg_fake_cache}", "--out={kg_study_other_pool}",
                              "--parts=pilot"), r"--cache: pool/pool\.json.*fingerprint\.json"),
    Case("studies.reopd_kg", ("--cache={kg_fake_cache}", "--out={kg_study_other_kappas}",
                              "--parts=pilot"), r"--kappas.*fingerprint\.json"),
    # --out: a file, malformed study files, the other study's folder; seed ranges refused
    # before they are built (issue 43)
    Case("studies.reopd_kg", ("--quick", "--out={traces_ok}/meta.json"),
         r"--out=.*meta\.json: exists and is not a folder"),
    Case("studies.reopd_vs_opd", ("--quick", "--out={traces_ok}/meta.json"),
         r"--out=.*meta\.json: exists and is not a folder"),
    Case("studies.reopd_kg", ("--quick", "--out={study_json_5}"),
         r"--out=.*study\.json: top level must be an object, got int"),
    Case("studies.reopd_kg", ("--quick", "--out={study_json_nested_list}"),
         r"--out=.*study\.json: top level must be an object, got list"),
    Case("studies.reopd_kg", ("--cache={kg_fake_cache}", "--parts=paths",
                              "--out={kg_fingerprint_list}"),
         r"--out: .*fingerprint\.json: top level must be an object"),
    Case("studies.reopd_kg", ("--cache={kg_fake_cache}", "--parts=paths",
                              "--out={kg_fingerprint_types}"),
         r"--out: .*fingerprint\.json field cache is not an object"),
    Case("studies.reopd_vs_opd", ("--quick", "--out={kg_study}"),
         r"--out=.*kg_study/study\.json holds a reopd_kg study, not a reopd_vs_opd one"),
    Case("studies.reopd_kg", ("--quick", "--parts=paths", "--out={vs_opd_study}"),
         r"--out=.*vs_opd_study/study\.json holds a reopd_vs_opd study, not a reopd_kg one"),
    Case("studies.reopd_kg", ("--seeds=0-99999999", "--cache={empty_dir}", "--out={out}"),
         r"--seeds: 0-99999999 is 100000000 seeds; a study runs at most"),
    Case("studies.reopd_vs_opd", ("--pilot_seeds=50-4294967296", "--out={out}"),
         r"--pilot_seeds: 50-4294967296: seeds must lie in"),
]


# ----------------------------------------------------------------------------- harness

def _snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` with its kind, size and modification time."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (p.is_dir(), st.st_size if p.is_file() else 0,
                                             st.st_mtime_ns)
    return out


def _placeholders(args) -> set[str]:
    return {f for a in args for _, f, _, _ in string.Formatter().parse(a) if f}


def run_case(case: Case, tmp: Path, run_command=None) -> None:
    """Runs ``case`` with inputs built under ``tmp/in`` and the command's cwd ``tmp/cwd``;
    asserts the exit code, one named stderr line and an unchanged tree under ``tmp``. With
    ``run_command`` (the conftest fixture) the command runs in this process, else in a
    subprocess (``python -m``)."""
    inputs, cwd = tmp / "in", tmp / "cwd"
    inputs.mkdir()
    cwd.mkdir()
    paths = {"repo": str(REPO), "out": str(tmp / "out" / "run")}
    for name in _placeholders(case.args) - set(paths):
        if name not in INPUTS:
            raise KeyError(f"case {case.id}: no input named {name!r} in INPUTS")
        INPUTS[name](inputs / name)
        paths[name] = str(inputs / name)
    args = [a.format(**paths) for a in case.args]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
               TRANSFORMERS_OFFLINE="1")
    before = _snapshot(tmp)
    if run_command is None:
        proc = subprocess.run([sys.executable, "-m", case.command, *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=600)
    else:
        proc = subprocess.CompletedProcess(args, *run_command(case.command, *args, cwd=cwd))
    after = _snapshot(tmp)
    shown = f"{case.command} {' '.join(args)}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == case.code, shown
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, shown
    assert lines[0].startswith("error: "), shown
    assert re.search(case.names, lines[0]), f"{lines[0]!r} does not name {case.names!r}"
    new = sorted(set(after) - set(before))
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    assert not new and not changed, f"{shown}\nnew: {new}\nchanged: {changed}"


def _first_default_cases() -> set[int]:
    """Indices of each command's first default case: those run as a real subprocess (the
    entry, ``python -m``); every other case runs in-process (the same code path after
    start-up, without a new interpreter and JAX import)."""
    seen, first = set(), set()
    for i, c in enumerate(CASES):
        if not c.slow and c.command not in seen:
            seen.add(c.command)
            first.add(i)
    return first


_SUBPROCESS = _first_default_cases()


@pytest.mark.parametrize(
    "index", [pytest.param(i, id=c.id, marks=[pytest.mark.slow] if c.slow else [])
              for i, c in enumerate(CASES)])
def test_bad_input(index, tmp_path, run_command):
    run_case(CASES[index], tmp_path, None if index in _SUBPROCESS else run_command)


def test_library_modules_hold_no_main():
    """Commands live in thin entries (a package's ``__main__``): importing a library module
    defines no ``main`` and no flags."""
    import importlib

    for mod in ("evals.sweep", "evals.calibration", "studies.distill_claims", "studies.stage2_verdict",
                "evals.grid", "evals.suite", "evals.evaluate"):
        assert not hasattr(importlib.import_module(mod), "main"), mod
    for mod in ("evals.sweep", "evals.calibration", "studies.distill_claims", "studies.stage2_verdict"):
        assert callable(importlib.import_module(f"{mod}.__main__").main), mod


def _commands_in_tree() -> set[str]:
    """Every runnable module of the project (a file with an ``if __name__ == "__main__"``
    block under train/, evals/, benchmarks/, studies/, prada_jax/, envs/) as its ``python -m``
    name."""
    out = set()
    for top in ("train", "evals", "benchmarks", "studies", "prada_jax", "envs"):
        for f in (REPO / top).rglob("*.py"):
            if re.search(r'^if __name__ == "__main__"', f.read_text(), re.M):
                parts = f.relative_to(REPO).with_suffix("").parts
                out.add(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    return out


def test_every_command_has_a_default_case():
    slow = {c.command for c in CASES if c.slow}
    fast = {c.command for c in CASES if not c.slow}
    assert slow <= fast, f"commands with only slow cases: {sorted(slow - fast)}"
    missing = _commands_in_tree() - fast
    assert not missing, f"commands without a default-suite case in CASES: {sorted(missing)}"


# ----------------------------------------------------------------------------- --help

def _config_commands() -> set[str]:
    """Commands with an ml_collections config-file flag (they also get ``--helpconfig``)."""
    out = set()
    for cmd in _commands_in_tree():
        mod = REPO.joinpath(*cmd.split("."))
        src = mod / "__main__.py" if mod.is_dir() else mod.with_suffix(".py")
        if "config_flags.DEFINE_config_file" in src.read_text():
            out.add(cmd)
    return out


def _run_help(command: str, args: list[str], tmp: Path,
              run_command=None) -> subprocess.CompletedProcess:
    """``python -m command args`` with cwd ``tmp/cwd``: in a subprocess, or in this process
    through the conftest's ``run_command`` when given; asserts nothing was written."""
    cwd = tmp / "cwd"
    cwd.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
               TRANSFORMERS_OFFLINE="1")
    before = _snapshot(tmp)
    if run_command is None:
        proc = subprocess.run([sys.executable, "-m", command, *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
    else:
        proc = subprocess.CompletedProcess(args, *run_command(command, *args, cwd=cwd))
    assert _snapshot(tmp) == before, f"{command} {args} wrote into its working directory"
    return proc


# The command whose --help runs as a real subprocess (``python -m``); every other command's
# --help, and every --helpconfig, runs in-process (each command's entry already runs as a
# subprocess in test_bad_input).
_HELP_SUBPROCESS = "train.ppo"


@pytest.fixture
def run_help(run_command):
    """``run_command`` with absl's help flags defined for good: absl defines them once per
    process (in ``app.run``), and ``run_command`` removes the flags a run defined, so a run
    after the first would not know ``--help``."""
    from absl import app, flags

    app.define_help_flags()
    for flag in (app.HelpFlag(), app.HelpshortFlag(), app.HelpfullFlag(), app.HelpXMLFlag(),
                 app.OnlyCheckFlagsFlag()):
        if flag.name not in flags.FLAGS:
            flags.DEFINE_flag(flag)
    return run_command


@pytest.mark.parametrize("command", sorted(_commands_in_tree()))
def test_help_exits_zero(command, tmp_path, run_help):
    """``--help`` prints the command's help on stdout and exits 0 (absl's own --help exits 1,
    which the contract reserves for bugs); commands with a config file also answer
    ``--helpconfig`` (the resolved config) with exit 0."""
    runner = None if command == _HELP_SUBPROCESS else run_help
    proc = _run_help(command, ["--help"], tmp_path, runner)
    shown = f"python -m {command} --help -> {proc.returncode}\nstderr:\n{proc.stderr[-2000:]}"
    assert proc.returncode == 0, shown
    assert "--" in proc.stdout and not proc.stderr.strip(), shown
    for spelling in ("-h", "--helpshort", "--helpfull"):   # every spelling, every command
        proc = _run_help(command, [spelling], tmp_path, run_help)
        assert proc.returncode == 0 and "--" in proc.stdout and not proc.stderr.strip(), \
            (command, spelling, proc.returncode, proc.stderr[-2000:])
    if command in _config_commands():
        proc = _run_help(command, ["--helpconfig"], tmp_path, run_help)
        assert proc.returncode == 0 and proc.stdout.strip() and not proc.stderr.strip(), \
            (proc.returncode, proc.stdout[:300], proc.stderr)


@pytest.mark.parametrize("command,sub", [("prada_jax.traces", "synth"),
                                         ("prada_jax.distill.pool", "validate")])
def test_help_of_a_subcommand_exits_zero(command, sub, tmp_path, run_help):
    """Commands with subcommands answer every help spelling before the subcommand and after
    it (``--helpshort``/``--helpfull`` were taken for unknown subcommands, exit 2)."""
    for args in (["--helpshort"], ["--helpfull"], ["-h"], [sub, "--helpshort"],
                 [sub, "--helpfull"], [sub, "-h"]):
        proc = _run_help(command, args, tmp_path, run_help)
        assert proc.returncode == 0 and proc.stdout.strip() and not proc.stderr.strip(), \
            (command, args, proc.returncode, proc.stderr[-2000:])


def test_helpconfig_prints_the_resolved_config(tmp_path, run_help):
    """``--helpconfig`` with a config and an override prints that config as JSON, equal to the
    config file's own ``get_config`` with the override applied."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ppo_cfg", PPO_CFG.format(repo=REPO))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    want = mod.get_config("smoke").to_dict()
    want["seed"] = 7
    proc = _run_help("train.ppo", [f"--config={PPO_CFG.format(repo=REPO)}:smoke",
                                   "--config.seed=7", "--helpconfig"], tmp_path, run_help)
    assert proc.returncode == 0, proc.stderr
    body = proc.stdout.split("\n", 1)[1]
    assert json.loads(body) == json.loads(json.dumps(want, default=repr))


# ----------------------------------------------------------------------------- units

def test_one_line_messages():
    from absl import flags

    from prada_jax import cli

    nested = ("flag --config=x.py:smok: Error whilst parsing config file:\n\nTraceback (most "
              "recent call last):\n  File \"x.py\", line 3\n    raise ValueError()\n"
              "ValueError: x.py: unknown variant 'smok'\n")
    assert cli.one_line(flags.IllegalFlagValueError(nested)) == \
        "flag --config=x.py:smok: x.py: unknown variant 'smok'"
    assert cli.one_line(KeyError("config.a is missing")) == "config.a is missing"
    assert cli.one_line(ValueError("a\n  b")) == "a b"


def test_read_json_names_the_file_for_any_malformed_content(tmp_path):
    from prada_jax.errors import BadInput
    from prada_jax.jsonio import read_json

    cases = {"nested.json": _nested_json().encode(), "bad.json": b"{not json",
             "latin.json": b'{"a": "\xff"}', "list.json": b"[1, 2]", "empty.json": b""}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(BadInput, match=re.escape(str(tmp_path / name))):
            read_json(tmp_path / name)
    with pytest.raises(BadInput, match="missing.json: missing"):
        read_json(tmp_path / "missing.json")
    with pytest.raises(BadInput, match="not a file"):
        read_json(tmp_path)
    (tmp_path / "ok.json").write_text('{"a": [1, {"b": null}]}')
    assert read_json(tmp_path / "ok.json") == {"a": [1, {"b": None}]}
    assert read_json(tmp_path / "list.json", expect=list) == [1, 2]


def test_scenario_mismatch_names_both_scenarios(tmp_path):
    from evals import suite

    env = {"num_users": 16, "num_servers": 4, "bandwidth_hz": 20e6, "arrival_rate_hz": 4.0,
           "beta": 0.2, "tau_s": 0.05}
    pol = suite.LoadedPolicy(None, None, {}, None, str(tmp_path / "p"))
    same = {"scenario": dict(env, traces={"benchmark": "gsm8k"},
                             policy={"kind": "ppo", "workdir": str(tmp_path / "p")})}
    assert suite.scenario_mismatch(same, env, {"benchmark": "gsm8k"}, pol) is None
    assert suite.scenario_mismatch({}, env, {"benchmark": "gsm8k"}, pol) is None  # old file
    other = {"scenario": dict(same["scenario"], num_servers=2, bandwidth_hz=5e6)}
    msg = suite.scenario_mismatch(other, env, {"benchmark": "gsm8k"}, pol)
    assert "differs in M, B" in msg and "M=2" in msg and "M=4" in msg and "B=5 MHz" in msg
    moved = {"scenario": dict(same["scenario"], policy={"kind": "ppo", "workdir": "/x"})}
    assert "differs in policy" in suite.scenario_mismatch(moved, env, {"benchmark": "gsm8k"},
                                                          pol)
    assert "differs in traces" in suite.scenario_mismatch(
        same, env, {"benchmark": "mmlu_stem"}, pol)
    # the arrival schedule is part of the scenario: name, and length unless nominal
    heavy = {"scenario": dict(same["scenario"], scenario="heavy", scenario_length=600)}
    msg = suite.scenario_mismatch(heavy, env, {"benchmark": "gsm8k"}, pol)
    assert "differs in schedule" in msg and "schedule heavy/600" in msg \
        and "schedule nominal" in msg
    assert suite.scenario_mismatch(heavy, dict(env, scenario="heavy", scenario_length=600),
                                   {"benchmark": "gsm8k"}, pol) is None
    assert "schedule" in suite.scenario_mismatch(
        heavy, dict(env, scenario="heavy", scenario_length=240), {"benchmark": "gsm8k"}, pol)
    nominal = {"scenario": dict(same["scenario"], scenario="nominal", scenario_length=600)}
    assert suite.scenario_mismatch(nominal, env, {"benchmark": "gsm8k"}, pol) is None


def test_check_scenario_refuses_or_warns_in_one_line(tmp_path, capsys):
    from evals import suite

    env = {"num_users": 16, "num_servers": 4, "bandwidth_hz": 20e6, "arrival_rate_hz": 4.0,
           "beta": 0.2, "tau_s": 0.05}
    pol = suite.LoadedPolicy(None, None, {}, None, str(tmp_path / "p"))
    info = {"scenario": dict(env, num_servers=2, traces={"benchmark": "gsm8k"},
                             policy={"kind": "ppo", "workdir": str(tmp_path / "p")})}
    with pytest.raises(suite.EvalError, match=r"^--dual=D: multipliers learned for another "
                       r"scenario \(differs in M\).*M=2.*M=4.*--allow_scenario_mismatch"):
        suite.check_scenario("--dual=D", info, env, {"benchmark": "gsm8k"}, pol)
    with pytest.raises(suite.EvalError) as e:
        suite.check_scenario("dual run D", info, env, {"benchmark": "gsm8k"}, pol,
                             allow_flag=None)
    assert "pass" not in str(e.value)
    assert "M=2" in suite.check_scenario("--dual=D", info, env, {"benchmark": "gsm8k"}, pol,
                                         allow=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: --dual=D: ") and "M=4" in err[0]
    assert suite.check_scenario("--dual=D", {}, env, {"benchmark": "gsm8k"}, pol) is None


def test_quiet_logging_keeps_own_info_and_warnings():
    import logging

    from prada_jax import cli

    flt = cli._OwnInfoOnly()

    def rec(path, level):
        return logging.LogRecord("absl", level, path, 1, "m", None, None)

    orbax = "/site-packages/orbax/checkpoint/checkpoint_manager.py"
    assert not flt.filter(rec(orbax, logging.INFO))
    assert flt.filter(rec(orbax, logging.WARNING))
    assert flt.filter(rec(str(REPO / "prada_jax" / "rl" / "trainer.py"), logging.INFO))
    assert flt.filter(rec(str(REPO / "train" / "ppo.py"), logging.INFO))
