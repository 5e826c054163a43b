"""Exit codes of a real training command (``train.ppo`` on the toy env, run in-process through
its ``__main__``): 3 with one line when training turns non-finite, 130 with a checkpoint at the
boundary on SIGINT, then a rerun resumes from it and finishes."""
import os
import signal
import threading

import pytest

from prada_jax import checkpointing

TOY = "--config=prada_jax/configs/ppo.py:toy"


def _error_lines(err):
    return [ln for ln in err.splitlines() if ln.startswith("error:")]


def test_non_finite_training_exits_3_with_one_line(run_command, tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # 3e38 is finite and fits float32 (inf is refused before training, exit 2); the rewards
    # it gives overflow float32 in the returns, so training turns non-finite
    code, out, err = run_command("train.ppo", TOY, f"--workdir={tmp_path / 'run'}",
                                 "--config.env.toy_threshold=3e38", "--config.num_seeds=2",
                                 cwd=repo)
    lines = _error_lines(err)
    assert code == 3, err[-3000:]
    assert len(lines) == 1 and "non-finite train/" in lines[0] and "(seed " in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").is_dir() or \
        checkpointing.Checkpointer(tmp_path / "run" / "checkpoints").all_steps() == []


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers need the main thread")
def test_sigint_exits_130_saves_and_resumes(run_command, tmp_path, monkeypatch):
    """SIGINT during the first chunk (of 4; checkpoints every 4 updates): exit 130, a
    checkpoint at update 2 (the boundary, not a save_every multiple); the rerun resumes at 2."""
    from prada_jax import runloop
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    real_run = runloop.run
    calls = []

    def run_with_sigint(state, step_fn, **kw):
        def step(s, i):
            calls.append(i)
            if len(calls) == 1:
                os.kill(os.getpid(), signal.SIGINT)
            return step_fn(s, i)
        return real_run(state, step, **kw)

    wd = tmp_path / "run"
    # (the sizes and constant schedule of test_resume_contract.py's runs: the same compiled
    # chunk, loaded from the session's cache by whichever test runs second)
    flags = [TOY, f"--workdir={wd}", "--config.ppo.total_env_steps=256",
             "--config.log.checkpoint_every=4", "--config.ppo.lr_schedule=constant"]
    monkeypatch.setattr(runloop, "run", run_with_sigint)
    code, out, err = run_command("train.ppo", *flags, cwd=repo)
    assert code == 130, err[-3000:]
    assert "stopped by SIGINT, checkpoint saved" in out
    assert checkpointing.Checkpointer(wd / "checkpoints").all_steps() == [2]
    monkeypatch.setattr(runloop, "run", real_run)
    code, out, err = run_command("train.ppo", *flags, cwd=repo)
    assert code == 0, err[-3000:]
    assert "resumed" in err + out and out.strip().splitlines()[-1].startswith("done: update 8")
