"""JSON files in and out: reads whose every failure is one ``BadInput`` line, atomic writes.

``write_json(path, obj)`` is the one way the project writes a JSON file: to ``<path>.tmp``, then
``os.replace``, so a reader (or a resumed run) sees the old file or the new one, never half of
one; ``json_default`` is the one ``default=`` hook for values ``json`` cannot encode.

``read_json(path)`` is the one way the commands read a JSON input (``meta.json``,
``multipliers.json``, ``config.json``, ``policy_meta.json``, ...). A missing file, a directory
in its place, bytes that are not UTF-8, malformed JSON, JSON nested so deeply that the parser
recurses out (``RecursionError``), or a top-level value of the wrong type all raise
``errors.BadInput`` (exit 2) with a message that starts with the file's path.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from prada_jax.errors import BadInput

__all__ = ["read_json", "loads_json", "write_json", "json_default"]


class _DuplicateKey(ValueError):
    pass


def _unique_object(pairs):
    """``object_pairs_hook`` that refuses an object naming a key twice (``json`` keeps the last
    silently)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def loads_json(text: str, where: str, *, expect: type | tuple[type, ...] | None = dict,
               error: type[BadInput] = BadInput, unique_keys: bool = False) -> Any:
    """Parses ``text`` (read from ``where``, named in every message); ``expect`` is the type the
    top-level value must have (``None``: any); ``unique_keys``: an object that names a key twice
    is refused (by default the last one wins, as ``json`` does). Raises ``error`` (a BadInput) on
    any failure."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_object if unique_keys else None)
    except _DuplicateKey as e:
        raise error(f"{where}: key {e.args[0]!r} appears twice in one object") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
                    ) from None
    except RecursionError:
        raise error(f"{where}: not valid JSON (nested too deeply)") from None
    except (ValueError, TypeError) as e:   # e.g. huge integers beyond the conversion limit
        raise error(f"{where}: not valid JSON ({_one_line(e)})") from None
    if expect is not None and not isinstance(data, expect):
        names = " or ".join(t.__name__ for t in (expect if isinstance(expect, tuple)
                                                 else (expect,)))
        kind = {"dict": "an object", "list": "an array"}.get(names, names)
        raise error(f"{where}: top level must be {kind}, got {type(data).__name__}")
    return data


def read_json(path: os.PathLike | str, *, expect: type | tuple[type, ...] | None = dict,
              missing: str | None = None, error: type[BadInput] = BadInput,
              unique_keys: bool = False) -> Any:
    """The parsed content of the JSON file ``path``.

    ``missing`` is appended to the message when the file does not exist (a hint such as
    ``"is DIR a run directory?"``); ``error`` is the BadInput subclass to raise;
    ``unique_keys`` as in ``loads_json``.
    """
    p = Path(path)
    if not p.exists():
        raise error(f"{p}: missing" + (f" ({missing})" if missing else ""))
    if not p.is_file():
        raise error(f"{p}: not a file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{p}: not valid JSON (not UTF-8 text)") from None
    except OSError as e:
        raise error(f"{p}: cannot read ({e.strerror or e})") from None
    return loads_json(text, str(p), expect=expect, error=error, unique_keys=unique_keys)


def json_default(o: Any) -> Any:
    """``default=`` hook for ``json.dumps``: ``o.to_dict()`` where ``o`` has one (a
    ``stats.MeanCI``, a ``ConfigDict``), else ``o.tolist()`` (NumPy/JAX arrays and scalars),
    else ``str(o)``."""
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def write_json(path: os.PathLike | str, obj: Any, *, indent: int | None = 2,
               sort_keys: bool = False, default: Callable[[Any], Any] | None = json_default,
               allow_nan: bool = True, separators: tuple[str, str] | None = None,
               newline: bool = True) -> Path:
    """Writes ``json.dumps(obj, ...)`` to ``path`` atomically; returns the path.

    The parent folder is created if missing. The text goes to ``<path>.tmp`` first and is then
    renamed over ``path`` (``os.replace``, atomic on POSIX), so an interrupted write, or one
    that fails while encoding, leaves the previous file untouched. ``indent``, ``sort_keys``,
    ``separators`` and ``default`` are ``json.dumps``'s; ``newline`` ends the file with
    ``"\n"``.

    Non-finite floats: with ``allow_nan=True`` (the default, ``json``'s own) NaN and ±inf are
    written as the non-standard tokens ``NaN``/``Infinity``, which Python's ``json`` reads back;
    callers that want strict JSON convert them to None first (``stats.MeanCI.to_json_dict``,
    ``stats.finite_or_none``) or pass ``allow_nan=False``, which raises ``ValueError`` and
    writes nothing.
    """
    path = Path(path)
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default,
                      allow_nan=allow_nan, separators=separators)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text + ("\n" if newline else ""), encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
