"""Final-answer extraction from a generated solution and checking against a reference answer.

Extraction (``extract_answer``):

* ``kind="math"``: the content of the last ``\\boxed{...}`` (braces matched, nesting allowed;
  ``\\fbox`` too), else the last number in the text.
* ``kind="choice"``: the last A–E letter: inside the last ``\\boxed{}`` if there is one, else
  after "answer is", else the last stand-alone capital A–E.

Checking (``answers_match``), in order, stopping at the first success:

1. as strings, after normalisation (``$``, ``\\left``/``\\right``, spaces, ``\\dfrac``,
   ``\\text{...}`` units, degree signs, thousands commas, a trailing period, ``x =``);
2. numerically, relative tolerance 1e-4, the prediction also against the reference × 100 and
   ÷ 100 (percent written as a fraction or the other way round);
3. symbolically: closed-form expressions (``\\frac``, ``\\sqrt``, ``^``, ``\\pi``, products)
   are evaluated by a small bounded parser in this module (a whitelist walk over Python's
   ``ast``; nothing is ``eval``-ed) and compared numerically; if ``sympy`` is installed its
   ``simplify(a - b) == 0`` is tried last. ``SYMPY_AVAILABLE`` says whether it is; without it
   equal-but-differently-written algebraic expressions with free variables (``2(x+1)`` vs
   ``2x+2``) are judged unequal.

Every check runs under a wall-clock limit (``timeout_s``): a SIGALRM interval timer when
called from the main thread on a POSIX system; elsewhere the limit cannot interrupt, so the
bounded parser (input at most ``MAX_EXPR_CHARS`` characters, exponents at most ``MAX_POW``)
is what keeps a check short. A check that times out is judged wrong and counted
(``CheckStats.timeouts``).
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import math
import re
import signal
import threading

try:  # optional; not a dependency of this project
    import sympy as _sympy  # type: ignore
    SYMPY_AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the environment
    _sympy = None
    SYMPY_AVAILABLE = False

REL_TOL = 1e-4
MAX_EXPR_CHARS = 200
MAX_POW = 64.0
DEFAULT_TIMEOUT_S = 2.0

_UNIT_WORDS = (
    "cm", "mm", "km", "m", "kg", "g", "mg", "l", "ml", "s", "sec", "seconds", "second", "min",
    "minutes", "minute", "h", "hr", "hrs", "hours", "hour", "days", "day", "weeks", "week",
    "years", "year", "months", "month", "dollars", "dollar", "cents", "cent", "degrees",
    "degree", "units", "unit", "inches", "inch", "feet", "foot", "ft", "miles", "mile", "mph",
    "meters", "meter", "people", "students", "points", "pounds", "pound", "lbs", "square",
    "sq", "cubic", "percent", "yards", "yard", "liters", "liter", "gallons", "gallon",
)
_UNIT_RE = re.compile(r"^(.*?\d)\s*(?:(?:%s)\b\.?\s*)+(?:\^?\{?[23]\}?)?$" % "|".join(_UNIT_WORDS),
                      re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+")


class CheckTimeout(Exception):
    """An answer check ran past its time limit."""


@dataclasses.dataclass
class CheckStats:
    """Counters over many checks (how each verdict was reached)."""
    checks: int = 0
    string: int = 0
    numeric: int = 0
    symbolic: int = 0
    timeouts: int = 0


# ---------------------------------------------------------------------------- extraction

def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` with braces matched, else None.

    ``\\boxed 5`` (no braces) gives the next space-delimited token. An unclosed brace gives None.
    """
    spans = [(m.start(), m.end()) for m in re.finditer(r"\\(?:boxed|fbox)", text)]
    for start, i in reversed(spans):
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1:j].strip()
            continue  # unclosed: try an earlier one
        m = re.match(r"[^\s$]+", text[i:])
        if m and text[start:i].rstrip() != text[start:i]:  # "\boxed 5"
            return m.group(0)
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands commas, decimals, ``a/b`` kept), else None."""
    found = _NUMBER_RE.findall(text)
    return found[-1] if found else None


def extract_choice(text: str) -> str | None:
    """The chosen letter A–E of a multiple-choice solution, else None."""
    boxed = extract_boxed(text)
    if boxed is not None:
        m = re.findall(r"(?<![A-Za-z])([A-E])(?![A-Za-z])", _strip_text_macros(boxed))
        if m:
            return m[-1]
    m = re.findall(r"answer is:?\s*\(?\$?\s*(?:\\text\{)?\(?([A-E])(?![A-Za-z])", text,
                   re.IGNORECASE)
    if m:
        return m[-1].upper()
    m = re.findall(r"(?<![A-Za-z])([A-E])(?![A-Za-z])", text)
    return m[-1] if m else None


def extract_answer(text: str, kind: str = "math") -> str | None:
    """The final answer of a solution: see the module docstring. ``kind``: math | choice."""
    if kind == "choice":
        return extract_choice(text)
    if kind != "math":
        raise ValueError(f"answer kind must be 'math' or 'choice', got {kind!r}")
    boxed = extract_boxed(text)
    return boxed if boxed is not None else last_number(text)


def has_final_answer(text: str) -> bool:
    """True if the text contains a complete ``\\boxed{...}`` (the solution has ended)."""
    return extract_boxed(text) is not None


# ---------------------------------------------------------------------------- normalisation

def _strip_text_macros(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mathrm|mbox|mathbf)\s*\{([^{}]*)\}", r"\1", s)


def normalize(s: str) -> str:
    """Canonical string form of an answer (see the module docstring)."""
    s = s.strip().replace("\u2212", "-")  # unicode minus
    s = s.replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "")
    # A trailing unit in \text{...} after a number: drop it; other \text{} keep their content.
    s = re.sub(r"(\d)\s*\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}\s*(\^\{?[23]\}?)?$",
               r"\1", s)
    s = _strip_text_macros(s)
    s = s.replace("\\ ", " ").strip()
    s = s.rstrip(".").strip()
    # "x = 5" -> "5" (a single variable assignment)
    s = re.sub(r"^[A-Za-z]\s*=\s*", "", s)
    m = _UNIT_RE.match(s)
    if m:
        s = m.group(1)
    s = re.sub(r"\s+", "", s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?%?", s):
        s = s.replace(",", "")
    s = s.replace("\\%", "%")
    return s


def to_number(s: str) -> float | None:
    """A plain numeric value of a normalised answer (ints, decimals, ``a/b``, ``\\frac{a}{b}``,
    ``50%`` -> 50), else None."""
    s = s.rstrip("%")
    m = re.fullmatch(r"(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}", s)  # mixed number 1\frac{1}{2}
    if m and float(m.group(4)) != 0:
        val = float(m.group(2)) + float(m.group(3)) / float(m.group(4))
        return -val if m.group(1) else val
    m = re.fullmatch(r"(-?)\\frac\{?(-?\d+(?:\.\d+)?)\}?\{?(-?\d+(?:\.\d+)?)\}?", s)
    if m:
        den = float(m.group(3))
        if den == 0:
            return None
        val = float(m.group(2)) / den
        return -val if m.group(1) else val
    m = re.fullmatch(r"(-?\d*\.?\d+)/(-?\d*\.?\d+)", s)
    if m:
        den = float(m.group(2))
        return float(m.group(1)) / den if den != 0 else None
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", s):
        return float(s)
    return None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def numbers_match(pred: float, ref: float) -> bool:
    """``pred`` equals ``ref``, ``ref × 100`` or ``ref ÷ 100`` within relative tolerance 1e-4."""
    return any(_close(pred, r) for r in (ref, ref * 100.0, ref / 100.0))


# ---------------------------------------------------------------------------- bounded parser

_FUNCS = {"sqrt": math.sqrt, "sin": math.sin, "cos": math.cos, "tan": math.tan, "log": math.log,
          "ln": math.log, "exp": math.exp}
_CONSTS = {"pi": math.pi, "e": math.e}


def _latex_to_py(s: str) -> str | None:
    """Rewrites a closed-form LaTeX expression into Python syntax, or None."""
    if len(s) > MAX_EXPR_CHARS:
        return None
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/")
    s = s.replace("\\pi", " pi ").replace("π", " pi ")
    s = re.sub(r"\\(sqrt|sin|cos|tan|log|ln|exp)", r" \1", s)
    # \frac{a}{b} and \frac ab (single-character arguments), innermost first.
    for _ in range(20):
        t = re.sub(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"((\1)/(\2))", s)
        t = re.sub(r"\\frac\s*(\w)\s*(\w)", r"((\1)/(\2))", t)
        t = re.sub(r"sqrt\s*\[([^\[\]]*)\]\s*\{([^{}]*)\}", r"((\2)**(1/(\1)))", t)
        t = re.sub(r"(sqrt|sin|cos|tan|log|ln|exp)\s*\{([^{}]*)\}", r"\1((\2))", t)
        t = re.sub(r"sqrt\s*(\d+|\w)", r"sqrt(\1)", t)
        if t == s:
            break
        s = t
    s = s.replace("{", "(").replace("}", ")").replace("^", "**")
    if "\\" in s or re.search(r"[^0-9a-z+\-*/(). ]", s):
        return None
    # implicit multiplication: 2pi, 2(x), )(, )2, pi sqrt(3)
    s = re.sub(r"(\d|\))\s*(?=[a-z(])", r"\1*", s)
    s = re.sub(r"\b(pi|e)\s+(?=[a-z(\d])", r"\1*", s)
    s = re.sub(r"\)\s*(?=\d)", ")*", s)
    return s


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.Div):
            return a / b
        if isinstance(node.op, ast.Pow):
            if abs(b) > MAX_POW or abs(a) > 1e6:
                raise ValueError("exponent out of bounds")
            return float(a ** b)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id in _FUNCS and len(node.args) == 1 and not node.keywords:
        return _FUNCS[node.func.id](_eval_node(node.args[0]))
    raise ValueError(f"unsupported expression node {type(node).__name__}")


def evaluate_expression(s: str) -> float | None:
    """Numeric value of a closed-form LaTeX/plain expression (no free variables), else None.

    Bounded: at most ``MAX_EXPR_CHARS`` characters, exponents at most ``MAX_POW``; only
    numbers, + - * / ^, sqrt/sin/cos/tan/log/exp, pi and e. Nothing is passed to ``eval``.
    """
    py = _latex_to_py(s)
    if py is None or not py.strip():
        return None
    try:
        tree = ast.parse(py.strip(), mode="eval")
        val = _eval_node(tree)
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
        return None
    if isinstance(val, complex) or not math.isfinite(val):
        return None
    return float(val)


def _sympy_equal(a: str, b: str) -> bool:
    if _sympy is None:
        return False
    try:
        pa, pb = _latex_to_py(a), _latex_to_py(b)
        if pa is None or pb is None:
            return False
        return bool(_sympy.simplify(_sympy.sympify(pa) - _sympy.sympify(pb)) == 0)
    except Exception:  # sympy raises many kinds of errors on odd input
        return False


# ---------------------------------------------------------------------------- time limit

@contextlib.contextmanager
def time_limit(seconds: float):
    """Raises ``CheckTimeout`` inside the block after ``seconds`` (SIGALRM; main thread only).

    Off the main thread, or where SIGALRM does not exist, the block runs without a limit.
    """
    usable = (seconds and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def _raise(signum, frame):
        raise CheckTimeout(f"answer check exceeded {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------- checking

def _match(pred: str, ref: str, kind: str, stats: CheckStats | None) -> bool:
    if kind == "choice":
        p = extract_choice(pred) if len(pred.strip()) != 1 else pred.strip().upper()
        r = ref.strip().upper()
        r = extract_choice(r) if len(r) != 1 else r
        ok = p is not None and p == r
        if ok and stats:
            stats.string += 1
        return ok
    np_, nr = normalize(pred), normalize(ref)
    if np_ == nr and np_ != "":
        if stats:
            stats.string += 1
        return True
    a, b = to_number(np_), to_number(nr)
    if a is not None and b is not None:
        ok = numbers_match(a, b)
        if ok and stats:
            stats.numeric += 1
        return ok
    a = a if a is not None else evaluate_expression(np_)
    b = b if b is not None else evaluate_expression(nr)
    if a is not None and b is not None:
        ok = numbers_match(a, b)
        if ok and stats:
            stats.symbolic += 1
        return ok
    ok = _sympy_equal(np_, nr)
    if ok and stats:
        stats.symbolic += 1
    return ok


def answers_match(pred: str | None, ref: str, kind: str = "math",
                  timeout_s: float = DEFAULT_TIMEOUT_S, stats: CheckStats | None = None) -> bool:
    """Whether an extracted answer ``pred`` equals the reference ``ref``.

    Args:
      pred: extracted answer (``None`` -> wrong).
      ref: reference answer (math: a value/expression; choice: a letter A–E).
      kind: ``math`` or ``choice``.
      timeout_s: wall-clock limit of this check in seconds (<= 0: none); a timeout -> False.
      stats: optional counters, updated in place.
    """
    if kind not in ("math", "choice"):
        raise ValueError(f"answer kind must be 'math' or 'choice', got {kind!r}")
    if stats is not None:
        stats.checks += 1
    if pred is None:
        return False
    try:
        with time_limit(timeout_s):
            return _match(pred, ref, kind, stats)
    except CheckTimeout:
        if stats is not None:
            stats.timeouts += 1
        return False


def check_solution(solution: str, ref: str, kind: str = "math",
                   timeout_s: float = DEFAULT_TIMEOUT_S, stats: CheckStats | None = None) -> bool:
    """Extracts the final answer of ``solution`` and checks it against ``ref``."""
    return answers_match(extract_answer(solution, kind), ref, kind, timeout_s, stats)
