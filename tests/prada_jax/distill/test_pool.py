"""Pool format: round trip, validator errors naming file/field, JSONL converter."""
import json

import numpy as np
import pytest

from prada_jax.distill import pool as P
from prada_jax.distill.task import arith

TOK_META = {"name": "t", "vocab_size": 50, "fingerprint": "x"}


def _arrays():
    trajs = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]]
    spans = [[(1, 3), (4, 6)], [(2, 4)]]
    return P.build_arrays(trajs, spans, [1, 0])


def test_round_trip(tmp_path):
    arr = _arrays()
    P.save_pool(arr, tmp_path / "p", {"task": "toy", "tokenizer": TOK_META})
    pool = P.load_pool(tmp_path / "p")
    for k in P.FIELDS:
        np.testing.assert_array_equal(getattr(pool, k), arr[k])
    assert pool.meta["counts"] == {"tokens": 10, "trajectories": 2, "turns": 3}
    np.testing.assert_array_equal(pool.action_mask, [0, 1, 1, 0, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(pool.trajectory(1), [7, 8, 9, 10])
    assert pool.meta["content_hash"].startswith("sha256:")


@pytest.mark.parametrize("field,mutate,msg", [
    ("action_mask", lambda a: a.update(action_mask=a["action_mask"][:-1]), "does not fit"),
    ("action_mask", lambda a: a["action_mask"].__setitem__(0, 1), "does not fit the turn"),
    ("turn_offsets", lambda a: a.update(turn_offsets=np.array([0, 2, 2], np.int64),
                                        turn_starts=a["turn_starts"][:2],
                                        turn_ends=a["turn_ends"][:2],
                                        action_mask=np.r_[a["action_mask"][:6],
                                                          np.zeros(4, np.uint8)]),
     "no agent turns"),
    ("turn_starts", lambda a: a["turn_starts"].__setitem__(2, 5), "outside its trajectory"),
    ("tokens", lambda a: a["tokens"].__setitem__(0, 99), "ids must lie"),
    ("tokens", lambda a: a.update(tokens=a["tokens"].astype(np.int64)), "dtype"),
], ids=["mask-length", "mask-content", "no-agent-turn", "turn-outside", "token-range", "dtype"])
def test_validator_names_file_and_field(tmp_path, field, mutate, msg):
    arr = _arrays()
    mutate(arr)
    with pytest.raises(P.PoolFormatError) as e:
        P.save_pool(arr, tmp_path / "p", {"task": "toy", "tokenizer": TOK_META})
    assert field in str(e.value) and msg in str(e.value)
    assert P.POOL_FILE in str(e.value)


def test_load_refuses_tampered_file(tmp_path):
    from safetensors.numpy import save_file
    out = P.save_pool(_arrays(), tmp_path / "p", {"task": "toy", "tokenizer": TOK_META})
    bad = _arrays()
    bad["action_mask"] = bad["action_mask"][:-2]
    save_file(bad, str(out / P.POOL_FILE))
    with pytest.raises(P.PoolFormatError, match="content_hash"):
        P.load_pool(out)
    with pytest.raises(P.PoolFormatError, match=r"pool.safetensors.*action_mask.*does not fit"):
        P.load_pool(out, check_hash=False)
    meta = json.loads((out / P.META_FILE).read_text())
    del meta["tokenizer"]
    (out / P.META_FILE).write_text(json.dumps(meta))
    with pytest.raises(P.PoolFormatError, match=r"pool.json.*tokenizer"):
        P.load_pool(out)


def test_convert_jsonl_matches_direct_tokenisation(tmp_path):
    tok = arith.build_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    problems = arith.make_problems(0, 4)
    lines = [{"messages": arith.solved_messages(p), "success": 1} for p in problems]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    import importlib
    pool_cli = importlib.import_module("prada_jax.distill.pool.__main__")
    assert pool_cli.main(["convert", "--jsonl", str(tmp_path / "d.jsonl"), "--tokenizer",
                   str(tmp_path / "tok"), "--out", str(tmp_path / "p"), "--task", "a"]) == 0
    pool = P.load_pool(tmp_path / "p")
    for i, p in enumerate(problems):
        toks, spans = arith.messages_to_tokens(arith.solved_messages(p))
        np.testing.assert_array_equal(pool.trajectory(i), toks)
        a, b = pool.turn_offsets[i], pool.turn_offsets[i + 1]
        got = [(s - pool.traj_offsets[i], e - pool.traj_offsets[i])
               for s, e in zip(pool.turn_starts[a:b], pool.turn_ends[a:b])]
        assert got == spans
        # every agent turn decodes to a tool call or an answer
        for s, e in zip(pool.turn_starts[a:b], pool.turn_ends[a:b]):
            assert arith.parse_action(pool.tokens[s:e])[0] in ("calc", "ans")
    # a conversation with no assistant message is refused, naming the line
    (tmp_path / "bad.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "<q>1+2</q>"}]}) + "\n")
    with pytest.raises(P.PoolFormatError, match=r"bad.jsonl:1.*no assistant"):
        P.convert_jsonl(tmp_path / "bad.jsonl", tok, tmp_path / "p2")


def test_convert_with_role_headers(tmp_path):
    """A template with role headers: only assistant content + end tag are actions."""
    tok = arith.build_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<eos>"
                         "{% endif %}{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<eos>{% endif %}")
    msgs = arith.solved_messages(arith.make_problems(1, 1)[0])
    toks, spans = P.tokenize_conversation(tok, msgs)
    for s, e in spans:
        assert toks[s - 1] == arith.EOS_ID  # the header belongs to the prompt
        assert arith.parse_action(toks[s:e])[0] in ("calc", "ans")
