"""The prefix-source study command (studies/reopd_prefix_source/__init__.py): the ``--quick`` study end
to end on two tiny synthetic caches, its paired statistics against SciPy, the mixed cache (G's
prefixes, T's logits and T as the target), and bad input refused before writing."""
import json

import numpy as np
import pytest

from studies import reopd_prefix_source as ps


@pytest.mark.slow  # a finished study (≈ 38 s); its bad-input cases stay in test_cli_errors
def test_quick_study_end_to_end(tmp_path):
    out = tmp_path / "q"
    assert ps.main(["--quick", "--out", str(out)]) == 0
    res = json.loads((out / "result.json").read_text())
    assert res["synthetic"] is True and set(res["runs"]) == set(ps.ARMS)
    # per-seed success read back from each arm's own results.json (independent of the summary)
    succ = {}
    for arm in ps.ARMS:
        per = json.loads((out / arm / "results.json").read_text())["per_seed"]
        succ[arm] = np.array([r["after"]["success_rate"] for r in per])
        assert res["runs"][arm]["tool_calls"] == 0
    d = succ["teacher_prefix"] - succ["generator_prefix"]
    v = res["verdict"]
    assert v["n"] == len(ps.QUICK.seeds) and v["mean"] == pytest.approx(d.mean())
    assert v["diffs"] == pytest.approx(d.tolist())
    # the mixed cache: G's pool, T's logits on it, T the target; the other arm all T
    tc, gc = out / "cache_T", out / "cache_G"
    cg = json.loads((out / "generator_prefix" / "config.json").read_text())["data"]
    ct = json.loads((out / "teacher_prefix" / "config.json").read_text())["data"]
    assert cg["pool_dir"] == str(gc / "pool") and cg["teacher_dir"] == str(tc / "teacher")
    assert cg["logits_dir"] == str(out / "logits_T_on_G")
    assert ct["pool_dir"] == str(tc / "pool") and ct["teacher_dir"] == str(tc / "teacher")
    # both arms start from the same cold start, trained on T's pool
    cold = json.loads((out / "cold" / "config.json").read_text())["data"]
    assert cold["pool_dir"] in ("", str(tc / "pool")) and cold["cache"] == str(tc)
    assert "teacher prefixes ≥ generator prefixes" in (out / "report.md").read_text()


def test_logits_on_the_generator_pool_are_the_targets(tmp_path):
    """T's store on G's pool holds T's log-probs of G's action tokens, computed here directly
    with torch, and differs from G's own store on the same pool."""
    import torch
    from transformers import Qwen2ForCausalLM

    from prada_jax.distill import pool as pool_lib
    from prada_jax.distill import teacher_table
    from prada_jax.distill.task.export_local import export_logits
    from prada_jax.distill.task.teacher import tiny_cache
    tc, gc = tiny_cache(tmp_path / "T", 12), ps._tiny_generator(tmp_path / "G")
    store = export_logits(tc / "teacher", gc / "pool", tmp_path / "TG", top_k=4)
    pool = pool_lib.load_pool(gc / "pool")
    tab_t = teacher_table.load(store, pool)
    tab_g = teacher_table.load(gc / "logits", pool)
    model = Qwen2ForCausalLM.from_pretrained(tc / "teacher").eval()
    toks, offs = np.asarray(pool.tokens), np.asarray(pool.traj_offsets)
    act = np.asarray(pool.action_mask).astype(bool)
    ref, pos = [], []
    for i in range(pool.num_trajectories):
        a, b = int(offs[i]), int(offs[i + 1])
        seq = torch.tensor(toks[a:b][None].astype(np.int64))
        with torch.no_grad():
            lp = torch.log_softmax(model(seq).logits[0].double(), -1).numpy()
        for j in range(a + 1, b):       # row j: log p(token j | tokens before it)
            if act[j]:
                ref.append(lp[j - a - 1, toks[j]])
                pos.append(j)
    ref, pos = np.array(ref), np.array(pos)
    assert pos.size > 0
    assert np.asarray(tab_t.logp_actual)[pos] == pytest.approx(ref, abs=2e-2)  # float16 store
    assert not np.allclose(np.asarray(tab_g.logp_actual)[pos], ref, atol=2e-2)


def test_bad_input_is_refused_before_writing(tmp_path):
    from prada_jax.errors import BadInput
    (tmp_path / "c").mkdir()
    for argv in (["--out", str(tmp_path / "o"), "--updates=0"],
                 ["--out", str(tmp_path / "o"), "--cold_updates=0"],
                 ["--out", str(tmp_path / "o"), "--seeds=3"],
                 ["--out", str(tmp_path / "o"), "--teacher_cache", str(tmp_path / "c"),
                  "--generator_cache", str(tmp_path / "c")],
                 ["--out", str(tmp_path / "o"), "--generator_cache", str(tmp_path / "c")]):
        with pytest.raises(BadInput):
            ps.main(argv)
    assert not (tmp_path / "o").exists()
