"""Benchmark JSONL schemas: valid rows per benchmark, and errors naming file, line and field."""
import json

import pytest

from prada_jax.traces.datasets import DatasetError, load_problems


def _write(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_gsm8k(tmp_path):
    p = _write(tmp_path, [{"question": "q1", "answer": "3 + 4 = 7\n#### 7"}, "",
                          {"question": "q2", "answer": "#### 1,250", "extra": 1}])
    probs = load_problems(p, "gsm8k")
    assert [(x.index, x.question, x.answer, x.kind) for x in probs] == [
        (0, "q1", "7", "math"), (1, "q2", "1250", "math")]
    assert len(load_problems(p, "gsm8k", limit=1)) == 1


def test_gaokao(tmp_path):
    p = _write(tmp_path, [{"question": "q", "answer": "\\frac{1}{2}"}, {"question": "r", "answer": 3}])
    assert [x.answer for x in load_problems(p, "gaokao2023en")] == ["\\frac{1}{2}", "3"]


def test_mmlu_stem(tmp_path):
    p = _write(tmp_path, [{"question": "Pick", "choices": ["x", "y", "z", "w"], "answer": 2},
                          {"question": "Pick", "choices": ["x", "y"], "answer": "B"}])
    probs = load_problems(p, "mmlu_stem")
    assert [x.answer for x in probs] == ["C", "B"]
    assert probs[0].question == "Pick\nAnswer Choices: (A) x (B) y (C) z (D) w"
    assert probs[0].kind == "choice"


BAD = [
    ("gsm8k", {"question": "q", "answer": "7"}, ":1: field 'answer'.*####"),
    ("gsm8k", {"answer": "#### 7"}, ":1: field 'question': missing"),
    ("gsm8k", {"question": "", "answer": "#### 7"}, "field 'question'"),
    ("gaokao2023en", {"question": "q"}, "field 'answer': missing"),
    ("gaokao2023en", {"question": "q", "answer": [1]}, "field 'answer'"),
    ("mmlu_stem", {"question": "q", "choices": ["a", "b"], "answer": 5}, "field 'answer'.*range"),
    ("mmlu_stem", {"question": "q", "choices": "ab", "answer": 0}, "field 'choices'"),
    ("mmlu_stem", {"question": "q", "choices": ["a", "b"], "answer": True}, "field 'answer'"),
    ("gsm8k", "{not json", ":1: field '<line>': not valid JSON"),
    ("gsm8k", "[1, 2]", "must be a JSON object"),
]


@pytest.mark.parametrize("bench,row,pattern", BAD, ids=[f"{b}-{i}" for i, (b, *_ ) in enumerate(BAD)])
def test_bad_rows_name_file_line_field(tmp_path, bench, row, pattern):
    p = _write(tmp_path, [row])
    with pytest.raises(DatasetError, match=pattern) as e:
        load_problems(p, bench)
    assert str(p) in str(e.value)


def test_bad_benchmark_and_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="unknown benchmark"):
        load_problems(_write(tmp_path, [{"question": "q", "answer": "1"}]), "math500")
    with pytest.raises(DatasetError, match="not found"):
        load_problems(tmp_path / "nope.jsonl", "gsm8k")
