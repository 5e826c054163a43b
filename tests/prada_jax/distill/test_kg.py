"""The knowledge-graph lookup task (``kg_lookup_v1``): the tool against a plain-Python
reference on generated graphs (every hop, distractor relations, both call forms, malformed
calls), episodes driven by a reference agent that reads only its context, token round trips,
recorded pools replayed through the tool, the registry entry, and a smoke distillation run
that makes no tool call."""
import json
import re

import numpy as np
import pytest

from prada_jax.distill import pool as P
from prada_jax.distill import task_registry as tasks
from prada_jax.distill.task import kg
from prada_jax.distill.task.kg_teacher import save_episodes

_Q = re.compile(r"<q>([A-P])([a-d]*)([xy]);([A-P])([a-d]*)([xy])<(max|min)></q>")


def _ref_graph(p):
    """The problem's graph as a plain dict: (entity letter, relation letter) -> reply text."""
    g = {}
    for i, e in enumerate("ABCDEFGHIJKLMNOP"):
        for j, r in enumerate("abcd"):
            g[e, r] = "ABCDEFGHIJKLMNOP"[p.links[i][j]]
        for j, r in enumerate("xy"):
            g[e, r] = str(p.attrs[i][j])
    return g


def _ref_answer(question, g):
    """Walks both chains of the question text through the dict graph; returns
    (answer, entities visited per chain)."""
    s1, p1, a1, s2, p2, a2, op = _Q.fullmatch(question).groups()
    vals, visited = [], []
    for start, path, attr in ((s1, p1, a1), (s2, p2, a2)):
        e, seen = start, [start]
        for r in path:
            e = g[e, r]
            seen.append(e)
        vals.append(int(g[e, attr]))
        visited.append(seen)
    return (max(vals) if op == "max" else min(vals)), visited


def _agent(first="entity"):
    """A plain-Python agent that reads only its context (question and tool replies); call forms
    alternate starting with ``first``."""
    def act(ctx):
        text = kg.decode(ctx)
        s1, p1, a1, s2, p2, a2, op = _Q.match(text).groups()
        replies = re.findall(r"<res>(.*?)</res>", text)
        plan = [(s1, r) for r in p1 + a1] + [(s2, r) for r in p2 + a2]
        n = len(replies)
        if n < len(plan):
            chain_start = n == 0 or n == len(p1) + 1
            e = plan[n][0] if chain_start else replies[-1]
            r = plan[n][1]
            rel_first = (n % 2 == 1) == (first == "entity")
            return kg.encode(f"<call>{r + e if rel_first else e + r}</call>")
        v = [int(replies[len(p1)]), int(replies[-1])]
        res = max(v) if op == "max" else min(v)
        a, b = v if first == "entity" else v[::-1]
        return kg.encode(f"<ans>{a}<{op}>{b}={res}</ans>")
    return lambda contexts: [act(c) for c in contexts]


def test_graphs_and_tool_against_reference():
    probs = kg.make_problems(11, 200)
    hops = set()
    for p in probs:
        g = _ref_graph(p)
        assert all(g[e, r] != e for e in "ABCDEFGHIJKLMNOP" for r in "abcd")  # no self-loops
        assert all(0 <= int(g[e, r]) <= 9 for e in "ABCDEFGHIJKLMNOP" for r in "xy")
        # every (entity, relation), both argument orders
        for (e, r), want in g.items():
            assert kg.lookup(p, e + r) == kg.lookup(p, r + e) == f"<res>{want}</res>"
        ans, visited = _ref_answer(p.question, g)
        assert ans == p.answer
        assert [[kg.ENTITIES[i] for i in p.chain_entities(k)] for k in (0, 1)] == visited
        assert p.num_turns == len(visited[0]) + len(visited[1]) + 1
        hops.update(len(v) - 1 for v in visited)
    assert hops == {1, 2, 3, 4}
    # distractor relations: a wrong first relation changes the answer in most problems
    changed = 0
    for p in probs:
        g = _ref_graph(p)
        q = p.question
        wrong = "abcd"[("abcd".index(q[4]) + 1) % 4]
        changed += _ref_answer(q[:4] + wrong + q[5:], g)[0] != p.answer
    assert changed > 0.3 * len(probs)


@pytest.mark.parametrize("payload", ["", "A", "a", "x", "AB", "ab", "xy", "Aab", "AaB", "Aa ",
                                     "A;", "1A", "A12", "<err>", "Za", "aa", "AA"])
def test_malformed_calls_rejected(payload):
    p = kg.make_problems(0, 1)[0]
    before = kg.TOOL_CALLS.calls
    assert kg.lookup(p, payload) == kg.ERR_REPLY
    assert kg.TOOL_CALLS.calls == before + 1


def test_episodes_with_reference_agent_both_forms_and_failures():
    probs = kg.make_problems(5, 64)
    for first in ("entity", "relation"):
        res = kg.run_episodes(probs, _agent(first))
        assert all(r.success for r in res)
        assert [r.turns for r in res] == [p.num_turns for p in probs]
        assert [r.tool_calls for r in res] == [p.num_turns - 1 for p in probs]
        assert max(r.turns for r in res) == 11 and min(r.turns for r in res) == 5
    # an early mistake: wrong entity in the first call -> the observations differ and the
    # answer is wrong for most problems
    good = _agent()

    def wrong_first(contexts):
        out = good(contexts)
        return [kg.encode("<call>" + ("B" if kg.decode(c)[3] != "B" else "C")
                          + kg.decode(c)[4] + "</call>")
                if "<res>" not in kg.decode(c) else o for c, o in zip(contexts, out)]
    res = kg.run_episodes(probs, wrong_first)
    ref = kg.run_episodes(probs, good)
    assert np.mean([r.messages[2] != q.messages[2] for r, q in zip(res, ref)]) > 0.8
    assert np.mean([r.success for r in res]) < 0.75
    # a malformed call gets <err> and the episode goes on; a non-call, non-answer ends it
    res = kg.run_episodes(probs[:2], lambda cs: [kg.encode("<call>AB</call>")] * len(cs),
                          max_turns=3)
    assert [r.turns for r in res] == [3, 3] and not any(r.success for r in res)
    assert res[0].messages[2]["content"] == kg.ERR_REPLY
    res = kg.run_episodes(probs[:2], lambda cs: [kg.encode("<res>A</res>")] * len(cs))
    assert [r.turns for r in res] == [1, 1] and not any(r.success for r in res)
    p = next(q for q in probs if q.values()[0] != q.values()[1])
    (v1, v2), op, ans = p.values(), kg.OPS[p.op], p.answer
    other = kg.OPS[1 - p.op]
    for act, ok in ((f"<ans>{v1}{op}{v2}={ans}</ans>", True),
                    (f"<ans>{v2}{op}{v1}={ans}</ans>", True),
                    (f"<ans>{ans}</ans>", False),                     # a bare result
                    (f"<ans>{v1}{op}{v2}={(ans + 1) % 10}</ans>", False),
                    (f"<ans>{v1}{other}{v2}={ans}</ans>", False),
                    (f"<ans>{(v1 + 1) % 10}{op}{v2}={ans}</ans>", False),
                    (f"<ans>{v1}{op}{v2}={ans}={ans}</ans>", False)):
        res = kg.run_episodes([p], lambda cs: [kg.encode(act)])
        assert res[0].turns == 1 and res[0].success == ok, act


def test_encode_decode_round_trip_and_hf_tokenizer():
    rng = np.random.default_rng(0)
    tok = kg.build_tokenizer()
    assert tok.vocab_size == len(kg.VOCAB) == 47
    longest = 0
    for p in kg.make_problems(2, 50):
        msgs = kg.solved_messages(p, rng)
        ids, spans = kg.messages_to_tokens(msgs)
        text = "".join(m["content"] for m in msgs)
        assert kg.decode(ids) == text and kg.encode(text) == ids
        assert kg.tokens_to_messages(ids, spans) == msgs
        assert tok.apply_chat_template(msgs, tokenize=False) == text
        assert tok(text, add_special_tokens=False)["input_ids"] == ids
        assert max(e - a for a, e in spans) <= kg.MAX_ACTION_TOKENS
        longest = max(longest, len(ids))
    assert longest <= kg.max_episode_tokens()
    # both forms occur in the reference chats drawn from a generator
    acts = [m["content"] for p in kg.make_problems(3, 20) for m in kg.solved_messages(p, rng)
            if m["content"].startswith("<call>")]
    assert any(a[6] in kg.ENTITIES for a in acts) and any(a[6] in "abcdxy" for a in acts)
    with pytest.raises(ValueError, match="'Z'"):
        kg.encode("<q>Z</q>")


def _replay_pool(pool, problems):
    """(consistent, success) of every pool trajectory replayed through the tool."""
    out = []
    for i in range(len(problems)):
        a, b = pool.traj_offsets[i], pool.traj_offsets[i + 1]
        ta, tb = pool.turn_offsets[i], pool.turn_offsets[i + 1]
        spans = [(int(s) - a, int(e) - a) for s, e in zip(pool.turn_starts[ta:tb],
                                                          pool.turn_ends[ta:tb])]
        msgs = kg.tokens_to_messages(pool.tokens[a:b].tolist(), spans)
        assert msgs[0]["content"] == problems[i].question
        out.append(kg.replay(problems[i], msgs))
    return out


def test_recorded_pool_replays_through_the_tool(tmp_path):
    probs = kg.make_problems(7, 24)
    res = kg.run_episodes(probs, _agent("relation"))
    pool = save_episodes(res, tmp_path / "pool", tmp_path / "pool.jsonl")
    assert pool.meta["task"] == kg.TASK_NAME
    valid = P.validate_pool(tmp_path / "pool")   # reloaded with the hash check: same arrays
    np.testing.assert_array_equal(np.asarray(valid.tokens), np.asarray(pool.tokens))
    assert valid.meta["content_hash"] == pool.meta["content_hash"]
    assert pool.success.tolist() == [1] * 24
    assert all(c and s for c, s in _replay_pool(pool, probs))
    lines = [json.loads(x) for x in (tmp_path / "pool.jsonl").read_text().splitlines()]
    assert [x["messages"] for x in lines] == [r.messages for r in res]
    # a replay that contradicts the tool is detected
    bad = [dict(m) for m in res[0].messages]
    bad[2]["content"] = "<res>Z</res>"
    assert kg.replay(probs[0], bad) == (False, True)


def test_registry(monkeypatch):
    t = tasks.get("kg_lookup_v1")
    assert (t.name, t.pad_id, t.eos_id, t.stop_ids) == (kg.TASK_NAME, kg.PAD_ID, kg.EOS_ID,
                                                         kg.STOP_IDS)
    assert "kg_lookup_v1" in tasks.names()
    before = t.tool_calls()
    kg.lookup(kg.make_problems(0, 1)[0], "Aa")
    assert t.tool_calls() == before + 1
    # the pool's task routes evaluation to the kg evaluator, on eval.seed's problems
    seen = []
    monkeypatch.setattr(kg, "evaluate_model",
                        lambda model, problems, batch: seen.append((problems, batch)) or {})
    tasks.for_pool({"task": kg.TASK_NAME}).evaluate("model", 3, 2, 16)
    assert seen == [(kg.make_problems(2 * 1000 + 3, 3), 16)]


def test_torch_teacher_pool_and_smoke_distillation(tmp_path):
    """A tiny random PyTorch teacher: sampled pools are reproducible from the seed and replay
    through the tool; its logits export; the trainer runs on the pool with zero tool calls and
    evaluates by running the task with the tool."""
    torch = pytest.importorskip("torch")
    from transformers import Qwen2ForCausalLM

    from prada_jax.distill.trainer import train_and_evaluate
    from prada_jax.distill.task.export_local import export_logits
    from prada_jax.distill.task.kg_teacher import model_config, record_pool
    from prada_jax.configs.distill import get_config

    torch.manual_seed(0)
    teacher = Qwen2ForCausalLM(model_config(16, 1, 2, 1, 32)).eval()
    teacher.save_pretrained(tmp_path / "teacher")
    kg.build_tokenizer().save_pretrained(tmp_path / "teacher")
    probs = kg.make_problems(9, 6)
    p1 = record_pool(teacher, probs, tmp_path / "p1", temperature=1.0, seed=3)
    p2 = record_pool(teacher, probs, tmp_path / "p2", temperature=1.0, seed=3)
    assert p1.meta["content_hash"] == p2.meta["content_hash"]
    assert all(c and s == bool(f) for (c, s), f in zip(_replay_pool(p1, probs), p1.success))
    # the Flax evaluator's port of the teacher folder acts like the PyTorch teacher (greedy)
    from prada_jax.distill.task.kg_teacher import torch_generate_fn
    from prada_jax.lm.hf import load_hf
    flax_teacher, _ = load_hf(tmp_path / "teacher")
    ep_t = kg.run_episodes(probs, torch_generate_fn(teacher), max_turns=4)
    ep_f = kg.run_episodes(probs, kg.flax_generate_fn(flax_teacher, batch=8), max_turns=4)
    assert [r.messages for r in ep_t] == [r.messages for r in ep_f]
    # a trainable pool: reference episodes, logits of the tiny teacher
    save_episodes(kg.run_episodes(kg.make_problems(10, 12), _agent()), tmp_path / "pool")
    export_logits(tmp_path / "teacher", tmp_path / "pool", tmp_path / "logits", top_k=4)
    c = get_config("smoke")
    c.data.cache = str(tmp_path)
    c.eval.n_problems = 4
    res = train_and_evaluate(c, tmp_path / "run")
    assert res["env_calls_during_training"] == 0
    after = res["after"]
    assert after["n"] == 4 and after["success_rate"] * 4 in (0, 1, 2, 3, 4)
    assert after["tool_calls"] + 4 >= 4 * after["mean_turns"]   # every non-final turn calls
    # re-measured independently: the saved student in PyTorch, the teacher's torch decoder,
    # the evaluation problems of eval.seed 0
    from transformers import AutoModelForCausalLM
    pt = AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "student_hf"),
                                              dtype=torch.float32).eval()
    eps = kg.run_episodes(kg.make_problems(3, 4), torch_generate_fn(pt, max_new_tokens=8))
    assert after["success_rate"] == sum(e.success for e in eps) / 4
    assert after["tool_calls"] == sum(e.tool_calls for e in eps)
    assert after["mean_turns"] == pytest.approx(np.mean([e.turns for e in eps]))
    assert (tmp_path / "run" / "student_hf" / "tokenizer.json").is_file()


def test_kg_config_variant_and_pool_default():
    """``:kg`` points the trainer at the kg cache with the task's budget and leaves the method's
    defaults (κ = 0.6, the student) alone; the kg cache records 4096 pool trajectories."""
    from prada_jax.distill.task import kg_teacher
    from prada_jax.configs.distill import get_config
    base, c = get_config(""), get_config("kg")
    assert c.data.cache == "checkpoints/kg_cache/seed0" and c.train.steps == 400
    assert (c.sampler.kappa, c.student.hidden_size, c.train.batch_size) == (
        base.sampler.kappa, base.student.hidden_size, base.train.batch_size)
    plain = get_config("kg,sft,uniform")
    assert (plain.loss.kind, plain.sampler.kappa, plain.train.steps) == ("sft", 1.0, 400)
    assert kg_teacher.DEFAULTS["n_pool"] == 4096
