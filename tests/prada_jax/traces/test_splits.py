"""Train / validation / test splits of a trace set and disjoint seed ranges."""
import json

import numpy as np
import pytest

from prada_jax.errors import BadInput
from prada_jax.traces import format as tf
from prada_jax.traces import splits, synthetic
from prada_jax.traces.loader import load_config_traces, load_trace_set
from prada_jax.traces.testing import random_meta, random_traces


def _problem_nodes(tr, p):
    """Plain-Python view of problem p: its nodes in order, with child / fallback as offsets
    from the problem's root (−1 kept)."""
    r, n = int(tr.root[p]), int(tr.n_nodes[p])
    rel = lambda v: [int(x) - r if x >= 0 else -1 for x in v]  # noqa: E731
    return [dict(feat=np.asarray(tr.feat[i]).tolist(), prm=float(tr.prm[i]),
                 child=rel(tr.child[i]), fallback=rel([tr.fallback[i]])[0],
                 depth=int(tr.depth[i]), terminal=np.asarray(tr.terminal[i]).tolist(),
                 correct=np.asarray(tr.correct[i]).tolist(),
                 ctx=int(tr.ctx_tokens[i])) for i in range(r, r + n)]


@pytest.mark.parametrize("p,seed", [(1, 0), (2, 1), (3, 0), (10, 4), (1319, 0)])
def test_problem_split_is_a_partition_of_stated_sizes(p, seed):
    s = splits.problem_split(p, seed)
    allp = sorted(s["train"] + s["validation"] + s["test"])
    assert allp == list(range(p))
    assert all(s[k] == sorted(s[k]) for k in splits.SPLITS) and s["train"]
    if p >= 3:
        assert len(s["validation"]) == max(1, round(0.15 * p))
        assert len(s["test"]) == max(1, round(0.15 * p))
    assert splits.problem_split(p, seed) == s            # deterministic
    assert splits.check_splits(s, p) == s


def test_subset_matches_a_plain_python_walk():
    full = random_traces(seed=2, problems=12, depth=4, feature_dim=3)
    ids = [0, 3, 4, 9, 11]
    sub = splits.subset_problems(full, ids)
    arrays = {k: np.asarray(v) for k, v in sub.to_dict().items()}
    tf.validate_arrays(arrays, {"feature_dim": 3, "max_depth": int(arrays["depth"].max()),
                                "counts": {"problems": len(ids),
                                           "nodes": int(arrays["depth"].shape[0])}}, "subset")
    assert sub.num_problems == len(ids)
    for j, p in enumerate(ids):
        assert _problem_nodes(sub, j) == _problem_nodes(full, p)
        assert int(sub.answer_id[j]) == int(full.answer_id[p])
    assert np.all(np.asarray(sub.problem)[np.asarray(sub.root)] == np.arange(len(ids)))


def test_synthetic_parts_share_one_feature_map():
    """Every part is rows of the one generated set: a problem's nodes (features included) are
    the same whichever part it lands in, and the generator's arrays do not depend on the
    split."""
    full, meta = synthetic.generate("gsm8k", seed=5, problems=40)
    assert meta["splits"] == splits.problem_split(40, 5)
    for part in splits.SPLITS:
        sub, info = load_trace_set("gsm8k", problems=40, seed=5, split=part)
        assert info["split"] == part and info["split_problems"] == meta["splits"][part]
        assert info["problems_total"] == 40 and sub.num_problems == len(meta["splits"][part])
        for j, p in enumerate(meta["splits"][part]):
            assert _problem_nodes(sub, j) == _problem_nodes(full, p)


def test_ppo_config_trains_on_the_train_split():
    from prada_jax.configs import ppo

    cfg = ppo.get_config()
    cfg.env.problems = 50
    assert cfg.env.split == "train"
    tr, info = load_config_traces(cfg)
    assert info["split"] == "train"
    assert info["split_problems"] == splits.problem_split(50, cfg.env.trace_seed)["train"]
    assert tr.num_problems == len(info["split_problems"])


def test_folder_splits_unknown_name_and_missing_metadata(tmp_path):
    tr = random_traces(seed=1, problems=10, depth=3, feature_dim=3)
    tf.save(tr, tmp_path / "t", random_meta(tr, "crafted"))
    with pytest.raises(splits.SplitError, match=r"^--split=test: traces=.*t has no split "
                       r"metadata \(meta.json 'splits'\)"):
        load_trace_set(tmp_path / "t", split="test")
    with pytest.raises(splits.SplitError, match=r"^--split=dev: unknown split"):
        load_trace_set(tmp_path / "t", split="dev")
    assert load_trace_set(tmp_path / "t", split="all")[1]["num_problems"] == 10
    rec = tf.write_splits(tmp_path / "t", seed=3)
    assert rec == splits.problem_split(10, 3)
    sub, info = load_trace_set(tmp_path / "t", split="test")
    assert info["split_problems"] == rec["test"] and sub.num_problems == len(rec["test"])
    with pytest.raises(splits.SplitError, match="already has 'splits'"):
        tf.write_splits(tmp_path / "t")
    # A malformed record names the field.
    meta = json.loads((tmp_path / "t" / "meta.json").read_text())
    meta["splits"]["test"] = meta["splits"]["test"] + meta["splits"]["train"][:1]
    (tmp_path / "t" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(tf.TraceFormatError, match=r"field 'splits': problem \d+ is in more "
                       "than one part"):
        load_trace_set(tmp_path / "t", split="test")
    meta["splits"] = {"train": [0], "test": [1]}
    (tmp_path / "t" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(tf.TraceFormatError, match="field 'splits': must be an object"):
        tf.read_meta(tmp_path / "t")


def test_seed_ranges_disjoint_by_construction_and_checked():
    tr0, tr1 = 0, splits.VALIDATION_SEED_BASE
    for split in ("train", "validation", "test", None):
        a, b = splits.evaluation_seeds(split, 0, 8, train_seeds=[0, 1, 2])
        assert b - a == 8 and not (a < tr1 and tr0 < b)        # apart from training seeds
    va = splits.evaluation_seeds("validation", 5, 8)
    te = splits.evaluation_seeds("test", 5, 8)
    assert va[1] <= te[0]
    with pytest.raises(splits.SplitError, match=r"^seed ranges overlap: --seed0/--seeds"):
        splits.evaluation_seeds("validation", splits.SEED_RANGE - 3, 8)
    with pytest.raises(splits.SplitError, match="the policy's training seed 2000001"):
        splits.evaluation_seeds("test", 0, 4, train_seeds=[splits.TEST_SEED_BASE + 1])
    with pytest.raises(splits.SplitError, match=r"config.seed/config.num_seeds"):
        splits.check_training_seeds(splits.VALIDATION_SEED_BASE - 1, 2)
    splits.check_training_seeds(0, 8)
    assert issubclass(splits.SplitError, BadInput)


def test_train_ppo_refuses_bad_split_and_seed_ranges_at_start():
    from prada_jax.rl import trainer
    from prada_jax.configs import ppo

    from envs import stage1   # the env's fields are checked where the env is built

    cfg = ppo.get_config("smoke")
    trainer.validate_config(cfg)
    stage1.validate_env_config(cfg)
    cfg.env.split = "dev"
    with pytest.raises(BadInput, match=r"^config.env.split=dev: unknown split"):
        stage1.validate_env_config(cfg)
    cfg = ppo.get_config("smoke")
    cfg.seed, cfg.num_seeds = splits.VALIDATION_SEED_BASE - 1, 2
    with pytest.raises(BadInput, match=r"^seed ranges overlap: config.seed/config.num_seeds"):
        trainer.validate_config(cfg)
