"""studies.capacity: the committed results regenerate from the committed per-seed JSON
(``--report_only``, byte for byte), and its command's bad inputs (issue 55 items 1 and 5)
give one stderr line, exit 2 and nothing written."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "capacity" / "results"
PAIRS = ("a100_orin_int4", "a100_phone_int4", "h100_orin_int4")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_report_only_regenerates_the_committed_results(tmp_path):
    """The committed report.md and study.json are what ``--report_only`` writes from the
    committed per-pair files (nothing else is read: no policy, no evaluation)."""
    from evals.capacity import study
    out = tmp_path / "results"
    for pair in PAIRS:
        shutil.copytree(RESULTS / pair, out / pair)
    study.report_only(out, list(PAIRS), "study")
    assert (out / "report.md").read_text() == (RESULTS / "report.md").read_text()
    assert (out / "study.json").read_bytes() == (RESULTS / "study.json").read_bytes()


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "studies.capacity", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _one_line_exit_2(r, *patterns):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1, r.stderr
    for p in patterns:
        assert p in lines[0], lines[0]


def test_report_only_on_a_part_file_without_data_is_bad_input(tmp_path):
    """Issue 55 item 5: before, a KeyError traceback."""
    out = tmp_path / "results"
    shutil.copytree(RESULTS / "a100_orin_int4", out / "a100_orin_int4")
    bad = out / "a100_orin_int4" / "prices.json"
    bad.write_text(json.dumps({"key": {}}))
    before = _files(out)
    r = _cli(f"--out={out}", "--pairs=a100_orin_int4", "--report_only")
    _one_line_exit_2(r, "prices.json", "data")
    assert _files(out) == before                              # nothing written


def test_two_pair_files_sharing_a_folder_exit_2_naming_both(tmp_path):
    """Issue 55 item 1: the whole --pairs list is checked before anything runs."""
    a, b = tmp_path / "a" / "pair.json", tmp_path / "b" / "pair.json"
    for p, server in ((a, "a100_80gb_bf16"), (b, "h100_sxm_bf16")):
        p.parent.mkdir()
        p.write_text(json.dumps({"edge": "orin_agx_64gb_int4", "server": server}))
    out = tmp_path / "out"
    r = _cli(f"--out={out}", f"--pairs={a},{b}", "--size=quick")
    _one_line_exit_2(r, str(a), str(b))
    assert not out.exists()
