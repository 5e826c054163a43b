"""Killing a training run mid-way for the resume tests: start the command, SIGKILL it once a
given checkpoint step has committed."""
import signal
import subprocess
import time
from pathlib import Path


def kill_after_checkpoint(cmd: list[str], cwd, env: dict, ckpt_dir: Path, step: int, *,
                          poll_s: float = 0.05, timeout_s: float = 600) -> list[int]:
    """Runs ``cmd`` and SIGKILLs it as soon as ``ckpt_dir/<step>`` exists; asserts the run was
    still going (else it was too short to be killed). Returns the checkpoint steps left."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if (ckpt_dir / str(step)).is_dir():
            break
        time.sleep(poll_s)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed, "the run finished before it could be killed; make it longer"
    return sorted(int(p.name) for p in ckpt_dir.iterdir() if p.name.isdigit())
