"""One message's content, in every spelling records use: pure, I/O-free.

Content is a string or a list of typed parts, joined in order:

=====================================  ==================================================
``"text"`` / ``{"type": "text",        text (both spellings, and a bare string part)
"text"|"value": ...}``
``{"type": "refusal", "refusal"}``     assistant only: the reply's text (``refusal_as_reply``)
``{"type": "reasoning"|"thinking",     assistant only: reasoning (several parts are joined
"thinking"|"reasoning"|"text"|...}``   with a blank line), rendered before the reply
``{"type": "tool_call", "value"}``     assistant only: a call, ``{"name", "arguments"}`` or
                                       its JSON text (``prepare-tool``)
``{"type": "image_url"|"image"|        user and system only: a media item, one
"video"|"video_url", ...}``            ``MEDIA_MARK`` in the text where it stands
                                       (``media``; elsewhere ``media_in_reply``)
anything else (audio, file)            the record is rejected (``non_text_content``),
                                       naming the part's type and its message
=====================================  ==================================================

Text holding ``MEDIA_MARK`` (U+FFFC) itself is rejected (``reserved_character``).

An assistant message also reads:

* reasoning from the fields ``reasoning_content``, ``reasoning`` or ``thinking``, or
  from a leading ``<think>...</think>`` block of its content (moved out of the reply,
  the repair ``reasoning_from_think_tags``; a ``<think>`` never closed is rejected as
  ``unclosed_think``). Reasoning is stripped of surrounding whitespace; given more than
  once it must be the same text (else ``invalid_reasoning``); given but blank it is
  not rendered and counted as ``reasoning_empty``.
* a message-level ``refusal`` string as its reply when the content is empty (joined
  after the content otherwise): ``refusal_as_reply``.
* ``"weight"`` (0 or 1, OpenAI's fine-tuning format) and ``"train"`` (true/false):
  0 / false makes the turn context, shown but never trained. Any other value, or the
  two disagreeing, is rejected as ``invalid_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import RecordError
from .media import MEDIA_PARTS, MEDIA_ROLES, check_text, part_ref
from .turns import MEDIA_MARK, MediaRef, Turn
from .values import json_kind

REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
REASONING_PARTS = ("reasoning", "thinking")
REASONING_PART_KEYS = ("thinking", "reasoning", "text", "value", "content")
ASSISTANT_PARTS = ("refusal", "tool_call") + REASONING_PARTS
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def shown(value: Any) -> str:
    """A JSON value as a user wrote it, cut to 40 characters, for messages."""
    try:
        text = orjson.dumps(value).decode("utf-8")
    except TypeError:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class Content:
    """What a message's content holds: its text, its media items (user and system
    messages; each stands at one ``MEDIA_MARK`` of the text), and (assistant messages)
    the reasoning and call parts, in order."""

    text: str = ""
    media: list[MediaRef] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[Any] = field(default_factory=list)  # values of tool_call parts
    refusal: bool = False


def _first_str(part: dict, keys: tuple[str, ...]) -> str | None:
    return next((part[k] for k in keys if isinstance(part.get(k), str)), None)


def read_content(content: Any, where: str, index: int, role: str, media: bool = False) -> Content:
    """A message's content: a string, or a list of parts joined in order (table above).
    Media parts are read only with ``media`` (else refused as any other part is)."""
    if content is None:
        return Content()
    if isinstance(content, str):
        if MEDIA_MARK in content:  # the common case tested inline: no call, no message built
            check_text(content, f"message {index} content", where)
        return Content(content)
    if not isinstance(content, list):
        raise RecordError("non_text_content", f"message {index} content is {json_kind(content)}; "
                          f"expected a string or a list of text parts", where)
    out = Content()
    texts: list[str] = []
    for k, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            check_text(part, f"message {index} content part {k}", where)
            continue
        if not isinstance(part, dict):
            raise RecordError("non_text_content", f"message {index} content part {k} is {json_kind(part)}; only "
                              f"text parts are supported (drop or convert such parts)", where)
        kind = part.get("type", "text")
        if kind == "text":
            text = _first_str(part, ("text", "value"))
            if text is None:
                keys = ", ".join(sorted(map(str, part))) or "none"
                raise RecordError("non_text_content", f"message {index} content part {k} is a text part without "
                                  f"a 'text' string (keys: {keys}); give its text as \"text\"", where)
            check_text(text, f"message {index} content part {k}", where)
            texts.append(text)
            continue
        if media and kind in MEDIA_PARTS:
            out.media.append(part_ref(part, kind, role, where, index, k))
            texts.append(MEDIA_MARK)
            continue
        if kind not in ASSISTANT_PARTS:
            allowed = ("an assistant message holds text, reasoning/thinking, refusal and tool_call parts only"
                       if role == "assistant" else "only text, image and video parts are supported"
                       if media and role in MEDIA_ROLES else "only text parts are supported")
            raise RecordError("non_text_content", f"message {index} content part {k} is of type {kind!r}; "
                              f"{allowed} (drop or convert such parts)", where)
        if role != "assistant":
            raise RecordError("non_text_content", f"message {index} content part {k} is a {kind!r} part in a "
                              f"{role} message; only an assistant message holds such parts", where)
        if kind == "tool_call":
            value = part.get("value")
            value = part.get("text") if value is None else value  # a Parquet struct holds every key, some null
            if value is None:
                raise RecordError("invalid_tool_call", f"message {index} content part {k} is a tool_call part "
                                  f"without a 'value'; give the call as {{\"name\": ..., \"arguments\": {{...}}}} "
                                  f"or its JSON text", where)
            out.calls.append(value)
            continue
        keys = ("refusal", "text", "value") if kind == "refusal" else REASONING_PART_KEYS
        text = _first_str(part, keys)
        if text is None:
            have = ", ".join(sorted(map(str, part))) or "none"
            raise RecordError("non_text_content", f"message {index} content part {k} is a {kind!r} part without "
                              f"its text (keys: {have}); give it as \"{keys[0]}\"", where)
        check_text(text, f"message {index} content part {k}", where)
        if kind == "refusal":
            texts.append(text)
            out.refusal = True
        else:
            out.reasoning.append(text)
    out.text = "".join(texts)
    return out


def context_turn(role: str, content: Any, where: str, index: int, tool_call_id: str | None = None,
                 media: bool = False) -> Turn:
    """The turn of a message that is not the assistant's: its text and (with ``media``) media."""
    c = read_content(content, where, index, role, media)
    return Turn(role, c.text, tool_call_id=tool_call_id, media=tuple(c.media))


def top_system_text(value: Any, where: str) -> str:
    """A record's top-level ``system``: a string."""
    if not isinstance(value, str):
        raise RecordError("non_text_content", f"top-level 'system' is {json_kind(value)}, not a string", where)
    check_text(value, "top-level 'system'", where)
    return value


@dataclass
class AssistantMessage:
    text: str
    reasoning: str  # "" when none was given or it was blank
    calls: list[Any]  # values of tool_call parts
    trained: bool
    repairs: list[str]
    notes: list[str]  # per-turn counts: reasoning_empty


def read_weight(m: dict, where: str, index: int) -> bool:
    """True when the message is to be trained: ``weight`` 0/1 and ``train`` true/false."""
    weight, train = m.get("weight"), m.get("train")
    trained = True
    if weight is not None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight not in (0, 1):
            raise RecordError("invalid_weight", f"message {index} has weight {shown(weight)}; weight must be 0 (show "
                              f"the turn, do not train on it) or 1 (train on it)", where)
        trained = weight == 1
    if train is not None:
        if not isinstance(train, bool):
            raise RecordError("invalid_weight", f"message {index} has train {shown(train)}; train must be true or "
                              f"false", where)
        if weight is not None and train != trained:
            raise RecordError("invalid_weight", f"message {index} has weight {shown(weight)} and train "
                              f"{shown(train)}, which disagree; keep one", where)
        trained = train
    return trained


def _think_block(text: str, where: str, index: int) -> tuple[str, str] | None:
    """``(reasoning, reply)`` of content that starts with ``<think>``; None otherwise."""
    body = text.lstrip()
    if not body.startswith(THINK_OPEN):
        return None
    close = body.find(THINK_CLOSE, len(THINK_OPEN))
    if close < 0:
        raise RecordError("unclosed_think", f"message {index} starts with {THINK_OPEN} but never closes it with "
                          f"{THINK_CLOSE}; close the reasoning block, or remove the tag", where)
    return body[len(THINK_OPEN):close], body[close + len(THINK_CLOSE):].lstrip()


def read_assistant(m: dict, content: Any, where: str, index: int, media: bool = False) -> AssistantMessage:
    """Text, reasoning, call parts and the training flag of one assistant message (a
    media part refused as ``media_in_reply`` with ``media``)."""
    c = read_content(content, where, index, "assistant", media)
    text, repairs, notes = c.text, [], []
    given: list[tuple[str, str]] = []  # (where the reasoning came from, its text)
    for key in REASONING_FIELDS:
        v = m.get(key)
        if v is None:
            continue
        if not isinstance(v, str):
            raise RecordError("invalid_reasoning", f"message {index} has {key!r} that is {json_kind(v)}, not a "
                              f"string", where)
        check_text(v, f"message {index} {key!r}", where)
        given.append((repr(key), v))
    if c.reasoning:
        given.append(("reasoning parts", "\n\n".join(p.strip() for p in c.reasoning if p.strip())))
    block = _think_block(text, where, index)
    if block is not None:
        given.append((f"a {THINK_OPEN} block", block[0]))
        text = block[1]
        repairs.append("reasoning_from_think_tags")
    said = {}
    for source, r in given:
        if r.strip():
            said.setdefault(r.strip(), source)
    if len(said) > 1:
        raise RecordError("invalid_reasoning", f"message {index} gives its reasoning more than once, with different "
                          f"text ({', '.join(said.values())}); keep one", where)
    if given and not said:
        notes.append("reasoning_empty")
    refusal = m.get("refusal")
    if refusal is not None:
        if not isinstance(refusal, str):
            raise RecordError("non_text_content", f"message {index} has 'refusal' that is {json_kind(refusal)}, "
                              f"not a string", where)
        check_text(refusal, f"message {index} 'refusal'", where)
        if refusal.strip() and refusal != text:
            text = refusal if not text.strip() else text + "\n\n" + refusal
            c.refusal = True
    if c.refusal:
        repairs.append("refusal_as_reply")
    return AssistantMessage(text, next(iter(said), ""), c.calls, read_weight(m, where, index), repairs, notes)
