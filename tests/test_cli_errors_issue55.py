"""Issue 55 item 5: bad inputs that were a traceback after minutes of work, or silently
accepted, now refused up front under the error contract (one ``error:`` line on stderr naming
the flag or file, exit 2, nothing written), through the same runner as tests/test_cli_errors.py
(``run_case``: the tree under the case's tmp folder is compared before and after).

Cases that depend on this machine's memory (the ``--drain_slots`` histogram, ``--users`` of
``benchmarks.serving_scale``) run in-process with ``evals.suite.physical_memory_bytes``
reporting a 16 GB machine, so they are refused on any machine (without the estimate they would
allocate 68 GB and 34 GB).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import test_cli_errors as tce
from tests.test_cli_errors import Case, run_case

#: The machine the memory cases pretend to run on [bytes].
FAKE_MEMORY = 16e9


def _study_out(cold_text: str | None):
    """A regime-study folder whose ``cold.json`` holds ``cold_text`` (None: no file)."""
    files = {} if cold_text is None else {"cold.json": cold_text}
    return tce._run_dir(files)


_A100 = "a100_80gb_bf16"
INPUTS = {
    "study_cold_not_json": _study_out("{not json"),
    "study_cold_empty": _study_out("{}"),
    "study_cold_list": _study_out("[1, 2]"),
    "study_cold_no_folder": _study_out(json.dumps({"student": "/nonexistent/cold_start"})),
    "study_cold_number": _study_out(json.dumps({"student": 3})),
    # the same top-level key twice: json keeps the last one (here a profile that exists)
    "hw_dup_top": tce._pair_file_text(
        '{"edge": "orin_agx_64gb_int4", "server": "h100_sxm_bf16", "server": "%s"}' % _A100),
    "hw_dup_field": tce._pair_file_text(
        '{"edge": "orin_agx_64gb_int4", "server": {"peak_flops": 1e12, "peak_flops": 3.12e14, '
        '"mem_bw": 2.039e12, "mem_bytes": 8e10, "eta": 0.5, "eta_mem": 0.8, "weight_bytes": 2, '
        '"kv_bytes": 2}}'),
}
for _name, _build in INPUTS.items():
    assert _name not in tce.INPUTS, _name
    tce.INPUTS[_name] = _build

SLEEP = "studies.reopd_regime.sleepcheck"
CASES = [
    # --drain_slots: the [seeds, drain + 1] latency histogram counts in the memory estimate
    Case("evals.run", ("--drain_slots=1073741824", "--seeds=8", "--out={out}"),
         r"--drain_slots=1073741824: 8 envs .* GB"),
    Case("evals.sweep", ("--drain_slots=1073741824", "--seeds=8", "--axes=M",
                         "--out={out}"), r"--drain_slots=1073741824: 8 envs .* GB"),
    # sleepcheck: --out a file, --lr <= 0, a cold.json that is not a JSON object naming a folder
    Case(SLEEP, ("--out={traces_ok}/meta.json",), r"--out=.*meta\.json: exists and is not"),
    Case(SLEEP, ("--lr=0", "--out={out}"), r"--lr: must be a finite number > 0"),
    Case(SLEEP, ("--lr=-0.001", "--out={out}"), r"--lr"),
    Case(SLEEP, ("--lr=nan", "--out={out}"), r"--lr"),
    Case(SLEEP, ("--study_out={study_cold_not_json}", "--out={out}"),
         r"--study_out: .*cold\.json: not valid JSON"),
    Case(SLEEP, ("--study_out={study_cold_empty}", "--out={out}"),
         r"--study_out: .*cold\.json: no 'student'"),
    Case(SLEEP, ("--study_out={study_cold_list}", "--out={out}"),
         r"--study_out: .*cold\.json: top level must be an object"),
    Case(SLEEP, ("--study_out={study_cold_number}", "--out={out}"),
         r"--study_out: .*cold\.json: no 'student'"),
    Case(SLEEP, ("--study_out={study_cold_no_folder}", "--out={out}"),
         r"--study_out: .*cold_start is not a folder"),
    # benchmarks: --json checked before the 50-80 s run; --m empty; --numpy_users not measured
    Case("benchmarks.serving_scale", ("--json={empty_dir}",), r"--json=.*is a folder"),
    Case("benchmarks.serving_scale", ("--json={traces_ok}/meta.json/x.json",),
         r"--json=.*meta\.json is not a folder"),
    Case("benchmarks.serving_scale", ("--numpy_users=-5", "--json={out}"),
         r"--numpy_users: -5 is not one of --users"),
    Case("benchmarks.serving_scale", ("--users=32", "--numpy_users=128", "--json={out}"),
         r"--numpy_users: 128"),
    Case("benchmarks.serving_scale", ("--users=1048576", "--numpy_users=", "--json={out}"),
         r"--users=1048576: 1 envs .* 33\.6 GB"),
    Case("benchmarks.serving_capacity", ("--json={empty_dir}",), r"--json=.*is a folder"),
    Case("benchmarks.serving_capacity", ("--m=", "--json={out}"), r"--m: empty"),
    Case("benchmarks.serving_capacity", ("--m=4,100000000", "--json={out}"),
         r"--m: 100000000 is above the KV bound"),
    # --server_model under the paper clock had no effect and was recorded as applied
    Case("evals.run", ("--hardware=paper", "--server_model=serving", "--out={out}"),
         r"--server_model=serving: has no effect under the paper clock"),
    Case("evals.sweep", ("--hardware=paper", "--server_model=legacy", "--out={out}"),
         r"--server_model=legacy: has no effect"),
    Case("evals.curve", ("--pairs=paper", "--server_model=serving", "--out={out}"),
         r"--server_model=serving: has no effect .*--pairs=paper"),
    # a hardware file naming a key twice (the last one silently won)
    Case("evals.run", ("--hardware={hw_dup_top}/pair.json", "--out={out}"),
         r"--hardware=.*pair\.json.*key 'server' appears twice"),
    Case("evals.run", ("--hardware={hw_dup_field}/pair.json", "--out={out}"),
         r"--hardware=.*pair\.json.*key 'peak_flops' appears twice"),
    Case("train.main", ("--workdir={out}", "--smoke", "--hardware={hw_dup_top}/pair.json"),
         r"--hardware=.*key 'server' appears twice"),
]


@pytest.fixture
def small_machine(monkeypatch):
    """This process reports a 16 GB machine to the memory estimate (``evals.suite``)."""
    from evals import suite
    monkeypatch.setattr(suite, "physical_memory_bytes", lambda: FAKE_MEMORY)


@pytest.mark.parametrize("index", [pytest.param(i, id=c.id) for i, c in enumerate(CASES)])
def test_bad_input_refused_up_front(index, tmp_path, run_command, small_machine):
    run_case(CASES[index], tmp_path, run_command)


def test_the_memory_cases_are_refused_by_the_estimate_not_by_luck():
    """The two memory cases need more than the fake machine by the project's own figures: the
    histogram 8 × (2^30 + 1) bins × 8 bytes = 68.7 GB; U = 2^20 × 32 kB = 33.6 GB."""
    from evals import suite
    assert 8 * (2 ** 30 + 1) * suite.BYTES_PER_HIST_BIN_ENV > 0.8 * FAKE_MEMORY
    assert 2 ** 20 * suite.BYTES_PER_USER_ENV == pytest.approx(33.55e9, rel=1e-3)
    # the default drain (400 slots) adds a few kB a seed: a normal evaluation still fits
    suite.check_fits(8, 2048, drain_slots=400)


def test_benchmark_json_parents_are_created(tmp_path):
    """``--json`` with a missing parent folder passes the up-front check and is written there
    (it was a FileNotFoundError after the run)."""
    from benchmarks.common import save_json
    from prada_jax import config_utils
    path = tmp_path / "a" / "b" / "r.json"
    config_utils.check_output_file(path, "--json")
    save_json(str(path), {"x": 1})
    assert json.loads(Path(path).read_text()) == {"x": 1}


def test_duplicate_keys_refused_only_where_asked(tmp_path):
    from prada_jax.errors import BadInput
    from prada_jax.jsonio import loads_json
    text = '{"a": 1, "b": {"c": 2, "c": 3}}'
    assert loads_json(text, "x") == {"a": 1, "b": {"c": 3}}
    with pytest.raises(BadInput, match=r"^x: key 'c' appears twice"):
        loads_json(text, "x", unique_keys=True)
