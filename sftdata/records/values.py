"""What a decoded JSON value is, in the words a reject's message names it with (pure).

The one leaf of ``records/`` that every parser imports: the turns, a message's content,
media parts and preference rows all say "message 3 content is a number" the same way.
"""

from __future__ import annotations

from typing import Any


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words with an article: ``an object``,
    ``a list``, ``a string``, ``a number``, ``a boolean``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
