"""Input JSONL schemas of the benchmarks the real trace builder reads (one problem per line).

==============  ==============================================================================
benchmark       fields of each line
==============  ==============================================================================
gsm8k           ``question`` (str), ``answer`` (str: the worked solution, final value after
                ``####``, as in the original release)
gaokao2023en    ``question`` (str), ``answer`` (str or number: the final answer)
mmlu_stem       ``question`` (str), ``choices`` (list of 2–5 str), ``answer`` (int index into
                ``choices``, 0-based; a letter A–E is accepted too)
==============  ==============================================================================

Extra fields are ignored. A line that does not fit raises ``DatasetError`` naming the file,
the line number and the field.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from prada_jax.errors import BadInput

BENCHMARKS = ("gsm8k", "gaokao2023en", "mmlu_stem")
LETTERS = "ABCDE"


class DatasetError(BadInput):
    """A data file line that does not fit its benchmark's schema."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    Attributes:
      index: 0-based line index among the problems of the file (the trace ``answer_id``).
      question: the text shown to the models (for multiple choice: with the lettered options).
      answer: the reference final answer (multiple choice: a letter A–E).
      kind: ``math`` or ``choice`` (how answers are extracted and compared).
    """
    index: int
    question: str
    answer: str
    kind: str


def _err(path, line_no, field, msg):
    return DatasetError(f"{path}:{line_no}: field '{field}': {msg}")


def _str_field(row, field, path, line_no):
    if field not in row:
        raise _err(path, line_no, field, "missing")
    v = row[field]
    if not isinstance(v, str) or not v.strip():
        raise _err(path, line_no, field, f"must be a non-empty string, got {type(v).__name__}")
    return v


def format_choices(question: str, choices: list[str]) -> str:
    """Question text with lettered options, in the style of the Qwen2.5-Math evaluation."""
    opts = " ".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))
    return f"{question.strip()}\nAnswer Choices: {opts}"


def parse_row(row: dict, benchmark: str, index: int, path: str = "<row>", line_no: int = 0
              ) -> Problem:
    """Converts one decoded JSON object into a ``Problem``; raises ``DatasetError``."""
    if not isinstance(row, dict):
        raise _err(path, line_no, "<line>", "must be a JSON object")
    if benchmark == "gsm8k":
        q = _str_field(row, "question", path, line_no)
        a = _str_field(row, "answer", path, line_no)
        if "####" not in a:
            raise _err(path, line_no, "answer", "gsm8k answers need the final value after '####'")
        final = a.rsplit("####", 1)[1].strip().replace(",", "")
        if not final:
            raise _err(path, line_no, "answer", "nothing after '####'")
        return Problem(index, q, final, "math")
    if benchmark == "gaokao2023en":
        q = _str_field(row, "question", path, line_no)
        if "answer" not in row:
            raise _err(path, line_no, "answer", "missing")
        a = row["answer"]
        if isinstance(a, bool) or not isinstance(a, (str, int, float)) or str(a).strip() == "":
            raise _err(path, line_no, "answer", "must be a non-empty string or a number")
        return Problem(index, q, str(a).strip(), "math")
    if benchmark == "mmlu_stem":
        q = _str_field(row, "question", path, line_no)
        ch = row.get("choices")
        if ch is None:
            raise _err(path, line_no, "choices", "missing")
        if (not isinstance(ch, list) or not 2 <= len(ch) <= len(LETTERS)
                or not all(isinstance(c, str) for c in ch)):
            raise _err(path, line_no, "choices", f"must be a list of 2-{len(LETTERS)} strings")
        if "answer" not in row:
            raise _err(path, line_no, "answer", "missing")
        a = row["answer"]
        if isinstance(a, str) and len(a.strip()) == 1 and a.strip().upper() in LETTERS:
            idx = LETTERS.index(a.strip().upper())
        elif isinstance(a, int) and not isinstance(a, bool):
            idx = a
        else:
            raise _err(path, line_no, "answer", f"must be a choice index or letter, got {a!r}")
        if not 0 <= idx < len(ch):
            raise _err(path, line_no, "answer", f"index {idx} out of range for {len(ch)} choices")
        return Problem(index, format_choices(q, ch), LETTERS[idx], "choice")
    raise DatasetError(f"unknown benchmark {benchmark!r}; expected one of {', '.join(BENCHMARKS)}")


def load_problems(path: os.PathLike | str, benchmark: str, limit: int | None = None
                  ) -> list[Problem]:
    """Reads a benchmark JSONL file (blank lines skipped); at most ``limit`` problems."""
    if benchmark not in BENCHMARKS:
        raise DatasetError(f"unknown benchmark {benchmark!r}; expected one of "
                           f"{', '.join(BENCHMARKS)}")
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: data file not found")
    problems: list[Problem] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if limit is not None and len(problems) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _err(path, line_no, "<line>", f"not valid JSON ({e.msg})") from None
            except (RecursionError, ValueError):
                raise _err(path, line_no, "<line>", "not valid JSON (nested too deeply)"
                           ) from None
            problems.append(parse_row(row, benchmark, len(problems), str(path), line_no))
    if not problems:
        raise DatasetError(f"{path}: no problems")
    return problems


