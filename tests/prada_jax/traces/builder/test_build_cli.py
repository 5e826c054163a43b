"""End to end on tiny random HF models (built here, offline): build -> validate -> edge env;
kill-and-resume gives the same trace; bad flags fail at once with a clear message."""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from prada_jax.traces import format as fmt  # noqa: E402
from prada_jax.traces.builder import cli as cli_lib  # noqa: E402
from prada_jax.traces.builder import pipeline as pipeline_lib  # noqa: E402
from prada_jax.traces.builder import staging as staging_lib  # noqa: E402
from tests.helpers.hf_traces import make_all  # noqa: E402

SMALL = ["--node-budget", "4", "--full-depth", "1", "--max-steps", "3", "--max-step-tokens",
         "6", "--batch-size", "2", "--feature-dim", "8", "--threads", "1", "--limit", "4"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    return make_all(tmp_path_factory.mktemp("tiny"))


def _args(tiny, out, *extra, prm="prm"):
    parser = argparse.ArgumentParser()
    cli_lib.add_arguments(parser)
    return parser.parse_args(["--slm", str(tiny["slm"]), "--llm", str(tiny["llm"]), "--prm",
                              str(tiny[prm]), "--data", str(tiny["data"]), "--benchmark",
                              "gsm8k", "--out", str(out), "--device", "cpu", *SMALL,
                              *extra])


def _arrays(out):
    return fmt.load(out).to_dict()


def test_build_validate_and_edge_env(tiny, tmp_path):
    out = tmp_path / "traces"
    assert cli_lib.run(_args(tiny, out)) == 0
    meta = fmt.validate(out)
    assert meta["synthetic"] is False
    assert meta["models"] == {"slm": "tiny-slm", "llm": "tiny-llm", "prm": "tiny-prm"}
    assert meta["feature_dim"] == 8 and len(meta["feature_names"]) == 8
    assert meta["counts"]["problems"] == 4
    traces = fmt.load(out)
    # Causal PRM: a node's prefix score is its parent's candidate score on that branch (kept
    # as one number; the builder's own rescoring of the prefix agreed to float32 noise).
    for n in range(traces.num_nodes):
        for c in (0, 1):
            k = traces.child[n, c]
            if k >= 0:
                assert traces.prm[k] == traces.cand_prm[n, c]
    assert meta["generator"]["max_prm_rescore_diff"] < 1e-5
    # step index and context length features; context grows by the kept step's tokens (the
    # SLM re-tokenises the text, so allow a token of merge at the boundary)
    np.testing.assert_array_equal(traces.feat[:, -2], traces.depth)
    np.testing.assert_array_equal(traces.feat[:, -1], traces.ctx_tokens)
    assert np.all(traces.feat[:, -5] <= 0) and np.all(traces.feat[:, -4] <= traces.feat[:, -5])
    for n in range(traces.num_nodes):
        k = traces.child[n, 0]
        if k >= 0:
            assert abs(traces.ctx_tokens[k] - traces.ctx_tokens[n] - traces.cand_tokens[n, 0]) <= 2
    steps = [json.loads(l) for l in (out / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == traces.num_nodes
    problems = [json.loads(l) for l in (out / "problems.jsonl").read_text().splitlines()]
    assert [p["answer"] for p in problems] == ["7", "60", "300", "9"]

    import jax

    from envs import registry

    env, params = registry.make("edge", traces=traces, num_users=2, initial_users=2)
    key = jax.random.key(0)
    obs, state = env.reset(key, params)
    step = jax.jit(env.step)
    total = 0.0
    for t in range(30):
        key, k_act, k_step = jax.random.split(key, 3)
        action = jax.random.bernoulli(k_act, 0.5, (2,)).astype(np.int32)
        obs, state, reward, done, info = step(k_step, state, action, params)
        total += float(reward.sum())
    assert np.isfinite(total) and np.all(np.isfinite(np.asarray(obs)))
    assert int(state.arrived) >= 2


def test_step_tag_prm_build(tiny, tmp_path):
    from prada_jax.traces.__main__ import main

    out = tmp_path / "tag"
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in vars(
        _args(tiny, out, "--limit", "2", "--prm-style", "step-tag", prm="prm_tag")).items()
        if v is not None and not isinstance(v, bool)] + ["--no-progress"]
    assert main(["build", *argv]) == 0  # through `python -m prada_jax.traces build`
    assert fmt.validate(out)["prm_style"] == "step-tag"


def test_hub_name_fails_at_once(tiny, tmp_path, capsys):
    args = _args(tiny, tmp_path / "x")
    args.slm = "Qwen/Qwen2.5-Math-1.5B-Instruct"
    t0 = time.monotonic()
    assert cli_lib.run(args) == cli_lib.EXIT_BAD_INPUT
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    assert "--slm" in err and "not a local folder" in err and "huggingface-cli download" in err


@pytest.mark.parametrize("flag,value,pattern", [
    ("--node-budget", "0", "--node-budget must be >= 1"),
    ("--feature-dim", "5", "--feature-dim must be >= 6"),
    ("--behaviour-eps", "0.7", "--behaviour-eps"),
])
def test_bad_flags_are_named(tiny, tmp_path, capsys, flag, value, pattern):
    assert cli_lib.run(_args(tiny, tmp_path / "x", flag, value)) == cli_lib.EXIT_BAD_INPUT
    assert pattern in capsys.readouterr().err


def test_bad_data_row_is_named(tiny, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    args = _args(tiny, tmp_path / "x")
    args.data = str(bad)
    assert cli_lib.run(args) == cli_lib.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--data" in err and f"{bad}:1: field 'answer'" in err


def test_failed_start_does_not_block_a_fixed_rerun(tiny, tmp_path, capsys):
    broken = tmp_path / "prm_broken"
    import shutil

    shutil.copytree(tiny["prm"], broken)
    (broken / "value_head.safetensors").unlink()
    out = tmp_path / "t"
    args = _args(tiny, out, "--limit", "2", "--no-progress")
    args.prm = str(broken)
    assert cli_lib.run(args) == cli_lib.EXIT_BAD_INPUT
    assert "value_head.safetensors" in capsys.readouterr().err
    shutil.copy(tiny["prm"] / "value_head.safetensors", broken / "value_head.safetensors")
    assert cli_lib.run(args) == 0  # nothing was staged, so the changed folder is not "different"


def test_interrupt_and_resume_is_identical(tiny, tmp_path, monkeypatch):
    ref = tmp_path / "ref"
    assert cli_lib.run(_args(tiny, ref, "--no-progress")) == 0

    out = tmp_path / "resumed"
    real = pipeline_lib.build_trees
    calls = {"n": 0}

    def interrupt_second_batch(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second batch is in flight
        return real(*a, **k)

    monkeypatch.setattr(pipeline_lib, "build_trees", interrupt_second_batch)
    assert cli_lib.run(_args(tiny, out, "--no-progress")) == cli_lib.EXIT_INTERRUPTED
    staged = sorted(p.name for p in (out / staging_lib.STAGING).glob("batch_*"))
    assert staged == ["batch_0000000_0000002.safetensors"]
    assert not (out / fmt.NODES_FILE).exists()
    # a write killed half-way leaves only a temporary file, which a rerun removes
    (out / staging_lib.STAGING / "batch_0000002_0000004.safetensors.tmp999").write_bytes(b"\0partial")
    monkeypatch.setattr(pipeline_lib, "build_trees", real)
    assert cli_lib.run(_args(tiny, out, "--no-progress")) == 0
    assert not list((out / staging_lib.STAGING).glob("*.tmp*"))
    a, b = _arrays(ref), _arrays(out)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert (ref / "steps.jsonl").read_text() == (out / "steps.jsonl").read_text()
    assert fmt.read_meta(ref)["content_hash"] == fmt.read_meta(out)["content_hash"]


def test_max_batches_then_continue_and_changed_settings_refused(tiny, tmp_path, capsys):
    out = tmp_path / "t"
    assert cli_lib.run(_args(tiny, out, "--max-batches", "1", "--no-progress")) == 0
    assert len(list((out / staging_lib.STAGING).glob("batch_*"))) == 1
    assert not (out / fmt.NODES_FILE).exists()
    assert cli_lib.run(_args(tiny, out, "--node-budget", "5", "--no-progress")) == cli_lib.EXIT_BAD_INPUT
    assert "node_budget" in capsys.readouterr().err
    assert cli_lib.run(_args(tiny, out, "--no-progress")) == 0
    fmt.validate(out)


@pytest.mark.slow
def test_sigkill_mid_build_then_resume(tiny, tmp_path):
    """A real kill -9 of a build process, then a rerun: same trace as an uninterrupted build."""
    ref = tmp_path / "ref"
    assert cli_lib.run(_args(tiny, ref, "--no-progress", "--limit", "5", "--batch-size", "1")) == 0
    out = tmp_path / "killed"
    script = (
        "import argparse,sys; from prada_jax.traces.builder import cli as B\n"
        "p=argparse.ArgumentParser(); B.add_arguments(p); sys.exit(B.run(p.parse_args(sys.argv[1:])))\n")
    cli = ["--slm", str(tiny["slm"]), "--llm", str(tiny["llm"]), "--prm", str(tiny["prm"]),
           "--data", str(tiny["data"]), "--benchmark", "gsm8k", "--out", str(out),
           "--device", "cpu", *SMALL, "--no-progress", "--limit", "5", "--batch-size", "1"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-c", script, *cli], env=env,
                            cwd=str(Path(__file__).resolve().parents[4]))
    staging = out / staging_lib.STAGING
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(staging.glob("batch_*.safetensors"))) >= 2:
            break
        time.sleep(0.05)
    proc.kill()
    assert proc.wait() == -9, "the build finished before it could be killed"
    assert not (out / fmt.NODES_FILE).exists()
    assert 2 <= len(list(staging.glob("batch_*.safetensors"))) < 5
    assert cli_lib.run(_args(tiny, out, "--no-progress", "--limit", "5", "--batch-size", "1")) == 0
    a, b = _arrays(ref), _arrays(out)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_role_notes_are_recorded_in_meta(tiny, tmp_path):
    out = tmp_path / "roles"
    notes = {"llm": "stand-in: the SLM itself", "prm": "stand-in: an untrained reader"}
    assert cli_lib.run(_args(tiny, out, "--limit", "2", "--role-notes", json.dumps(notes))) == 0
    meta = fmt.validate(out)
    assert meta["roles"] == {"llm": {"model": "tiny-llm", "note": notes["llm"]},
                             "prm": {"model": "tiny-prm", "note": notes["prm"]}}
    assert "roles" in fmt.unknown_meta_keys(meta)   # provenance: the validator names it


@pytest.mark.parametrize("value", ["{not json", '{"gpu": "x"}', '{"llm": ""}', '["llm"]'],
                         ids=["not-json", "unknown-role", "empty-note", "not-object"])
def test_bad_role_notes_are_named_and_write_nothing(tiny, tmp_path, capsys, value):
    out = tmp_path / "x"
    assert cli_lib.run(_args(tiny, out, "--role-notes", value)) == cli_lib.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --role-notes") and len(err.splitlines()) == 1
    assert not out.exists()
