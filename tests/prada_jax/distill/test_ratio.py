"""Prefix likelihood ratios: per-turn gaps and log br against a plain-Python loop, the OLS
against scipy, the constant-gap closed form (slope = −c, R² = 1, κ = exp(−c), exact-ratio
weights = κ^t weights), the student forward against per-trajectory unpadded forwards, and the
sampler following replaced probabilities (chi-square)."""
import math

import jax
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from prada_jax.distill import pool as P
from prada_jax.distill import ratio
from prada_jax.distill.sampler import TurnSampler, pair_weights
from prada_jax.distill.task import arith


def _pool(n=20, seed=3):
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(seed, n)))
    return P.make_pool(P.build_arrays(trajs, spans, [1] * n), {})


def _reference_log_ratio(pool, lt, ls):
    """Plain-Python loop: gap of every turn, then the running prefix sum per trajectory."""
    gaps, lrs = [], []
    for i in range(pool.num_trajectories):
        first = int(pool.traj_offsets[i])
        running = 0.0
        for k in range(int(pool.turn_offsets[i]), int(pool.turn_offsets[i + 1])):
            g = 0.0
            for j in range(int(pool.turn_starts[k]), int(pool.turn_ends[k])):
                if j != first:
                    g += float(lt[j]) - float(ls[j])
            gaps.append(g)
            lrs.append(-running)
            running += g
    return np.array(gaps), np.array(lrs)


def test_gaps_and_log_ratio_match_loop_and_scipy_regression():
    pool = _pool()
    T = int(np.asarray(pool.tokens).size)
    rng = np.random.default_rng(0)
    lt = -rng.exponential(0.3, T)
    ls = -rng.exponential(1.0, T)
    g_ref, lr_ref = _reference_log_ratio(pool, lt, ls)
    np.testing.assert_allclose(ratio.turn_gaps(pool, lt, ls), g_ref, rtol=1e-12, atol=1e-12)
    d = ratio.diagnose(pool, lt, ls)
    np.testing.assert_allclose(d.log_ratio, lr_ref, rtol=1e-12, atol=1e-12)
    turns = np.concatenate([np.arange(k) for k in pool.turns_per_trajectory()])
    ref = stats.linregress(turns, lr_ref)
    assert d.slope == pytest.approx(ref.slope, rel=1e-10)
    assert d.intercept == pytest.approx(ref.intercept, rel=1e-10, abs=1e-12)
    assert d.r2 == pytest.approx(ref.rvalue ** 2, rel=1e-10)
    assert d.mean_gap == pytest.approx(g_ref.mean(), rel=1e-12)
    assert d.kappa_auto == pytest.approx(max(1e-3, math.exp(-g_ref.mean())), rel=1e-12)
    assert sum(d.n_turn) == len(lr_ref) and d.mean_log_ratio_turn[0] == 0.0


@pytest.mark.parametrize("c", [0.2, 0.51, 1.3])
def test_constant_gap_closed_form(c):
    """Each turn's gap is exactly c (spread over its tokens): log br_t = −t·c, slope −c,
    R² = 1, κ = exp(−c), and unclipped exact-ratio weights equal the κ^t weights."""
    pool = _pool(16, seed=7)
    T = int(np.asarray(pool.tokens).size)
    lt = np.zeros(T)
    ls = np.zeros(T)
    first = set(np.asarray(pool.traj_offsets[:-1]).tolist())
    for s, e in zip(pool.turn_starts, pool.turn_ends):
        idx = [j for j in range(int(s), int(e)) if j not in first]
        ls[idx] = -c / len(idx)
    d = ratio.diagnose(pool, lt, ls)
    turns = np.concatenate([np.arange(k) for k in pool.turns_per_trajectory()])
    np.testing.assert_allclose(d.log_ratio, -c * turns, atol=1e-12)
    assert d.slope == pytest.approx(-c, rel=1e-10) and d.r2 == pytest.approx(1.0, rel=1e-10)
    assert d.kappa_auto == pytest.approx(math.exp(-c), rel=1e-12)
    p = ratio.exact_ratio_probs(pool, d.log_ratio, ratio_min=1e-9, ratio_max=10.0)
    np.testing.assert_allclose(p, pair_weights(pool, math.exp(-c)), rtol=1e-10)


def test_exact_ratio_clipping_and_normalisation():
    pool = _pool(10)
    K = int(pool.turn_offsets[-1])
    lr = np.random.default_rng(1).normal(0, 5, K)
    p = ratio.exact_ratio_probs(pool, lr, ratio_min=0.01, ratio_max=3.0)
    offs = np.asarray(pool.turn_offsets)
    np.testing.assert_allclose(np.add.reduceat(p, offs[:-1]), 1.0 / pool.num_trajectories)
    w = np.clip(np.exp(lr), 0.01, 3.0)
    for i in range(pool.num_trajectories):
        sl = slice(offs[i], offs[i + 1])
        np.testing.assert_allclose(p[sl], w[sl] / w[sl].sum() / pool.num_trajectories)
    with pytest.raises(ValueError, match="ratio_min"):
        ratio.exact_ratio_probs(pool, lr, ratio_min=0.0)
    with pytest.raises(ValueError, match="ratio_max"):
        ratio.exact_ratio_probs(pool, lr, ratio_max=0.5)


def test_kappa_from_gap_edges_and_bad_input():
    assert ratio.kappa_from_gap(-0.3) == 1.0          # student beats the teacher: uniform
    assert ratio.kappa_from_gap(50.0, kappa_min=0.01) == 0.01
    with pytest.raises(ValueError, match="kappa_min"):
        ratio.kappa_from_gap(0.5, kappa_min=0.0)
    with pytest.raises(ValueError, match="not finite"):
        ratio.kappa_from_gap(float("nan"))
    pool = _pool(4)
    T = int(np.asarray(pool.tokens).size)
    with pytest.raises(ValueError, match="one per pool token"):
        ratio.turn_gaps(pool, np.zeros(T - 1), np.zeros(T))
    bad = np.zeros(T)
    bad[5] = -np.inf
    with pytest.raises(ValueError, match="pool token 5"):
        ratio.turn_gaps(pool, np.zeros(T), bad)
    r = ratio.regress_on_turn(np.zeros(4), np.arange(4.0))   # one turn index: no slope
    assert math.isnan(r["slope"]) and math.isnan(r["r2"])


def test_student_token_logp_equals_unpadded_forwards():
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.model import CausalLM
    cfg = LMConfig(vocab_size=24, hidden_size=16, intermediate_size=32, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    model = CausalLM(cfg, rngs=nnx.Rngs(params=1))
    pool = _pool(7)
    gd, params = nnx.split(model, nnx.Param)
    got = ratio.student_token_logp(ratio.token_logp_fn(gd), params, pool, batch_size=3)
    toks = np.asarray(pool.tokens)
    # The reference: one unpadded forward per trajectory (jitted: eager NNX dispatches op by op)
    forward = jax.jit(lambda p, t: nnx.merge(gd, p)(t))
    for i in range(pool.num_trajectories):
        a, b = int(pool.traj_offsets[i]), int(pool.traj_offsets[i + 1])
        logits = np.asarray(forward(params, toks[None, a:b]), np.float64)[0]
        lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1,
                                                                                 keepdims=True)
                             ) - logits.max(-1, keepdims=True)
        ref = lp[np.arange(b - a - 1), toks[a + 1:b]]
        np.testing.assert_allclose(got[a + 1:b], ref, rtol=1e-5, atol=1e-5)
        assert got[a] == 0.0


def test_sampler_follows_replaced_probabilities():
    pool = _pool(12)
    s = TurnSampler(pool, kappa=0.6)
    K = int(pool.turn_offsets[-1])
    lr = np.random.default_rng(2).normal(0, 1, K)
    p = ratio.exact_ratio_probs(pool, lr)
    s.set_probs(p)
    n = 100_000
    counts = np.bincount(s.draw(np.random.default_rng(0), n), minlength=K)
    assert stats.chisquare(counts, n * p).pvalue > 1e-3
    with pytest.raises(ValueError, match="one entry per pool turn"):
        s.set_probs(p[:-1])
    with pytest.raises(ValueError, match="non-negative"):
        s.set_probs(-p)


def test_cli_teacher_as_student_has_zero_gap_and_bad_student_exits_2(tmp_path, capsys):
    """The CLI end to end on a saved pool, a teacher table made from a tiny model, and HF
    student folders: the teacher scored against itself has c̄ = 0 (κ = 1, slope 0); another
    model's numbers equal :func:`ratio.diagnose` on directly computed log-probs."""
    import importlib
    import json

    from prada_jax.distill import teacher_table
    ratio_cli = importlib.import_module("prada_jax.distill.ratio.__main__")
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.hf import save_hf
    from prada_jax.lm.model import CausalLM
    cfg = LMConfig(vocab_size=24, hidden_size=16, intermediate_size=32, num_layers=1,
                   num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(11, 6)))
    P.save_pool(P.build_arrays(trajs, spans, [1] * 6), tmp_path / "pool",
                {"task": arith.TASK_NAME,
                 "tokenizer": P.tokenizer_meta(arith.build_tokenizer())})
    pool = P.load_pool(tmp_path / "pool")
    models = {}
    for name, seed in (("teacher", 0), ("student", 1)):
        m = CausalLM(cfg, rngs=nnx.Rngs(params=seed))
        save_hf(m, cfg, tmp_path / name)
        gd, params = nnx.split(m, nnx.Param)
        models[name] = ratio.student_token_logp(ratio.token_logp_fn(gd), params, pool)
    lt = models["teacher"]
    toks = np.asarray(pool.tokens)
    offs = np.asarray(pool.traj_offsets)
    seqs = []
    for i in range(pool.num_trajectories):
        a, b = int(offs[i]), int(offs[i + 1])
        lp = lt[a + 1:b]
        seqs.append({"logp_actual": lp, "topk_ids": toks[a + 1:b, None],
                     "topk_logp": lp[:, None], "tail_mass": 1.0 - np.exp(lp)})
    teacher_table.write_store(pool, seqs, tmp_path / "logits")
    base = ["--pool", str(tmp_path / "pool"), "--logits", str(tmp_path / "logits")]
    assert ratio_cli.main(base + ["--student", str(tmp_path / "teacher"), "--json",
                              str(tmp_path / "t.json")]) == 0
    t = json.loads((tmp_path / "t.json").read_text())
    assert abs(t["mean_gap"]) < 1e-5 and t["kappa_auto"] == pytest.approx(1.0, abs=1e-5)
    assert abs(t["slope"]) < 1e-5
    assert ratio_cli.main(base + ["--student", str(tmp_path / "student"), "--json",
                              str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    ref = ratio.diagnose(pool, lt, models["student"])
    assert s["mean_gap"] == pytest.approx(ref.mean_gap, rel=1e-5)
    assert s["slope"] == pytest.approx(ref.slope, rel=1e-5) and s["r2"] == pytest.approx(ref.r2)
    assert "kappa = exp(-c)" in capsys.readouterr().out
    from prada_jax.errors import BadInput
    with pytest.raises(BadInput, match="nowhere: student folder not found"):
        ratio_cli.main(base + ["--student", str(tmp_path / "nowhere")])


def test_token_logp_fn_is_cached_per_model_graph():
    """Two students of one architecture share one jitted function (one compile per shape); a
    different architecture gets its own; values match a direct forward."""
    import jax.numpy as jnp
    from flax import nnx

    from prada_jax.distill.ratio import token_logp_fn
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.model import CausalLM

    def model(seed, hidden=16):
        cfg = LMConfig(vocab_size=24, hidden_size=hidden, intermediate_size=32, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=hidden // 2,
                       tie_word_embeddings=True)
        return nnx.split(CausalLM(cfg, rngs=nnx.Rngs(params=seed)), nnx.Param)

    (g0, p0), (g1, p1), (g2, _) = model(0), model(1), model(2, hidden=32)
    f0, f1 = token_logp_fn(g0), token_logp_fn(g1)
    assert f0 is f1 and token_logp_fn(g2) is not f0
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 24, (3, 13)), jnp.int32)
    mask = jnp.ones_like(ids)
    n0 = f0._cache_size()       # other tests may have compiled this graph at other shapes
    f0(p0, ids, mask)
    n1 = f0._cache_size()
    out = np.asarray(f1(p1, ids, mask))
    assert n1 - n0 <= 1 and f0._cache_size() == n1   # the second student compiled nothing
    logits = np.asarray(nnx.merge(g1, p1)(ids, mask), np.float64)
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ref = np.take_along_axis(lp[:, :-1], np.asarray(ids)[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
