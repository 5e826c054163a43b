"""Edges of ``evals.curve`` (issue 43): a pair file's path never becomes a path under (or
outside) ``--out``; every ``--pairs`` entry's env is checked before the first evaluation; a
curve rerun into a finished folder shows each TensorBoard point once. Results come from the
committed ``studies/load_curve/results/test/curve.json`` (``curve.results_from_json``), so no
test here evaluates anything."""
import json
from pathlib import Path

import pytest

from evals import curve
from prada_jax.errors import BadInput

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "studies" / "load_curve" / "results" / "test" / "curve.json"


@pytest.fixture(scope="module")
def paper_results():
    return curve.results_from_json(json.loads(COMMITTED.read_text()), "paper")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_pair_file_is_drawn_by_its_stem_inside_out(tmp_path, paper_results):
    """``--pairs=checkpoints/../../../../X.json`` wrote its PNG outside ``--out`` (and an
    absolute path made nested folders under it): the figure is ``curve_X.png`` in ``--out``."""
    out = tmp_path / "a" / "b" / "out"
    escaping = "checkpoints/../../../../X.json"
    absolute = str(tmp_path / "hw" / "my pair.json")
    res = curve.write_curve_outputs({escaping: paper_results, absolute: paper_results}, out,
                                    title="t", meta={})
    assert res["figures"][escaping] == out / "curve_X.png"
    assert res["figures"][absolute] == out / "curve_my_pair.png"
    assert [p for p in tmp_path.rglob("*.png") if p.parent != out] == []
    assert {p.name for p in out.glob("*.png")} == {"curve_X.png", "curve_my_pair.png"}
    # the JSON keeps the pairs as given
    assert set(json.loads((out / "curve.json").read_text())["pairs"]) == {escaping, absolute}


def test_two_pair_files_with_one_stem_are_refused():
    assert curve.pair_tags(["paper", "a100_orin_int4", "x/p.json"]) == {
        "paper": "paper", "a100_orin_int4": "a100_orin_int4", "x/p.json": "p"}
    with pytest.raises(BadInput, match=r"--pairs: a/p\.json and b/p\.json .*curve_p\.png"):
        curve.pair_tags(["a/p.json", "b/p.json"])
    with pytest.raises(BadInput, match="--pairs"):
        curve.pair_tags(["paper", "d/paper.json"])


def test_a_rerun_into_a_finished_folder_shows_each_point_once(tmp_path, paper_results):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for _ in range(2):
        curve.write_curve_outputs({"paper": paper_results}, tmp_path, title="t", meta={})
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tag = "curve_paper/load"
    assert [e.value for e in acc.Scalars(tag)] == pytest.approx(sorted(paper_results))
    assert len(acc.Images("curve/paper")) == 1


def test_every_pair_is_checked_before_the_first_evaluation(tmp_path, monkeypatch,
                                                          run_command):
    """The second ``--pairs`` entry's M beyond its server's KV memory was found only after
    the first pair's curve had been evaluated: now it is one line naming ``--pairs`` before
    any evaluation (a stand-in policy; an evaluation would fail the test)."""
    from evals import evaluate as ev
    from evals import suite
    from evals.testing import oracle_apply
    from prada_jax import latency
    from prada_jax.configs import ppo as ppo_cfg
    from prada_jax.rl.policy import LoadedPolicy

    cfg = ppo_cfg.get_config("smoke")
    pol = tmp_path / "pol"
    pol.mkdir()
    monkeypatch.setattr(suite, "load_policy", lambda *a, **k: LoadedPolicy(
        oracle_apply, None, {"seeds": []}, cfg, str(pol)))

    def no_evaluation(*a, **k):
        raise AssertionError("evaluated before every pair was checked")
    monkeypatch.setattr(ev, "Evaluator", no_evaluation)
    server = {f: float(getattr(latency.a100_80gb_bf16(), f))
              for f in latency.HardwareProfile.__dataclass_fields__}
    small = tmp_path / "small.json"    # holds the 7B weights and about one sequence
    small.write_text(json.dumps({"edge": "orin_agx_64gb_int4",
                                 "server": dict(server, mem_bytes=14.2e9)}))
    before = _tree(tmp_path)
    code, _, err = run_command("evals.curve", f"--policy={pol}", f"--pairs=paper,{small}",
                               "--num_servers=4", f"--out={tmp_path / 'out'}", cwd=tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: --pairs={small}: num_servers (M) = 4"), lines[0]
    assert _tree(tmp_path) == before
