"""studies.capacity killed with SIGKILL at a fixed point (issue 55 item 6): the quick study is
killed once its ``prices.json`` is on disk (the test grid under way) and rerun; its part
files equal an uninterrupted run's byte for byte, and ``study.json`` after dropping its wall
time. Both runs use the same ``--out`` path (the uninterrupted one is moved aside), and the
killed run starts from the uninterrupted run's trained policies, so the kill lands in the
measurement."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIR = "a100_orin_int4"
PARTS = ("reference.json", "prices.json", "test.json", "test_pool.json", "bisect.json")


def _cmd(out: Path) -> list[str]:
    return [sys.executable, "-m", "studies.capacity", f"--out={out}", f"--pairs={PAIR}",
            "--size=quick"]


def _study(path: Path) -> dict:
    d = json.loads(path.read_text())
    d["meta"].pop("wall_s")
    return d


def _kill_when(cmd: list[str], path: Path, timeout_s: float = 1800) -> None:
    """Runs ``cmd`` and SIGKILLs it as soon as ``path`` exists; asserts it was still going."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=dict(os.environ))
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None and not path.is_file():
        time.sleep(0.05)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed, "the study finished before it could be killed"


@pytest.mark.slow
def test_a_killed_capacity_study_resumes_to_the_uninterrupted_bytes(tmp_path):
    out = tmp_path / "study"
    r = subprocess.run(_cmd(out), cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    whole = tmp_path / "whole"
    out.rename(whole)
    shutil.copytree(whole / "policies", out / "policies")
    _kill_when(_cmd(out), out / PAIR / "prices.json")
    assert not (out / PAIR / "test.json").exists()            # killed inside the test grid
    assert not (out / "study.json").exists()
    r = subprocess.run(_cmd(out), cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    for part in PARTS:
        assert (out / PAIR / part).read_bytes() == (whole / PAIR / part).read_bytes(), part
    assert _study(out / "study.json") == _study(whole / "study.json")
    assert (out / "report.md").read_bytes() == (whole / "report.md").read_bytes()
    assert not list(out.rglob("*.tmp"))                       # no half-written file left
