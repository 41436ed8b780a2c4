"""A conversation's canonical text and its exact-duplicate key.

Two records are exact duplicates when their canonical texts are equal: every turn's
role and text with runs of whitespace collapsed to one space (leading and trailing
whitespace dropped), tool calls as name and arguments in sorted-key JSON, reasoning
and tool schemas included. So the same conversation written with other indentation,
line breaks or JSON key order, or in another input format, is the same key.
"""

from __future__ import annotations

import hashlib

import orjson

from ..turns import Conversation

SEP_TURN, SEP_FIELD = "\x1e", "\x1f"  # never in a collapsed text: they are not whitespace, and rare


def _ws(text: str) -> str:
    return " ".join(text.split())


def canonical_text(conv: Conversation) -> str:
    """The canonical text of ``conv`` (module docstring)."""
    parts = []
    for t in conv.tools:
        parts.append("tool_schema" + SEP_FIELD + orjson.dumps(t, option=orjson.OPT_SORT_KEYS).decode())
    for t in conv.turns:
        head = t.role + SEP_FIELD + " ".join(t.text.split())  # _ws, inline: one call less per turn
        if not t.reasoning and not t.tool_calls:
            parts.append(head)
            continue
        fields = [head]
        if t.reasoning:
            fields.append("reasoning:" + _ws(t.reasoning))
        for c in t.tool_calls:
            fields.append("call:" + c.name + orjson.dumps(c.arguments, option=orjson.OPT_SORT_KEYS).decode())
        parts.append(SEP_FIELD.join(fields))
    return SEP_TURN.join(parts)


def exact_key(text: str) -> bytes:
    """16 bytes of blake2b over the canonical text (a collision is ~2**-64 per pair)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


# the whitespace ``str.split()`` cuts at within ASCII, all made spaces (for UTF-8 bytes of ASCII text)
_ASCII_SPACES = bytes.maketrans(b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f", b" " * 9)
_HEADS = {r: (r + SEP_FIELD).encode() for r in ("system", "user", "assistant", "tool")}
_SORT = orjson.OPT_SORT_KEYS


def _ws_utf8(text: str) -> bytes:
    """``_ws(text)`` in UTF-8. ASCII text (most) is collapsed as bytes, which allocates no
    word: its whitespace made spaces, runs of spaces halved until none is left, the ends
    stripped."""
    if not text.isascii():
        return " ".join(text.split()).encode("utf-8", "surrogatepass")
    b = text.encode().translate(_ASCII_SPACES)
    while b"  " in b:
        b = b.replace(b"  ", b" ")
    return b.strip(b" ")


def conversation_key(conv: Conversation) -> bytes:
    """``exact_key(canonical_text(conv))``, without building the text: each part is made in
    UTF-8 (``_ws_utf8``, the JSON as orjson writes it) and hashed once."""
    parts = [b"tool_schema\x1f" + orjson.dumps(t, option=_SORT) for t in conv.tools]
    add = parts.append
    for t in conv.turns:
        head = _HEADS.get(t.role) or (t.role + SEP_FIELD).encode("utf-8", "surrogatepass")
        text = t.text
        if text.isascii():  # _ws_utf8, inline: the common turn
            b = text.encode().translate(_ASCII_SPACES)
            while b"  " in b:
                b = b.replace(b"  ", b" ")
            head += b.strip(b" ")
        else:
            head += " ".join(text.split()).encode("utf-8", "surrogatepass")
        if not t.reasoning and not t.tool_calls:
            add(head)
            continue
        fields = [head]
        if t.reasoning:
            fields.append(b"reasoning:" + _ws_utf8(t.reasoning))
        for c in t.tool_calls:
            fields.append(b"call:" + c.name.encode("utf-8", "surrogatepass") + orjson.dumps(c.arguments, option=_SORT))
        add(b"\x1f".join(fields))
    return hashlib.blake2b(b"\x1e".join(parts), digest_size=16).digest()
