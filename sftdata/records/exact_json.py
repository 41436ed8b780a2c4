"""JSON decoding that never changes a number the renderer writes back (pure, I/O-free).

orjson holds integers of 64 bits (``-2**63 .. 2**64 - 1``) exactly and silently reads a
longer one as a float: ``123456789012345678901`` comes back as ``1.2345678901234568e20``.
A tool call's arguments or a tool schema read that way would be trained as another
number. So every input record is decoded with ``loads``: orjson (fast, and the judge of
what is valid JSON), then, only for the rare text holding a run of 19 or more digits,
Python's ``json`` again, whose integers are exact. What is rendered as JSON is then
checked with ``check_exact``, which refuses an integer beyond 64 bits (orjson cannot
write it) with a message that names it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# an integer needs at least 19 digits to leave the 64-bit range (2**63 has 19). Every record
# (and JSON text inside one) is searched for such a run: with every digit made "1", it is a
# find of 19 ones, at memory speed (a regex runs at a few dozen MB/s, slower than the parse)
_ALL_ONES = bytes.maketrans(b"0123456789", b"1" * 10)
_RUN = b"1" * 19
_MIN, _MAX = -(1 << 63), 1 << 64


class InexactJSON(ValueError):
    """JSON whose numbers cannot be kept exactly."""


def loads(text: bytes | str) -> Any:
    """``orjson.loads(text)``, with integers beyond 64 bits kept exact (Python ints).

    Raises ``orjson.JSONDecodeError`` for invalid JSON and ``InexactJSON`` for valid JSON
    nested too deeply to be read exactly.
    """
    value = orjson.loads(text)
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    if raw.translate(_ALL_ONES).find(_RUN) >= 0:
        try:
            return json.loads(text if isinstance(text, str) else raw)  # json reads no memoryview
        except RecursionError:
            raise InexactJSON("the JSON is nested too deeply to read its long numbers exactly") from None
    return value


def _first_big_int(value: Any) -> int | None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, int) and not isinstance(v, bool):
            if not _MIN <= v < _MAX:
                return v
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def check_exact(value: Any) -> None:
    """Raise ``InexactJSON`` when ``value`` holds an integer outside 64 bits (what orjson,
    which renders it, cannot write)."""
    try:
        orjson.dumps(value)  # C speed; the walk below runs only to name the culprit
    except orjson.JSONEncodeError as e:
        big = _first_big_int(value)
        if big is None:
            raise InexactJSON(f"it cannot be written back as JSON ({e})") from None
        raise InexactJSON(f"the integer {big} does not fit in 64 bits (it would be changed); "
                          f"write it as a string") from None
