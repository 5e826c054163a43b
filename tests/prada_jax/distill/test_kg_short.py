"""kg_short_v1 and its error-and-recovery teacher data (issue 44, item 2): 3-7 reference turns,
injected errors that the tool really answers and that are followed by the correct call, the
injected turn left out of the loss, the injection rate honoured, the registry entry."""
import numpy as np
import pytest

from prada_jax.distill import task_registry as tasks
from prada_jax.distill.task import kg, kg_short


def _assistant(msgs):
    return [m["content"] for m in msgs if m["role"] == "assistant"]


def test_problems_have_three_to_seven_reference_turns():
    turns = {p.num_turns for p in kg_short.make_problems(5, 300)}
    assert turns == {3, 4, 5, 6, 7}


def test_no_injection_is_a_solved_reference_chat():
    rng = np.random.default_rng(0)
    for p in kg_short.make_problems(7, 50):
        msgs, bad = kg_short.recovery_messages(p, rng, 0.0)
        assert bad is None
        assert len(_assistant(msgs)) == p.num_turns
        assert kg.replay(p, msgs) == (True, True)


def test_every_injection_is_answered_by_the_tool_and_followed_by_the_correct_call():
    rng = np.random.default_rng(1)
    kinds = set()
    for p in kg_short.make_problems(8, 120):
        calls0 = kg.TOOL_CALLS.calls
        msgs, bad = kg_short.recovery_messages(p, rng, 1.0)
        assert kg.TOOL_CALLS.calls == calls0    # building training data is not a tool call
        acts = _assistant(msgs)
        assert bad is not None and len(acts) == p.num_turns + 1
        # replies are the tool's own and the episode still succeeds
        assert kg.replay(p, msgs) == (True, True)
        wrong, right = acts[bad], acts[bad + 1]
        # the correct call is the reference call of that position (either argument order)
        ref = _assistant(kg.solved_messages(p))[bad]
        flip = "<call>" + ref[7] + ref[6] + "</call>"
        assert right in (ref, flip) and wrong not in (ref, flip)
        reply = msgs[2 * bad + 2]["content"]
        kinds.add("malformed" if reply == kg.ERR_REPLY else "valid")
        # the supervised actions (all but the injected one) equal the reference chat's
        assert [a for i, a in enumerate(acts) if i != bad][-1] == kg.answer_text(p)
    assert kinds == {"malformed", "valid"}


def test_training_episodes_leave_the_injected_turn_out_of_the_loss():
    seqs, spans, info = kg_short.training_episodes(11, 400, 0.5)
    probs = kg_short.make_problems(11, 400)
    assert info["episodes"] == 400 and 160 <= info["injected"] <= 240   # Binomial(400, 0.5)
    n_short = 0
    for toks, sp, p in zip(seqs, spans, probs):
        n_total = sum(1 for i in range(len(toks)) if toks[i] == kg.TOKEN_ID["<call>"]
                      or toks[i] == kg.TOKEN_ID["<ans>"])
        assert len(sp) in (n_total, n_total - 1) and len(sp) == p.num_turns
        n_short += len(sp) == n_total - 1
        for a, e in sp:           # every supervised span is a well-formed correct action
            text = kg.decode(toks[a:e])
            assert text.startswith(("<call>", "<ans>"))
            if text.startswith("<call>"):
                assert kg.lookup(p, text[6:-7]) != kg.ERR_REPLY
    assert n_short == info["injected"]
    # deterministic from the seed
    again = kg_short.training_episodes(11, 400, 0.5)
    assert again[0] == seqs and again[1] == spans


def test_bad_inputs():
    rng = np.random.default_rng(0)
    p = kg_short.make_problems(1, 1)[0]
    with pytest.raises(ValueError, match="inject_rate"):
        kg_short.recovery_messages(p, rng, 1.5)
    with pytest.raises(ValueError, match="error kind"):
        kg_short.wrong_call(0, "a", "typo", rng)


def test_registered_task_plays_an_oracle_to_success_within_its_cap():
    t = tasks.get(kg_short.TASK_NAME)
    assert t.max_turns == kg_short.MAX_TURNS == 10 and t.name == "kg_short_v1"
    probs = kg_short.make_problems(3, 16)
    refs = {p.question: _assistant(kg.solved_messages(p)) for p in probs}

    def oracle(contexts):   # the reference action of the turn a context is at
        out = []
        for ctx in contexts:
            text = kg.decode(ctx)
            acts = refs[text[:text.index("</q>") + 4]]
            out.append(kg.encode(acts[text.count("<call>") + text.count("<ans>")]))
        return out

    res = t.run_episodes(probs, oracle)
    assert all(r.success for r in res)
