"""Multi-step arithmetic with a calculator tool: problems, tokenizer, tool executor, episodes.

An episode (all synthetic, deterministic from a seed):

    user:      <q>12*7+5-3</q>          operands combined strictly left to right
    assistant: <calc>12*7</calc>        agent turn t = 0 (turns are counted from 0)
    tool:      <res>84</res>            the calculator's reply
    assistant: <calc>84+5</calc>        t = 1: must reuse the previous result
    tool:      <res>89</res>
    assistant: <calc>89-3</calc>        t = 2
    tool:      <res>86</res>
    assistant: <ans>86</ans>            t = 3: final answer; success iff it equals the value

A problem with n operands has n agent turns (n - 1 calculator calls + the answer). The agent
must copy numbers from the question and from earlier tool replies, so later turns depend on
the whole history. The calculator evaluates any expression of non-negative integers and
``+ - *`` (usual precedence) and answers ``<res><err></res>`` to anything else. Every tool call
increments :data:`TOOL_CALLS`, so a trainer can prove it made none.

Tokens: one id per character or tag (:data:`VOCAB`, 24 ids). ``build_tokenizer`` wraps the
same vocabulary into a ``PreTrainedTokenizerFast`` with a chat template that concatenates the
message contents, so the generic JSONL converter reproduces :func:`encode` exactly.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from prada_jax.distill.task import common
from prada_jax.distill.task.common import EpisodeResult, GenerateFn, ToolCounter

VOCAB: tuple[str, ...] = (
    "<pad>", "<eos>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "-", "*",
    "<q>", "</q>", "<calc>", "</calc>", "<res>", "</res>", "<ans>", "</ans>", "<err>",
)
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
PAD_ID = TOKEN_ID["<pad>"]
EOS_ID = TOKEN_ID["<eos>"]
CALC_END_ID = TOKEN_ID["</calc>"]
ANS_END_ID = TOKEN_ID["</ans>"]
STOP_IDS = (CALC_END_ID, ANS_END_ID)
TASK_NAME = "arith_calc_v1"
CHAT_TEMPLATE = common.CHAT_TEMPLATE
_EXPR_RE = re.compile(r"^[0-9]+([+\-*][0-9]+)*$")


TOOL_CALLS = ToolCounter()  # calculator calls


def encode(text: str) -> list[int]:
    """Text -> token ids. Raises ValueError naming an unknown symbol."""
    return common.encode(text, TOKEN_ID, "arithmetic")


def decode(ids: Sequence[int]) -> str:
    return common.decode(ids, VOCAB)


@dataclass(frozen=True)
class Problem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def question(self) -> str:
        s = str(self.operands[0])
        for op, x in zip(self.ops, self.operands[1:]):
            s += op + str(x)
        return f"<q>{s}</q>"

    def partials(self) -> list[int]:
        """Left-to-right partial results after each operation."""
        acc, out = self.operands[0], []
        for op, x in zip(self.ops, self.operands[1:]):
            acc = _apply(acc, op, x)
            out.append(acc)
        return out

    @property
    def answer(self) -> int:
        return self.partials()[-1]


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


SPLITS = ("train", "eval", "heldout")


def split_of(question: str) -> str:
    """The split a problem belongs to, by its text (``Problem.question``): CRC-32 of the text
    mod 10 is 0 → ``"eval"``, 1 → ``"heldout"``, else ``"train"``. The problem space is small
    (two-operand problems repeat among a few thousand draws), so disjoint seeds alone do not
    keep evaluation problems out of the training pool; a split by text does, for any seed and
    size."""
    bucket = zlib.crc32(question.encode()) % 10
    return "eval" if bucket == 0 else "heldout" if bucket == 1 else "train"


def make_problems(seed: int, n: int, min_operands: int = 2, max_operands: int = 4,
                  max_operand: int = 20, max_value: int = 999,
                  split: str | None = None) -> list[Problem]:
    """``n`` random problems, deterministic from ``seed``; every partial result stays in
    ``[0, max_value]``. ``split`` (one of :data:`SPLITS`) keeps only problems of that split
    (:func:`split_of`): the teacher's training set and the pool use ``"train"``, the evaluation
    ``"eval"``, the held-out diagnostic pool ``"heldout"``, so no evaluated or held-out problem
    text is ever trained on. ``None``: every problem."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        k = int(rng.integers(min_operands, max_operands + 1))
        xs = [int(rng.integers(1, max_operand + 1))]
        ops = []
        acc = xs[0]
        ok = True
        for _ in range(k - 1):
            op = "+-*"[int(rng.integers(0, 3))]
            x = int(rng.integers(1, (9 if op == "*" else max_operand) + 1))
            nxt = _apply(acc, op, x)
            if not 0 <= nxt <= max_value:
                ok = False
                break
            xs.append(x)
            ops.append(op)
            acc = nxt
        if ok:
            p = Problem(tuple(xs), tuple(ops))
            if split is None or split_of(p.question) == split:
                out.append(p)
    return out


def calculator(expr: str) -> str:
    """The tool: evaluates ``expr`` (integers, ``+ - *``, usual precedence) and returns the
    environment reply ``<res>value</res>`` or ``<res><err></res>``. Counts the call."""
    TOOL_CALLS.calls += 1
    if not _EXPR_RE.match(expr) or len(expr) > 32:
        return "<res><err></res>"
    terms = re.split(r"([+\-])", expr)
    total, sign = 0, 1
    for piece in terms:
        if piece in "+-" and piece:
            sign = 1 if piece == "+" else -1
            continue
        prod = 1
        for f in piece.split("*"):
            prod *= int(f)
        total += sign * prod
    return f"<res>{total}</res>"


def solved_messages(p: Problem) -> list[dict]:
    """The reference (optimal) chat for a problem: user, then assistant/tool alternating."""
    msgs = [{"role": "user", "content": p.question}]
    acc = p.operands[0]
    for op, x in zip(p.ops, p.operands[1:]):
        expr = f"{acc}{op}{x}"
        msgs.append({"role": "assistant", "content": f"<calc>{expr}</calc>"})
        reply = calculator(expr)
        msgs.append({"role": "tool", "content": reply})
        acc = _apply(acc, op, x)
    msgs.append({"role": "assistant", "content": f"<ans>{acc}</ans>"})
    return msgs


def messages_to_tokens(messages: Sequence[dict]) -> tuple[list[int], list[tuple[int, int]]]:
    """Tokens and agent-turn spans (end exclusive) of a chat, without a tokenizer object."""
    return common.messages_to_tokens(messages, encode)


def parse_action(ids: Sequence[int]) -> tuple[str, str]:
    """Generated action tokens -> (kind, payload); kind is "calc", "ans" or "bad"."""
    return common.parse_action(decode(ids), "calc")


def run_episodes(problems: Sequence[Problem], generate_fn: GenerateFn, max_turns: int = 6,
                 tool_delay_s: float = 0.0) -> list[EpisodeResult]:
    """Runs the task with an agent and the calculator tool, all problems batched per turn.

    An episode ends at an ``<ans>`` action (success iff the answer equals the problem's value),
    at a malformed action, or after ``max_turns`` agent turns (failure). ``tool_delay_s`` [s]:
    simulated latency per turn round with a calculator call (:func:`..common.run_episodes`).
    """
    return common.run_episodes(
        problems, generate_fn, max_turns, encode_fn=encode, decode_fn=decode,
        parse_fn=parse_action, tool_kind="calc", tool=lambda p, payload: calculator(payload),
        answer_ok=lambda p, payload: payload == str(p.answer), tool_delay_s=tool_delay_s)


def max_episode_tokens(max_operands: int = 4, max_value: int = 999) -> int:
    """Upper bound on the tokens of a solved episode (for static shapes)."""
    d = len(str(max_value))
    q = 2 + max_operands * d + (max_operands - 1)
    calc = 2 + 2 * d + 1
    res = 2 + d
    return q + (max_operands - 1) * (calc + res) + (2 + d)


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`VOCAB` with the task's chat template."""
    return common.build_tokenizer(TOKEN_ID, TASK_NAME)
