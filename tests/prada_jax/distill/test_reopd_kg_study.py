"""``python -m studies.reopd_kg`` (issue 35): its verdict arithmetic against a direct
computation, and (slow) the ``--quick`` study end to end on a tiny kg cache."""
import json

import numpy as np
import pytest

from prada_jax import stats


def test_verdicts_against_direct_counts():
    from studies import reopd_kg as S
    sz = S.Sizes(seeds=(0, 1, 2), n_eval=4, eval_sets=(1, 5), n_boot=500, registered_seeds=3)
    # per seed, per set: 4 problems; reopd solves everything, opd half, sft nothing
    mk = lambda bits: {str(s): {"1": bits, "5": bits} for s in range(3)}   # noqa: E731
    runs = {"opd": {"outcomes": mk("1100"), "tool_calls": 30},
            "reopd_k0.6": {"outcomes": mk("1111"), "tool_calls": 0},
            "reopd_k1": {"outcomes": mk("1110"), "tool_calls": 0},
            "sft_cont": {"outcomes": mk("0000"), "tool_calls": 0}}
    cold = {"outcomes": {"1": "1000", "5": "1000"}}
    v = S.verdicts(runs, cold, sz)
    p = v["pooled"]
    assert p["a_equal_turns"]["mean"] == pytest.approx(0.5)
    assert p["c_vs_sft"]["mean"] == pytest.approx(1.0) and p["c_vs_sft"]["verdict"] == "pass"
    assert p["d_kappa"]["mean"] == pytest.approx(0.25)
    assert p["moved"]["sft_cont"]["mean"] == pytest.approx(-0.25)
    assert p["moved"]["reopd_k0.6"]["success"] == 1.0 and p["cold_success"] == 0.25
    assert v["e_tool_calls"]["verdict"] == "pass" and v["budget_moved"] is True
    # fewer seeds than registered: the same numbers, no verdict
    few = S.verdicts(runs, cold, S.Sizes(seeds=(0, 1, 2), n_eval=4, n_boot=500))["pooled"]
    assert few["c_vs_sft"]["mean"] == pytest.approx(1.0)
    assert few["c_vs_sft"]["verdict"] == "no verdict (3 of 20 registered seeds)"
    runs["reopd_k1"]["tool_calls"] = 1
    assert S.verdicts(runs, cold, sz)["e_tool_calls"]["verdict"] == "fail"


def test_verdicts_carry_variance_components_and_the_report_shows_them():
    """Each pooled difference carries the ANOVA components of its own seed × problem table
    (recomputed here from the outcome strings) and the report prints them."""
    from studies import reopd_kg as S
    from studies.reopd_kg.report import markdown
    rng = np.random.default_rng(0)
    bits = lambda: "".join(rng.choice(["0", "1"], 6))   # noqa: E731
    runs = {k: {"outcomes": {str(s): {"1": bits(), "5": bits()} for s in range(4)},
                "tool_calls": 5 if k == "opd" else 0, "lr": 1e-4,
                "totals": {"supervised_turns": 40}}
            for k in ("opd", "reopd_k0.6", "reopd_k1", "sft_cont")}
    sz = S.Sizes(seeds=tuple(range(4)), n_eval=6, n_boot=200, registered_seeds=4)
    v = S.verdicts(runs, {"outcomes": {"1": "010101", "5": "000111"}}, sz)
    X = {k: S.success_matrix(r, (1, 5)) for k, r in runs.items()}
    a = v["pooled"]["a_equal_turns"]
    assert a["components"] == pytest.approx(
        stats.variance_components(X["reopd_k0.6"] - X["opd"]))
    assert a["plan"]["mde_this_design"] == pytest.approx(
        stats.planned_mde(a["components"], 4, 12, stats.BOOTSTRAP_INTERACTION))
    assert a["plan"]["mde_this_design_model"] == pytest.approx(
        stats.planned_mde(a["components"], 4, 12))
    text = markdown({"compare": {"N": 2, "B": 3, "runs": runs, "verdicts": v}})
    assert "| (a) ReOPD − OPD | " in text and "| (d) κ first − κ last | " in text


@pytest.mark.slow
def test_quick_study_end_to_end(tmp_path):
    """Every part at tiny sizes (a tiny kg cache built under --out): study.json holds each part,
    per-seed per-problem outcomes of every method, verdicts, curves and the clock."""
    from studies.reopd_kg.__main__ import main
    out = tmp_path / "q"
    assert main(["--quick", f"--out={out}"]) == 0
    res = json.loads((out / "study.json").read_text())
    assert res["synthetic"] is True
    for part in ("paths", "cold", "pilot", "compare", "reliability", "clock"):
        assert part in res
    runs = res["compare"]["runs"]
    assert set(runs) == {"opd", "reopd_k0.6", "reopd_k1", "sft_cont"}
    for r in runs.values():
        assert set(r["outcomes"]) == {"0", "1"}
        assert all(len(v) == 4 for o in r["outcomes"].values() for v in o.values())
    assert all(runs[k]["tool_calls"] == 0 for k in ("reopd_k0.6", "reopd_k1", "sft_cont"))
    assert res["clock"]["timed_updates"]["opd"] >= 1
    assert (out / "report.md").read_text().startswith("# ReOPD on the knowledge-graph task")


def test_one_seed_gives_no_verdict():
    from studies import reopd_kg as S
    sz = S.Sizes(seeds=(0,), n_eval=4, eval_sets=(1, 5), n_boot=100)
    mk = lambda bits: {"0": {"1": bits, "5": bits}}   # noqa: E731
    runs = {"opd": {"outcomes": mk("0000"), "tool_calls": 3},
            "reopd_k0.6": {"outcomes": mk("1111"), "tool_calls": 0},
            "reopd_k1": {"outcomes": mk("1110"), "tool_calls": 0},
            "sft_cont": {"outcomes": mk("0000"), "tool_calls": 0}}
    v = S.verdicts(runs, {"outcomes": {"1": "0000", "5": "0000"}}, sz)
    assert v["pooled"]["c_vs_sft"]["verdict"] == "no verdict (1 seed)"
    assert v["pooled"]["c_vs_sft"]["mean"] == 1.0


# ---------------------------------------------------------------------------- resumable runs
def _tree(root):
    """{relative path: (size, mtime_ns)} of every file under ``root``."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def _records(out):
    from studies.reopd_kg import resume
    return {str(p.relative_to(out)): resume.comparable(json.loads(p.read_text()))
            for p in sorted((out / "runs").rglob("*.json"))}


def test_record_fingerprint_and_refusals(tmp_path):
    """A record made under another cache, config or cold start is refused; the study folder's
    fingerprint names the file and field that differ; a torn record reads as absent."""
    from prada_jax.errors import BadInput
    from studies import reopd_kg as S
    from studies.reopd_kg import resume
    cache = tmp_path / "cache"
    for rel in resume.CACHE_FILES:
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_text(rel)
    fp = resume.study_fingerprint(cache, S.QUICK)
    assert "seeds" not in fp["config"] and fp["config"]["pilot_seeds"] == [100]
    # sha256 of a file against hashlib directly
    import hashlib
    assert fp["cache"]["pool/pool.json"] == hashlib.sha256(b"pool/pool.json").hexdigest()
    out = tmp_path / "study"
    out.mkdir()
    resume.write_study(out, fp)
    resume.check_study(out, fp)                       # the same: passes
    # a longer verdict seed range extends the study (not part of the config)
    import dataclasses
    resume.check_study(out, resume.study_fingerprint(
        cache, dataclasses.replace(S.QUICK, seeds=(0, 1, 2, 3))))
    (cache / "logits/index.json").write_text("another index")
    with pytest.raises(BadInput, match=r"--cache: logits/index\.json .*fingerprint\.json field "
                       r"cache\.logits/index\.json"):
        resume.check_study(out, resume.study_fingerprint(cache, S.QUICK))
    (cache / "logits/index.json").write_text("logits/index.json")
    with pytest.raises(BadInput, match=r"--updates: updates = 3 .*config\.updates"):
        resume.check_study(out, resume.study_fingerprint(
            cache, dataclasses.replace(S.QUICK, updates=3)))
    rec = {"x": 1, "fingerprint": {"cache_sha": fp["cache_sha"], "config_sha": fp["config_sha"],
                                   "cold_sha": "c0"}}
    path = resume.record_path(out, "pilot", "opd_lr0.001", 100)
    resume.save_record(path, rec)
    assert resume.load_record(path, {**fp, "cold_sha": "c0"}) == rec
    with pytest.raises(BadInput, match="cold"):
        resume.load_record(path, {**fp, "cold_sha": "c1"})
    path.write_text('{"x": ')                          # torn: absent, the run is redone
    assert resume.load_record(path, {**fp, "cold_sha": "c0"}) is None


def test_turns_per_update_is_the_pooled_mean():
    from studies import reopd_kg as S
    recs = [{"totals": {"supervised_turns": t}, "updates": 10} for t in (600, 640, 655)]
    assert S.turns_per_update(recs) == round(1895 / 30)


@pytest.mark.slow
def test_quick_study_killed_and_restarted_equals_uninterrupted(tmp_path):
    """The pilot and compare at tiny size, run once without interruption (A) and once (B, the
    same tiny cache) killed with SIGKILL after its first compare run's record appeared and then
    restarted with the same arguments: every per-run record (timings aside) is equal — per-problem
    outcomes, success, cost counts and fingerprints exactly, the float diagnostic ``gap_end`` to
    1e-6 (it differed by 2e-8 between the pytest process and a subprocess) —, so are the pilot's
    choice and the compare's outcomes; B's records written before the kill were kept, not
    redone. Then a changed cache and a changed config are refused, nothing written."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from prada_jax.errors import BadInput
    from studies.reopd_kg import resume
    from studies.reopd_kg.__main__ import main
    repo = Path(__file__).resolve().parents[3]
    A, B = tmp_path / "A", tmp_path / "B"
    args = ["--quick", "--parts=cold,pilot,compare"]
    assert main(args + [f"--out={A}"]) == 0
    shutil.copytree(A / "cache", B / "cache")
    env = dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "studies.reopd_kg", *args, f"--out={B}"],
                            cwd=repo, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 1800
        while not list((B / "runs" / "compare").glob("*.json")):
            assert proc.poll() is None, "B ended before its first compare record"
            assert time.time() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    before = _tree(B / "runs")
    assert not (B / "study.json").exists() or "compare" not in json.loads(
        (B / "study.json").read_text())
    assert main(args + [f"--out={B}"]) == 0
    after = _tree(B / "runs")
    assert all(after[k] == v for k, v in before.items() if k.endswith(".json"))   # kept
    ra, rb = _records(A), _records(B)
    assert set(ra) == set(rb) and len(ra) == 3 + 2 * 4
    for k in ra:   # outcomes, success, counts, fingerprints exact; float diagnostics to 1e-6
        assert ra[k].keys() == rb[k].keys(), k
        for f, v in ra[k].items():
            if isinstance(v, float):
                assert rb[k][f] == pytest.approx(v, rel=1e-6, abs=1e-9), (k, f)
            else:
                assert rb[k][f] == v, (k, f)
    sa, sb = (json.loads((d / "study.json").read_text()) for d in (A, B))
    assert sa["pilot"]["choice"] == sb["pilot"]["choice"] and sa["pilot"]["B"] == sb["pilot"]["B"]
    assert sa["compare"]["runs"].keys() == sb["compare"]["runs"].keys()
    for k in sa["compare"]["runs"]:
        assert sa["compare"]["runs"][k]["outcomes"] == sb["compare"]["runs"][k]["outcomes"]
    assert sa["compare"]["verdicts"]["pooled"] == sb["compare"]["verdicts"]["pooled"]
    # a third run with the same arguments trains nothing and changes no record
    t0 = _tree(A / "runs")
    assert main(args + [f"--out={A}", "--parts=pilot,compare"]) == 0
    assert _tree(A / "runs") == t0
    # another cache (one byte of the pool's meta) or config: refused, nothing written
    C = tmp_path / "C"
    shutil.copytree(A / "cache" / "seed0", C)
    (C / "pool" / "pool.json").write_text((C / "pool" / "pool.json").read_text() + " ")
    t0 = _tree(A)
    with pytest.raises(BadInput, match=r"--cache: pool/pool\.json .*fingerprint\.json"):
        main([f"--cache={C}", f"--out={A}", "--parts=pilot"])
    with pytest.raises(BadInput, match=r"--kappas: .*config\.kappas"):
        main(args + [f"--out={A}", "--kappas=0.5,1"])
    assert _tree(A) == t0
    assert resume.load_record(next((A / "runs" / "pilot").glob("*.json")),
                              json.loads((A / "fingerprint.json").read_text())) is not None


def test_adopt_only_a_run_of_the_same_config(tmp_path):
    """An earlier study's finished run is adopted only if every config field matches, the
    init path aside, and the two init folders' weights are byte-identical; the copy then names
    the new init and says where it came from; the original is not touched."""
    from prada_jax import config_utils as cu
    from studies import reopd_kg as S
    from studies.reopd_kg import resume
    old_init, new_init = tmp_path / "old_cold", tmp_path / "new_cold"
    for d in (old_init, new_init):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"weights")
    st = S.Study.__new__(S.Study)
    st.cache, st.s = tmp_path / "cache", S.FULL

    def cfg(init, lr=1e-4):
        return st.unit_config("opd", 100, lr, None, {"student": str(init)}, 0.6, 2, 128)

    old = tmp_path / "old_run"
    old.mkdir()
    (old / "config.json").write_text(cu.config_to_json(cfg(old_init)))
    (old / "results.json").write_text(json.dumps({"after": {"success_rate": 0.2}}))
    (old / "run.json").write_text(json.dumps({"provenance": [{"event": "start"}]}))
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    assert not resume.adopt(old, tmp_path / "a", cfg(new_init, lr=3e-4), old_init)   # other lr
    assert not (tmp_path / "a").exists()
    (new_init / "model.safetensors").write_bytes(b"other weights")
    assert not resume.adopt(old, tmp_path / "b", cfg(new_init), old_init)   # other init bytes
    (new_init / "model.safetensors").write_bytes(b"weights")
    assert resume.adopt(old, tmp_path / "c", cfg(new_init), old_init)
    got = json.loads((tmp_path / "c" / "config.json").read_text())
    assert got["student"]["init"] == str(new_init) and got["optim"]["lr"] == 1e-4
    prov = json.loads((tmp_path / "c" / "run.json").read_text())["provenance"]
    assert prov[-1]["event"] == "adopted" and prov[-1]["from"] == str(old)
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert not resume.adopt(old, tmp_path / "c", cfg(new_init), old_init)   # never overwrites


def test_the_entry_skips_every_finished_run(tmp_path, monkeypatch):
    """The resume path through the study's own entry (``python -m studies.reopd_kg``), in the
    default run: a study folder whose pilot runs all have records (same fingerprint, same cold
    start) reruns ``--parts=pilot`` without training anything, leaves every record as it was
    and makes the lr choice from them. (Only slow tests reached ``Study.unit`` before: its
    skip check inverted passed the default run.) The trainer is a stand-in that fails the
    test if it is asked to train."""
    import dataclasses

    from studies import reopd_kg as S
    from studies.reopd_kg import resume
    from studies.reopd_kg.__main__ import main

    cache = tmp_path / "cache"
    for rel in resume.CACHE_FILES:
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_text(f"fake {rel}")
    out = tmp_path / "study"
    cold_dir = out / "cold" / "student_hf"
    cold_dir.mkdir(parents=True)
    (cold_dir / "model.safetensors").write_bytes(b"cold weights")
    cold = {"student": str(cold_dir)}
    (out / "study.json").write_text(json.dumps({"task": "kg_lookup_v1", "cold": cold}))
    sizes = dataclasses.replace(S.FULL, pilot_seeds=(100, 101))
    fp = resume.study_fingerprint(cache, sizes)
    resume.write_study(out, fp)
    key = {k: fp[k] for k in ("cache_sha", "config_sha")} | {"cold_sha": S.cold_sha(cold)}
    best = {"opd": 3e-4, "reopd": 1e-3, "sft": 1e-4}
    for mode in S.MODES:
        for lr in sizes.lrs:
            for sd in sizes.pilot_seeds:
                resume.save_record(
                    resume.record_path(out, "pilot", f"{mode}_lr{lr:g}", sd),
                    {"mode": mode, "lr": lr, "seed": sd, "fingerprint": key,
                     "success": 0.5 if lr == best[mode] else 0.25, "updates": 10,
                     "totals": {"supervised_turns": 40}})
    before = _tree(out / "runs")

    class NoTraining:
        def __init__(self, *a, **k):
            self.task, self.pool, self.log = None, None, []
            self.say = lambda msg: self.log.append(msg)

        def train(self, name, config):
            raise AssertionError(f"{name}: a finished run was trained again")

    monkeypatch.setattr(S.base, "Study", NoTraining)
    monkeypatch.setattr("studies.reopd_kg.report.markdown", lambda res: "# report\n")
    assert main([f"--cache={cache}", f"--out={out}", "--parts=pilot",
                 "--pilot_seeds=100-101"]) == 0
    assert _tree(out / "runs") == before
    pilot = json.loads((out / "study.json").read_text())["pilot"]
    assert {m: c["lr"] for m, c in pilot["choice"].items()} == best
    assert pilot["B"] == 4
