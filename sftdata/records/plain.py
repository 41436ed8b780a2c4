"""The most common record, read in one pass without the general parser (pure, I/O-free).

A *plain* record is an object with a ``messages`` list of ``{"role", "content"}``
messages (or a ShareGPT ``conversations`` list of ``{"from", "value"}``), every message
exactly those two keys with string content, no ``tools`` / ``functions`` key and no
media list (``images``, ``videos``, ``audios``), no text holding ``MEDIA_MARK``, an
optional top-level ``system`` string and valid ``chat_template_kwargs`` (kept as the
general parser keeps them), then: system messages first, user and assistant
strictly alternating from a user message, none blank, the last one the assistant's, no
assistant reply opening with ``<think>``. Its conversation is its messages as turns (the
system texts that are not blank joined by a blank line): nothing to repair, reject or
count, no reasoning, nothing untrained, and no tool in chat or tool mode.

``plain_conversation`` returns that conversation, or None for any other record, which
``conversation.parse_record`` then reads with the general parser (tests give both
parsers every shape and compare). It exists for speed: the general parser looks at
every field a message could carry, about 40 µs a record in Python, several times what
this check costs.
"""

from __future__ import annotations

from typing import Any

from ..errors import RecordError
from .content import THINK_OPEN
from .turns import CHAT_ROLES, MEDIA_MARK, TEMPLATE_KWARGS, Conversation, Turn, read_template_kwargs

_OTHER = {"user": "assistant", "assistant": "user"}


def plain_conversation(obj: Any) -> Conversation | None:
    """The conversation of a plain record (module docstring), or None."""
    if type(obj) is not dict or "tools" in obj or "functions" in obj or has_media_lists(obj):
        return None
    kwargs = template_kwargs(obj)
    if kwargs is False:
        return None
    if "messages" in obj:
        msgs, role_key, text_key = obj["messages"], "role", "content"
    elif "conversations" in obj:
        msgs, role_key, text_key = obj["conversations"], "from", "value"
    else:
        return None
    if type(msgs) is not list:
        return None
    top = obj.get("system")
    if top is not None and (type(top) is not str or MEDIA_MARK in top):
        return None
    systems = [] if top is None else [top]
    turns: list[Turn] = []
    expect = "user"
    for m in msgs:
        if type(m) is not dict or len(m) != 2:
            return None
        text, role = m.get(text_key), m.get(role_key)
        if type(text) is not str or type(role) is not str or MEDIA_MARK in text:
            return None
        role = CHAT_ROLES.get(role) or CHAT_ROLES.get(role.lower())
        if role is None:
            return None
        if role == "system":
            if turns:  # after the conversation started: the general parser rejects it
                return None
            systems.append(text)
            continue
        if role != expect or not text or text.isspace():
            return None
        if role == "assistant" and opens_thinking(text):
            return None
        turns.append(Turn(role, text))
        expect = _OTHER[role]
    if expect != "user" or not turns:  # empty, or the last turn is not the assistant's
        return None
    return with_system(systems, turns, kwargs=kwargs)


def template_kwargs(obj: dict) -> dict | None | bool:
    """The record's ``chat_template_kwargs`` as the general parser reads them (None: none),
    or False where it would refuse them (it then names the record)."""
    if TEMPLATE_KWARGS not in obj:
        return None
    try:
        return read_template_kwargs(obj, "")
    except RecordError:
        return False


def has_media_lists(obj: dict) -> bool:
    """True when a record holds a top-level media list (``images``, ``videos``, ``audios``),
    which only the general parser reads."""
    return "images" in obj or "videos" in obj or "audios" in obj  # LIST_KEYS, spelled out: no generator per record


def opens_thinking(text: str) -> bool:
    """True when an assistant text opens with ``<think>`` (after whitespace): reasoning,
    which only the general parser reads."""
    return text.startswith(THINK_OPEN) or (text[:1].isspace() and text.lstrip().startswith(THINK_OPEN))


def with_system(systems: list[str], turns: list[Turn], tools: tuple = (), specs: tuple = (),
                kwargs: dict | None = None) -> Conversation:
    """The conversation of ``turns`` after one system turn: the ``systems`` texts that are
    not blank, joined by a blank line (none when all are blank); ``specs``: the tool
    schemas as the record gave them (``Conversation.tool_specs``); ``kwargs``: its
    ``chat_template_kwargs``."""
    system = "\n\n".join(t for t in systems if t.strip())
    return Conversation((Turn("system", system), *turns) if system else tuple(turns), tools, tool_specs=specs,
                        template_kwargs=kwargs)
