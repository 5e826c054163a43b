"""Issue 35's measuring tools: how unique the kg task's solution paths are (against brute-force
enumeration and hand counts), the fair clock (against a direct computation of every number),
the reliability-by-depth fit (on synthetic rows with a known decay) and the tool-round count
(against the episodes' own messages)."""
import math

import numpy as np
import pytest

from studies.reopd_kg import fairclock as fc
from prada_jax.distill import opd as opd_lib
from studies.reopd_kg import reliability as rel
from prada_jax.distill.task import kg
from prada_jax.distill.task.common import EpisodeResult


# ---------------------------------------------------------------------------- item 4: paths
def test_valid_paths_enumeration_matches_closed_form_and_all_replay():
    probs = [p for p in kg.make_problems(7, 40, max_hops=2)]
    assert any(p.values()[0] == p.values()[1] for p in probs)   # both answer-order cases
    for p in probs[:12] + [p for p in probs if p.values()[0] == p.values()[1]][:2]:
        paths = kg.valid_paths(p)
        assert len(paths) == len(set(paths)) == kg.num_valid_paths(p)
        calls = len(p.paths[0]) + len(p.paths[1]) + 2
        v1, v2 = p.values()
        assert len(paths) == 2 ** calls * (1 if v1 == v2 else 2)
        for toks in paths[:: max(1, len(paths) // 5)]:
            spans = []
            # recover spans from the token stream: assistant turns start at <call> / <ans>
            ids = list(toks)
            for i, t in enumerate(ids):
                if t in (kg.TOKEN_ID["<call>"], kg.TOKEN_ID["<ans>"]):
                    end = next(j for j in range(i, len(ids)) if ids[j] in kg.STOP_IDS) + 1
                    spans.append((i, end))
            assert kg.replay(p, kg.tokens_to_messages(ids, spans)) == (True, True)


def test_path_stats_against_hand_counts(tmp_path):
    from prada_jax.distill.task.kg_teacher import save_episodes
    probs = kg.make_problems(11, 12)
    rng = np.random.default_rng(0)
    eps, want_ref, want_valid, want_succ = [], 0, 0, 0
    want_mixed = 0
    for i, p in enumerate(probs):
        if i >= 9:         # a valid path, call forms alternating (both forms used)
            msgs = kg.solved_messages(p)
            k = 0
            for m in msgs:
                if m["role"] == "assistant" and m["content"].startswith("<call>"):
                    if k % 2:
                        m["content"] = "<call>" + m["content"][7] + m["content"][6] + "</call>"
                    k += 1
            ok = True
            want_valid += 1
            want_mixed += 1
        elif i % 3 == 0:   # the reference chain itself
            msgs, ok = kg.solved_messages(p), True
            want_ref += 1
            want_valid += 1
        elif i % 3 == 1:   # a valid path in other call forms (all relation first)
            msgs = kg.solved_messages(p)
            msgs = [dict(m, content=("<call>" + m["content"][7] + m["content"][6] + "</call>"
                                     if m["role"] == "assistant"
                                     and m["content"].startswith("<call>") else m["content"]))
                    for m in msgs]
            ok = True
            want_valid += 1
        else:              # a failure: a wrong answer
            msgs = kg.solved_messages(p, rng)
            msgs[-1] = {"role": "assistant", "content": "<ans>1<max>1=9</ans>"}
            ok = False
        want_succ += ok
        eps.append(EpisodeResult(msgs, ok, 0, sum(m["role"] == "assistant" for m in msgs)))
    pool = save_episodes(eps, tmp_path / "pool")
    calls0 = kg.TOOL_CALLS.calls
    st = kg.path_stats(pool, probs)
    assert kg.TOOL_CALLS.calls == calls0
    assert st["trajectories"] == 12
    assert st["share_equal_reference"] == pytest.approx(want_ref / 12)
    assert st["share_valid_shortest_path"] == pytest.approx(want_valid / 12)
    assert st["success"] == pytest.approx(want_succ / 12)
    assert st["share_successful_mixing_forms"] == pytest.approx(want_mixed / want_succ)
    assert st["valid_paths_per_problem_mean"] == pytest.approx(
        np.mean([len(kg.valid_paths(p)) for p in probs]))


# ---------------------------------------------------------------------------- item 3: clock
def _rec(turns, roll, score, upd, rounds, calls, tf, timed=True):
    return dict(supervised_turns=turns, rollout_s=roll, scoring_s=score, update_s=upd,
                tool_rounds=rounds, tool_calls=calls, teacher_tokens_forwarded=tf, timed=timed)


OPD = [_rec(60, 9.0, 9.0, 9.0, 11, 500, 9000, timed=False),   # compiled: not timed
       _rec(60, 0.6, 0.3, 0.2, 10, 480, 3000), _rec(50, 0.5, 0.2, 0.2, 9, 400, 2500),
       _rec(70, 0.8, 0.3, 0.3, 11, 560, 3500)]
REOPD = [_rec(64, 5.0, 5.0, 5.0, 0, 0, 9000, timed=False),
         _rec(64, 0.20, 0.10, 0.10, 0, 0, 5400), _rec(64, 0.24, 0.12, 0.10, 0, 0, 5500),
         _rec(64, 0.16, 0.08, 0.12, 0, 0, 5300)]
ROWS = 96


def _direct(L, stat):
    """Every number written out by hand from the records."""
    o = [(c["rollout_s"] + L * c["tool_rounds"] + c["scoring_s"]
          + c["update_s"] * c["supervised_turns"] / ROWS, c["supervised_turns"]) for c in OPD[1:]]
    r = [(c["rollout_s"] + c["scoring_s"] + c["update_s"], c["supervised_turns"])
         for c in REOPD[1:]]
    if stat == "sum":
        return (sum(w for w, _ in o) / sum(t for _, t in o)) / (sum(w for w, _ in r)
                                                              / sum(t for _, t in r))
    return float(np.median([w / t for w, t in o]) / np.median([w / t for w, t in r]))


@pytest.mark.parametrize("stat", ["median", "sum"])
def test_fair_clock_ratio_against_direct_computation(stat):
    for L in (0.0, 0.003, 0.05):
        assert fc.ratio(OPD, REOPD, L, ROWS, stat) == pytest.approx(_direct(L, stat), rel=1e-12)
    # padding rows are not charged: more static rows can only make OPD cheaper
    assert fc.ratio(OPD, REOPD, 0.0, 10 * ROWS, stat) < fc.ratio(OPD, REOPD, 0.0, ROWS, stat)


@pytest.mark.parametrize("stat", ["median", "sum"])
def test_break_even_latency_reaches_the_target(stat):
    L = fc.break_even_latency(OPD, REOPD, ROWS, 4.0, stat)
    assert L > 0
    assert _direct(L, stat) == pytest.approx(4.0, rel=1e-6)
    assert _direct(0.9 * L, stat) < 4.0
    # already above the target at 0: 0; no tool round and below it: inf
    assert fc.break_even_latency(OPD, REOPD, ROWS, 0.5, stat) == 0.0
    flat = [dict(c, tool_rounds=0) for c in OPD]
    assert fc.break_even_latency(flat, REOPD, ROWS, 4.0, stat) == math.inf


def test_break_even_sum_closed_form_equals_bisection_of_the_sum_ratio():
    L = fc.break_even_latency(OPD, REOPD, ROWS, 4.0, "sum")
    lo, hi = 0.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _direct(mid, "sum") >= 4.0 else (mid, hi)
    assert L == pytest.approx(hi, rel=1e-9)


def test_fair_clock_report_teacher_compute_and_old_clock():
    rep = fc.report(OPD, REOPD, ROWS, latencies=(0.0, 0.01))
    to = sum(c["teacher_tokens_forwarded"] for c in OPD) / sum(c["supervised_turns"] for c in OPD)
    tr = (sum(c["teacher_tokens_forwarded"] for c in REOPD)
          / sum(c["supervised_turns"] for c in REOPD))
    assert rep["ratio_teacher_compute"] == pytest.approx(to / tr)
    old = (np.median([(c["rollout_s"] + 0.01 * c["tool_calls"]) / c["supervised_turns"]
                      for c in OPD[1:]])
           / np.median([c["rollout_s"] / c["supervised_turns"] for c in REOPD[1:]]))
    assert rep["median"]["serial_per_call_ratio_old_clock"]["0.01"] == pytest.approx(old)
    assert rep["opd_tool_rounds_per_update"] == pytest.approx(10.0)
    assert rep["timed_updates"] == {"opd": 3, "reopd": 3}


# ---------------------------------------------------------------------------- tool rounds
def _ep(calls_at, n_turns):
    msgs = [{"role": "user", "content": "q"}]
    for t in range(n_turns):
        msgs.append({"role": "assistant", "content": f"a{t}"})
        if t in calls_at:
            msgs.append({"role": "tool", "content": "r"})
    return EpisodeResult(msgs, False, len(calls_at), n_turns)


def test_tool_turn_mask_is_the_union_of_tool_turns():
    eps = [_ep({0, 1, 2}, 4), _ep({0, 4}, 5), _ep(set(), 1)]
    m = opd_lib.tool_turn_mask(eps)
    assert {t for t in range(16) if m >> t & 1} == {0, 1, 2, 4}
    assert opd_lib.tool_turn_mask([]) == 0


# ---------------------------------------------------------------------------- item 2
def _synthetic_rows(slope, n_eps=400, quad=0.0, seed=0):
    rng = np.random.default_rng(seed)
    cl, t, v = [], [], []
    for e in range(n_eps):
        k = int(rng.integers(5, 12))
        u = rng.normal(0, 0.3)          # an episode effect: rows of one episode correlate
        for d in range(k):
            cl.append(e)
            t.append(d)
            v.append(-0.2 + slope * d + quad * d * d + u + rng.normal(0, 0.2))
    return cl, t, v


def test_depth_curve_recovers_a_known_linear_decay_and_its_kappa():
    b = math.log(0.7)                    # log-reliability falls 0.357 nats per turn: κ = 0.7
    cl, t, v = _synthetic_rows(b)
    out = rel.depth_curve(cl, t, v, n_boot=300, seed=1)
    f = out["fit"]
    assert f["slope_ci"][0] < b < f["slope_ci"][1]
    assert abs(f["slope"] - b) < 0.03
    assert f["kappa"] == pytest.approx(0.7, abs=0.02)
    assert f["kappa_ci"][0] < 0.7 < f["kappa_ci"][1]
    assert f["r2"] > 0.95 and f["linear"] is True
    # per-depth means against a direct computation
    tt, vv = np.asarray(t), np.asarray(v)
    for row in out["depth"]:
        assert row["mean"] == pytest.approx(vv[tt == row["t"]].mean())
        assert row["ci_low"] <= row["mean"] <= row["ci_high"]


def test_depth_curve_flags_curvature_and_clips_a_rising_curve():
    cl, t, v = _synthetic_rows(-0.05, quad=-0.04)
    assert rel.depth_curve(cl, t, v, n_boot=300)["fit"]["linear"] is False
    cl, t, v = _synthetic_rows(+0.1)
    f = rel.depth_curve(cl, t, v, n_boot=100)["fit"]
    assert f["slope"] > 0 and f["kappa"] == 1.0


def test_cluster_bootstrap_is_wider_than_rows_as_independent():
    """With a strong episode effect, resampling episodes must give a wider CI than treating
    rows as independent (the naive standard error)."""
    cl, t, v = _synthetic_rows(-0.1, n_eps=300)
    out = rel.depth_curve(cl, t, v, n_boot=400)
    tt, vv = np.asarray(t), np.asarray(v)
    row = out["depth"][0]
    naive = 1.96 * vv[tt == 0].std(ddof=1) / math.sqrt((tt == 0).sum())
    assert (row["ci_high"] - row["ci_low"]) / 2 > 0.8 * naive   # same rows at depth 0
    w = [(r["ci_high"] - r["ci_low"]) for r in out["depth"][:5]]
    assert all(x > 0 for x in w)


def test_rows_from_scores_and_batches():
    score = {"logp_actual": np.array([-1.0, -2.0, -0.5, -0.25, -3.0, -0.1])}
    # tokens 0..6; turns (2, 4) and (5, 7): entries 1..2 and 4..5
    assert rel.turn_logp(score, [(2, 4), (5, 7)]) == [(-2.5, 2), (-3.1, 2)]
    batch = {"action_mask": np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]]),
             "teacher_logp": np.array([[-1., -2., -9.], [-9., -9., -9.], [-0.5, -9., -9.]]),
             "turn": np.array([0, 1, 1])}
    t, lp, g = rel.batch_rows(batch)
    assert t.tolist() == [0, 1] and lp.tolist() == [-3.0, -0.5] and g.tolist() == [2, 1]
    assert rel.episode_ids(np.array([0, 1, 2, 0, 1, 0]), 5).tolist() == [5, 5, 5, 6, 6, 7]


def coin_student(tmp_path):
    """A saved CausalLM whose next token depends only on the current one: it calls the
    calculator at turn 0 (``<calc>2+3</calc>``) and after each tool reply calls again or
    answers (``<ans>5</ans>``) with probability 1/2 each, so episodes end at random turns."""
    import jax.numpy as jnp
    from flax import nnx

    from prada_jax.distill.task import arith
    from prada_jax.lm.config import LMConfig
    from prada_jax.lm.hf import save_hf
    from prada_jax.lm.model import CausalLM
    V, D = len(arith.VOCAB), 32
    cfg = LMConfig(vocab_size=V, hidden_size=D, intermediate_size=16, num_layers=1, num_heads=2,
                   num_kv_heads=1, head_dim=16, tie_word_embeddings=False,
                   pad_token_id=arith.PAD_ID, eos_token_id=arith.EOS_ID, arch="qwen2")
    model = CausalLM(cfg, rngs=nnx.Rngs(params=0))
    tid = arith.TOKEN_ID
    nxt = {}
    for script in ("<calc>2+3</calc>", "<ans>5</ans>"):
        ids = arith.encode(script)
        nxt.update({a: [b] for a, b in zip(ids[:-1], ids[1:])})
    nxt[tid["</q>"]] = [tid["<calc>"]]
    nxt[tid["</res>"]] = [tid["<calc>"], tid["<ans>"]]
    emb = np.zeros((V, D), np.float32)
    emb[np.arange(V), np.arange(V)] = 1.0
    head = np.zeros((D, V), np.float32)
    for v in range(V):
        for w in nxt.get(v, [arith.EOS_ID]):
            head[v, w] = 60.0
    model.embed_tokens.embedding.value = jnp.asarray(emb)
    model.lm_head.kernel.value = jnp.asarray(head)
    for layer in model.layers:
        layer.self_attn.o_proj.kernel.value = jnp.zeros_like(layer.self_attn.o_proj.kernel.value)
        layer.mlp.down_proj.kernel.value = jnp.zeros_like(layer.mlp.down_proj.kernel.value)
    save_hf(model, cfg, tmp_path / "coin", arch="qwen2")
    return tmp_path / "coin"


def test_trainer_counts_tool_rounds_once_per_turn_across_seeds(tmp_path):
    """A two-seed OPD run: each update's ``tool_rounds`` is the number of agent turns at which
    any episode of either seed was answered by the tool, counted from the episodes' messages
    by a wrapper around the task (the seeds' rollouts of an update run one after the other)."""
    pytest.importorskip("torch")
    from prada_jax import config_utils as cu
    from prada_jax.configs.distill import get_config
    from prada_jax.distill import task_registry as tasks_lib
    from prada_jax.distill.task import arith
    from prada_jax.distill.task.teacher import tiny_cache
    from prada_jax.distill.trainer import train_and_evaluate

    cache = tiny_cache(tmp_path / "cache")
    base = tasks_lib.get(arith.TASK_NAME)
    per_call = []

    def counted(problems, generate_fn, max_turns, tool_delay_s=0.0):
        eps = base.run_episodes(problems, generate_fn, max_turns, tool_delay_s=tool_delay_s)
        turns = set()
        for ep in eps:
            t = 0
            for j, m in enumerate(ep.messages):
                if m["role"] == "assistant":
                    if j + 1 < len(ep.messages) and ep.messages[j + 1]["role"] == "tool":
                        turns.add(t)
                    t += 1
        per_call.append(turns)
        return eps

    c = get_config("smoke,opd")
    c.data.cache = str(cache)
    for k, v in {"student.init": str(coin_student(tmp_path)), "eval.n_problems": 0,
                 "opd.episodes": 3, "train.num_seeds": 2,
                 "train.steps": 3, "onpolicy.temperature": 1.0}.items():
        cu.set_field(c, k, v)
    res = train_and_evaluate(c, tmp_path / "run", task=base._replace(run_episodes=counted))
    per = (res["per_seed"][0] if "per_seed" in res else res)["cost"]["per_update"]
    assert len(per) == 3 and len(per_call) == 6
    for u, rec in enumerate(per):
        union = per_call[2 * u] | per_call[2 * u + 1]
        assert rec["tool_rounds"] == len(union)
        assert rec["tool_rounds"] <= rec["tool_calls"]
    assert any(per_call), "the student made no tool call: the test would be vacuous"
    # the seeds' episodes end at different turns: the union is not always one seed's set
    assert any(per_call[2 * u] != per_call[2 * u + 1] for u in range(3))


def test_add_batch_keeps_the_cluster_of_each_supervised_row():
    batch = {"action_mask": np.array([[1, 0], [0, 0], [1, 1], [0, 0]]),
             "teacher_logp": np.array([[-1., 0.], [0., 0.], [-1., -1.], [0., 0.]]),
             "turn": np.array([0, 0, 1, 0])}
    rows = {"cluster": [], "t": [], "logp_turn": [], "tokens": []}
    rel.add_batch(rows, batch, np.array([7, -1, 7, -1]))   # padding rows carry no id
    assert rows == {"cluster": [7, 7], "t": [0, 1], "logp_turn": [-1.0, -2.0], "tokens": [1, 2]}
    with pytest.raises(ValueError):
        rel.add_batch(rows, batch, np.array([-1, -1, 7, -1]))
    assert rel.depth_curve([], [], [])["fit"] is None
