"""A conversation's canonical text and its exact-duplicate key.

Two records are exact duplicates when their canonical texts are equal: every turn's
role and text with runs of whitespace collapsed to one space (leading and trailing
whitespace dropped), tool calls as name and arguments in sorted-key JSON, reasoning,
media references (kind and reference, in order) and tool schemas included. So the same conversation written with other indentation,
line breaks or JSON key order, or in another input format, is the same key.
"""

from __future__ import annotations

import hashlib

import orjson

from ..records.turns import Conversation

SEP_TURN, SEP_FIELD = "\x1e", "\x1f"  # never in a collapsed text: str.split() treats both as whitespace


def _ws(text: str) -> str:
    return " ".join(text.split())


def canonical_text(conv: Conversation) -> str:
    """The canonical text of ``conv`` (module docstring)."""
    parts = []
    for t in conv.tools:
        parts.append("tool_schema" + SEP_FIELD + orjson.dumps(t, option=orjson.OPT_SORT_KEYS).decode())
    for t in conv.turns:
        head = t.role + SEP_FIELD + " ".join(t.text.split())  # _ws, inline: one call less per turn
        if not t.reasoning and not t.tool_calls and not t.media:
            parts.append(head)
            continue
        fields = [head]
        if t.media:  # the same words about another image are another record
            fields.append("media:" + " ".join(f"{m.kind}={m.ref}" for m in t.media))
        if t.reasoning:
            fields.append("reasoning:" + _ws(t.reasoning))
        for c in t.tool_calls:
            fields.append("call:" + c.name + orjson.dumps(c.arguments, option=orjson.OPT_SORT_KEYS).decode())
        parts.append(SEP_FIELD.join(fields))
    return SEP_TURN.join(parts)


def exact_key(text: str) -> bytes:
    """16 bytes of blake2b over the canonical text (a collision is ~2**-64 per pair)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
