"""Answer extraction and checking on a table of tricky cases (expected verdicts by hand)."""
import math
import signal
import threading
import time

import pytest

from prada_jax.traces import answers as A

EXTRACT = [
    ("nested braces", r"so \boxed{\frac{1}{2}} done", "math", r"\frac{1}{2}"),
    ("multiple boxed: last", r"\boxed{3} wait, actually \boxed{4}.", "math", "4"),
    ("unclosed last boxed falls back", r"\boxed{7} then \boxed{8", "math", "7"),
    ("boxed without braces", r"The answer is \boxed 12 .", "math", "12"),
    ("fbox", r"\fbox{x+1}", "math", "x+1"),
    ("no boxed: last number", "He has 3 apples and then 1,250 pears.", "math", "1,250"),
    ("no boxed: negative decimal", "the value is -0.75.", "math", "-0.75"),
    ("no answer", "no digits here", "math", None),
    ("choice boxed", r"So the answer is \boxed{C}", "choice", "C"),
    ("choice boxed with text", r"\boxed{\text{(B)}}", "choice", "B"),
    ("choice 'answer is'", "A truck... The answer is (D).", "choice", "D"),
    ("choice last letter", "Option A is wrong, so E", "choice", "E"),
    ("choice none", "no letter here", "choice", None),
]


@pytest.mark.parametrize("text,kind,want", [c[1:] for c in EXTRACT], ids=[c[0] for c in EXTRACT])
def test_extract(text, kind, want):
    assert A.extract_answer(text, kind) == want


MATCH = [
    ("same int", "72", "72", "math", True),
    ("different int", "71", "72", "math", False),
    ("commas in number", "1,000", "1000", "math", True),
    ("commas vs decimal", "1,000.5", "1000.5", "math", True),
    ("tuple commas not thousands", "(1,2)", "12", "math", False),
    ("trailing period", "18.", "18", "math", True),
    ("decimal vs int", "18.0", "18", "math", True),
    ("dollar signs", "$18", "18", "math", True),
    ("fraction slash vs decimal", "1/2", "0.5", "math", True),
    ("frac vs decimal", r"\frac{1}{2}", "0.5", "math", True),
    ("dfrac vs frac", r"\dfrac{3}{4}", r"\frac{3}{4}", "math", True),
    ("frac short form", r"\frac12", "0.5", "math", True),
    ("negative frac", r"-\frac{2}{3}", "-0.666667", "math", True),
    ("frac wrong", r"\frac{2}{3}", "0.6", "math", False),
    ("percent vs fraction", "50%", "0.5", "math", True),
    ("escaped percent", r"50\%", "50", "math", True),
    ("x100 tolerance", "0.25", "25", "math", True),
    ("relative tol 1e-4 in", "100.005", "100", "math", True),
    ("relative tol 1e-4 out", "100.02", "100", "math", False),
    ("text unit", r"5\text{ cm}", "5", "math", True),
    ("plain unit word", "12 dollars", "12", "math", True),
    ("degrees", r"30^\circ", "30", "math", True),
    ("variable assignment", "x = 5", "5", "math", True),
    ("algebra not a unit", "2x", "2", "math", False),
    ("sqrt closed form", r"\frac{\sqrt{3}}{2}", "0.8660254", "math", True),
    ("pi closed form", r"2\pi", "6.283185", "math", True),
    ("sqrt vs different", r"2\sqrt{2}", "2.9", "math", False),
    ("left right parens", r"\left(1,2\right)", "(1,2)", "math", True),
    ("interval string", "[0,1)", "[0,1)", "math", True),
    ("escaped dollar and commas", r"\$1,000", "1000", "math", True),
    ("unicode minus", "\u22125", "-5", "math", True),
    ("mixed number", r"1\frac{1}{2}", "1.5", "math", True),
    ("scientific closed form", r"3 \times 10^{2}", "300", "math", True),
    ("percent boxed vs plain", r"25\%", "25", "math", True),
    ("leading-dot decimal", ".5", "1/2", "math", True),
    ("none prediction", None, "3", "math", False),
    ("choice same", "B", "B", "choice", True),
    ("choice lower ref", "b", "B", "choice", True),
    ("choice different", "A", "B", "choice", False),
]


@pytest.mark.parametrize("pred,ref,kind,want", [c[1:] for c in MATCH], ids=[c[0] for c in MATCH])
def test_answers_match(pred, ref, kind, want):
    assert A.answers_match(pred, ref, kind) is want


def test_check_solution_end_to_end():
    sol = r"Step 1: 3+4=7.\n\nStep 2: so the answer is \boxed{7}."
    assert A.check_solution(sol, "7")
    assert not A.check_solution(sol, "8")


def test_symbolic_degrades_without_sympy():
    # Free-variable algebra needs a CAS; without sympy it is judged unequal, never an error.
    got = A.answers_match("2(x+1)", "2x+2", "math")
    assert got is A.SYMPY_AVAILABLE


def test_bounded_parser_refuses_huge_power_and_code():
    assert A.evaluate_expression("9^9^9^9") is None
    assert A.evaluate_expression("__import__('os')") is None
    assert A.evaluate_expression("1" * (A.MAX_EXPR_CHARS + 1)) is None
    assert math.isclose(A.evaluate_expression(r"\sqrt[3]{27}"), 3.0)


def test_time_limit_interrupts_and_counts(monkeypatch):
    def slow(*args, **kwargs):
        time.sleep(5)
        return True

    monkeypatch.setattr(A, "_match", slow)
    before = signal.getsignal(signal.SIGALRM)
    stats = A.CheckStats()
    t0 = time.monotonic()
    assert A.answers_match("1", "1", timeout_s=0.2, stats=stats) is False
    assert time.monotonic() - t0 < 2.0
    assert stats.timeouts == 1
    assert signal.getsignal(signal.SIGALRM) is before  # handler restored
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left armed


def test_time_limit_off_main_thread_runs_without_alarm():
    out = []
    th = threading.Thread(target=lambda: out.append(A.answers_match("1/2", "0.5", timeout_s=0.1)))
    th.start()
    th.join(5)
    assert out == [True]


def test_bad_kind():
    with pytest.raises(ValueError, match="kind"):
        A.answers_match("1", "1", kind="essay")
