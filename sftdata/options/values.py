"""An option's value read from text or from a config file: sizes (``64M``), ``--template-var
NAME=VALUE``, and the type check a ``--config`` value gets (``coerce``)."""

from __future__ import annotations

import json
import re

from ..errors import UsageError

SIZE = "size"  # an option's type: bytes, or a number with K, M or G (powers of 1024)
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_WHAT = {bool: "true or false", int: "a whole number", float: "a number", str: "a string",
         SIZE: "a size (bytes, or a string such as \"64M\" or \"1G\")", list: "a list of strings (or one string)",
         dict: "a table of NAME = VALUE (or a list of \"NAME=VALUE\" strings)"}


def size_bytes(text) -> int:
    """Bytes from ``67108864``, ``64M``, ``64MiB`` or ``1G`` (K, M, G are powers of 1024);
    ValueError names what to give."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size: give bytes (67108864) or a number with K, M or G "
                         f"(64M, 1G; powers of 1024)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_template_vars(values: list[str] | None) -> dict | None:
    """``--template-var NAME=VALUE`` options as ``{NAME: value}``, each VALUE read as JSON."""
    out: dict = {}
    for item in values or ():
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--template-var {item!r}: give NAME=VALUE, e.g. --template-var enable_thinking=false")
        try:
            out[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            raise UsageError(f"--template-var {item}: the value is not JSON; a string needs quotes, e.g. "
                             f"--template-var {name.strip()}='\"{raw}\"'") from None
    return out or None


def _strings(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def coerce(kind, value, nullable: bool):
    """``value`` as an option of type ``kind`` holds it, or raises TypeError saying what
    the option takes (``--config``: a file's values are typed, never guessed from text)."""
    if value is None and nullable:
        return None
    if kind is bool and isinstance(value, bool):
        return value
    if kind in (int, SIZE) and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if kind is SIZE and isinstance(value, str):
        try:
            return size_bytes(value)
        except ValueError as e:
            raise TypeError(str(e)) from None
    if kind is list and (isinstance(value, str) or _strings(value)):
        return (value,) if isinstance(value, str) else tuple(value)
    if kind is dict and isinstance(value, dict):
        return dict(value) or None
    if kind is dict and _strings(value):
        return parse_template_vars(value)
    raise TypeError(f"takes {_WHAT[kind]}{' or nothing' if nullable else ''}, not {type(value).__name__} "
                    f"{json.dumps(value, default=str)[:60]}")
