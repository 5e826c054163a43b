"""Arithmetic tool task: problems, calculator, episode runner; teacher-table alignment."""
import numpy as np
import pytest

from prada_jax.distill import pool as P
from prada_jax.distill import teacher_table as TT
from prada_jax.distill.task import arith


def test_problems_deterministic_and_in_range():
    a, b = arith.make_problems(3, 50), arith.make_problems(3, 50)
    assert a == b and a != arith.make_problems(4, 50)
    for p in a:
        assert 2 <= len(p.operands) <= 4
        # left-to-right evaluation, written independently of Problem.partials
        acc = p.operands[0]
        for op, x in zip(p.ops, p.operands[1:]):
            acc = eval(f"{acc}{op}{x}")  # noqa: S307 - trusted digits/operators only
            assert 0 <= acc <= 999
        assert p.answer == acc


@pytest.mark.parametrize("expr,want", [("12*7", "84"), ("2+3*4", "14"), ("3-10", "-7"),
                                       ("1+", "<err>"), ("(1)", "<err>"), ("", "<err>")])
def test_calculator(expr, want):
    before = arith.TOOL_CALLS.calls
    assert arith.calculator(expr) == f"<res>{want}</res>"
    assert arith.TOOL_CALLS.calls == before + 1


def test_oracle_agent_solves_every_episode_with_the_tool():
    problems = arith.make_problems(7, 20)

    def oracle(contexts):
        out = []
        for c in contexts:
            text = arith.decode(c)
            p = next(q for q in problems if text.startswith(q.question))
            done = text.count("<res>")
            if done < len(p.ops):
                prev = p.partials()[done - 1] if done else p.operands[0]
                act = f"<calc>{prev}{p.ops[done]}{p.operands[done + 1]}</calc>"
            else:
                act = f"<ans>{p.answer}</ans>"
            out.append(arith.encode(act))
        return out

    res = arith.run_episodes(problems, oracle)
    assert all(r.success for r in res)
    assert [r.tool_calls for r in res] == [len(p.ops) for p in problems]
    assert [r.turns for r in res] == [len(p.operands) for p in problems]
    # the recorded chat equals the reference solution
    assert res[0].messages == arith.solved_messages(problems[0])
    toks, _ = arith.messages_to_tokens(res[0].messages)
    assert len(toks) <= arith.max_episode_tokens()
    # a wrong answer or a malformed action fails the episode
    bad = arith.run_episodes(problems[:2], lambda c: [arith.encode("<ans>1000</ans>")] * len(c))
    assert not any(r.success for r in bad)


def _pool():
    trajs, spans = zip(*(arith.messages_to_tokens(arith.solved_messages(p))
                         for p in arith.make_problems(1, 3)))
    return P.make_pool(P.build_arrays(trajs, spans, [1, 1, 1]),
                       {"content_hash": "sha256:x", "tokenizer": {"vocab_size": 24}})


def _scores(pool, k=3, shorten=None):
    rng = np.random.default_rng(0)
    out = []
    for i, t in enumerate(pool.trajectories()):
        n = len(t) - 1 - (1 if i == shorten else 0)
        lp = np.log(rng.dirichlet(np.ones(24), size=n))
        ids = np.argsort(-lp, -1)[:, :k]
        top = np.take_along_axis(lp, ids, -1)
        out.append({"logp_actual": lp[np.arange(n), t[1:n + 1]], "topk_ids": ids,
                    "topk_logp": top, "tail_mass": 1 - np.exp(top).sum(-1)})
    return out


def test_teacher_table_alignment_and_mismatch():
    pool = _pool()
    seqs = _scores(pool)
    table = TT.from_sequences(pool, seqs)
    TT.check_against_pool(table, pool)
    # entry i of sequence s predicts token i + 1 → table row offsets[s] + i + 1
    s, i = 1, 4
    j = int(pool.traj_offsets[s]) + i + 1
    np.testing.assert_array_equal(table.topk_ids[j], seqs[s]["topk_ids"][i])
    g = table.gather(np.array([[j, -1]]))
    np.testing.assert_allclose(g["topk_logp"][0, 0], seqs[s]["topk_logp"][i], rtol=1e-6)
    assert g["tail_mass"][0, 1] == 1.0
    with pytest.raises(TT.TeacherLogitsMismatch, match="sequence 2.*do not match the pool"):
        TT.from_sequences(pool, _scores(pool, shorten=2), "store")
    with pytest.raises(TT.TeacherLogitsMismatch, match="2 scored sequences"):
        TT.from_sequences(pool, seqs[:2], "store")
    other = TT.TeacherTable(table.topk_ids, table.topk_logp, table.tail_mass,
                            table.logp_actual, meta={"pool_content_hash": "sha256:other"})
    with pytest.raises(TT.TeacherLogitsMismatch, match="exported for pool"):
        TT.check_against_pool(other, pool)
    # logits of other token sequences: actual log-probs disagree with their top-k entries
    shifted = TT.from_sequences(pool, [dict(d, logp_actual=d["logp_actual"] - 1.0)
                                       for d in seqs])
    assert (shifted.topk_ids == np.asarray(pool.tokens)[:, None]).any()
    with pytest.raises(TT.TeacherLogitsMismatch, match="do not match the pool tokens"):
        TT.check_against_pool(shifted, pool)
