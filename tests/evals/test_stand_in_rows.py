"""Rows that rest on a stand-in model are marked (issue 55 item 7): a trace set whose
``meta.json`` says (under ``roles``) that its LLM and PRM are stand-ins, as the SmolLM2 set
does, prints ``†`` on the All-LLM and PRM rows of ``traces stats`` and on the All-LLM,
Draft-then-LLM and RSD rows of ``evals.run``, with a footnote quoting the notes. On a set where
All-LLM solves nothing, ``evals.run``'s headline says the share is undefined instead of
printing ``95% CI [nan, nan]``, and no NaN reaches TensorBoard (tensorboardX's "NaN or Inf"
warning)."""
import json

import numpy as np
import pytest

from prada_jax.traces import format as tf
from prada_jax.traces import synthetic

LLM_NOTE = "stand-in: the same small model (a second sample); no server LLM was run"
PRM_NOTE = "stand-in: the small model read as a step-tag PRM; not trained as a PRM"


def _folder(path, *, solvable=True, roles=True):
    traces, meta = synthetic.generate("gsm8k", seed=0, problems=12)
    if not solvable:   # no candidate's answer is right: every row's accuracy is 0
        traces = traces.replace(correct=np.zeros_like(np.asarray(traces.correct)))
    if roles:
        meta = dict(meta, roles={"llm": {"model": "m", "note": LLM_NOTE},
                                 "prm": {"model": "m-as-prm", "note": PRM_NOTE},
                                 "slm": {"model": "m", "note": "the edge model itself"}})
    tf.save(traces, path, meta)   # the synthetic meta carries its splits
    return path


def test_stand_in_roles_reads_the_notes():
    assert tf.stand_in_roles({"roles": {"llm": {"note": LLM_NOTE}, "slm": {"note": "x"}}}) == \
        {"llm": LLM_NOTE}
    assert tf.stand_in_roles({"roles": {"prm": "Stand-in: a note as a string"}}) == \
        {"prm": "Stand-in: a note as a string"}
    assert tf.stand_in_roles({}) == {} and tf.stand_in_roles(None) == {}
    assert tf.stand_in_roles({"roles": [1, 2]}) == {}


def _row(out: str, label: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.startswith(label)]
    return line


def test_traces_stats_marks_the_stand_in_rows(run_command, tmp_path):
    d = _folder(tmp_path / "set")
    code, out, err = run_command("prada_jax.traces", "stats", str(d), "--preset=gsm8k")
    assert code == 0, err
    for label in ("accuracy all-LLM (%)", "LLM step tokens (mean)", "PRM step-delta AUC",
                  "PRM final AUC", "fallback share all-LLM (%)"):
        line = _row(out, label)
        assert line.count("†") == 1, line        # the folder's column, not the preset's
    for label in ("accuracy all-SLM (%)", "SLM step tokens (mean)", "nodes / problem"):
        assert "†" not in _row(out, label)
    assert f"† gsm8k: the LLM role is a {LLM_NOTE}" in out
    assert f"† gsm8k: the PRM role is a {PRM_NOTE}" in out


def test_traces_stats_without_roles_is_unmarked(run_command, tmp_path):
    d = _folder(tmp_path / "set", roles=False)
    code, out, err = run_command("prada_jax.traces", "stats", str(d))
    assert code == 0, err
    assert "†" not in out


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """evals.run on a stand-in set where nothing is solvable: (code, stdout, stderr, out)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tmp = tmp_path_factory.mktemp("stand_in_eval")
    d = _folder(tmp / "set", solvable=False)
    out = tmp / "eval"
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "evals.run", f"--traces={d}", "--seeds=2",
                           "--slots=120", "--warmup_slots=20", "--drain_slots=60",
                           f"--out={out}"], env=env, capture_output=True, text=True,
                          timeout=600)
    return proc.returncode, proc.stdout, proc.stderr, out


def test_evals_run_marks_the_stand_in_rows(evaluated):
    code, out, err, folder = evaluated
    assert code == 0, err[-3000:]
    for name in ("All-LLM", "Draft then LLM (recompute)", "RSD (online PRM)"):
        assert any(ln.startswith(name) and "†" in ln[:len(name) + 3]
                   for ln in out.splitlines()), name
    for name in ("All-SLM", "Random (matched)"):
        assert not any(ln.startswith(name) and "†" in ln for ln in out.splitlines()), name
    assert "† stand-in: All-LLM, Draft then LLM (recompute), RSD (online PRM)" in out
    assert LLM_NOTE in out and PRM_NOTE in out
    assert "†" in (folder / "table.txt").read_text()


def _per_seed(results: dict) -> dict:
    """The per-seed values of ``results.json`` (withheld ones included), as evaluated."""
    out = {}
    for pol, row in results["policies"].items():
        out[pol] = {m: np.array([np.nan if x is None else x for x in
                                 (e.get("per_seed", e.get("per_seed_censored")))], np.float64)
                    for m, e in row.items()}
    return out


def test_headline_of_a_reference_that_solves_nothing_has_no_nan(evaluated, tmp_path, capfd):
    """The run's rows written again with a PRADA row (the matched random row renamed), so the
    headline is drawn against an All-LLM whose accuracy is 0 on every seed: the share is
    undefined, said in words; no ``nan`` in the text and no NaN written to TensorBoard."""
    from evals import suite
    code, out, err, folder = evaluated
    assert code == 0, err[-3000:]
    assert "nan" not in out.lower(), out
    results = json.loads((folder / "results.json").read_text())
    per_seed = _per_seed(results)
    assert np.all(per_seed["All-LLM"]["accuracy"] == 0)
    per_seed["PRADA (λ=µ=0)"] = per_seed.pop("Random (matched)")
    capfd.readouterr()
    res = suite.write_outputs(per_seed, tmp_path / "again", title="t",
                              meta={"traces": {"synthetic": True}})
    text = res["headline_text"]
    assert "accuracy share undefined (All-LLM's accuracy is 0 on some seed)" in text, text
    assert "nan" not in text.lower(), text
    assert "NaN or Inf" not in capfd.readouterr().err
