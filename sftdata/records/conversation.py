"""Records to conversations: ``parse_record`` (any record, chat or tool) and the chat parser.

Pure and I/O-free: ``parse_record`` takes one decoded JSON value (or the raw bytes of
one JSONL line) and returns a ``Conversation`` or raises ``RecordError`` with a stable
reason code. Reading files is ``sources.py``'s job; reading one message's content
(typed parts, reasoning, refusal, weight) is ``content.py``'s; the turns, their
shared clean-up and the per-turn policies are ``turns.py``'s; tool records are
``tools.py``'s.

Chat record formats, detected per record:

* OpenAI / TRL: ``{"messages": [{"role": ..., "content": ...}, ...]}``; content is a
  string or a list of typed parts (``content``).
* ShareGPT: ``{"conversations": [{"from": ..., "value": ...}, ...]}`` with ``from`` in
  human/user, gpt/assistant/chatgpt/bing/bard/model, system.
* Either may carry a top-level ``"system"`` string.
* With ``media`` (``parse_record(..., media=True)``): images and videos as content parts,
  or as top-level ``images`` / ``videos`` lists with ``<image>`` / ``<video>`` placeholders
  (LLaMA-Factory) or bare ``{"type": "image"}`` parts (TRL) (``media``). Without it a record
  holding any is refused as ``non_text_content``, as before media were read.

An assistant turn carries its reasoning (rendered between ``<|THINK|>`` and
``<|END_THINK|>``) and whether it is trained (``weight: 0`` / ``train: false`` make it
context, rendered after ``<|ASSISTANT_CONTEXT|>``). ``TurnPolicy`` then applies
``--reasoning keep|last|drop`` and ``--train-on all|last``.

What happens to messy records (each counted by reason, see docs/FORMAT.md):

=========================  ==========================================================
rejected                   invalid_json, invalid_utf8, not_an_object, no_messages,
                           unknown_role, non_text_content, misplaced_system,
                           empty_conversation, no_assistant_turn,
                           empty_assistant_turn, no_trainable_turn,
                           tool_conversation (chat mode), invalid_reasoning,
                           unclosed_think, invalid_weight, reserved_character
                           (U+FFFC in text), invalid_media, media_in_reply,
                           media_placeholder_mismatch
repaired                   dropped_empty_turn (blank message removed),
                           merged_same_role (consecutive user or assistant turns
                           joined with a blank line), dropped_trailing_turns (turns
                           after the last assistant turn carry no target),
                           leading_assistant_untrained (a record that starts with
                           the assistant keeps that turn as untrained context),
                           reasoning_from_think_tags, refusal_as_reply
=========================  ==========================================================
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..errors import RecordError
from .content import context_turn, read_assistant, top_system_text
from .exact_json import InexactJSON, loads
from .media import media_lists, place_listed
from .plain import plain_conversation
from .plain_tools import plain_tool_conversation
from .tools import parse_tool
from .turns import (
    CHAT_ROLES,
    TOOL_ROLES,
    Conversation,
    ToolCall,
    Turn,
    TurnPolicy,
    apply_policy,
    message_role,
    normalise_given,
    normalise_turns,
    raw_messages,
    read_template_kwargs,
    unknown_role,
)

# the names other modules and tests import from here
__all__ = ["Conversation", "ToolCall", "Turn", "TurnPolicy", "decode_json", "is_tool_record", "parse_chat",
           "parse_record"]
MAX_JSON_DEPTH = 1024  # orjson's nesting limit
_ARRAY_ITEM = re.compile(r":item (\d+)$")  # the ``where`` of a JSON array's item (sources.records): "file:item N"
_AT = re.compile(r": line (\d+) column (\d+) \(char \d+\)$")  # orjson's position, in the text it was given


def _not_json(e: orjson.JSONDecodeError, where: str) -> str:
    """What is wrong with a record that is not JSON, said of what it is: a JSONL line, or
    an item of a JSON array (orjson's line and column are then the item's own)."""
    item = _ARRAY_ITEM.search(where or "")
    if item is None:
        return f"not valid JSON ({e}); each line must hold one JSON object"
    what = _AT.sub(lambda m: f" (line {m.group(1)}, column {m.group(2)} of the item's text)", str(e))
    return (f"item {item.group(1)} of the JSON array is not valid JSON: {what}; each item of the array must be one "
            f"JSON object (one record): fix that item, or remove it")


def decode_json(raw: bytes | str, where: str) -> Any:
    """Decode one JSON document, telling invalid UTF-8 from invalid JSON. Integers beyond
    64 bits stay exact (``exact_json``), so a tool call is never trained on a changed number."""
    try:
        return loads(raw)
    except InexactJSON as e:
        raise RecordError("invalid_json", f"{e}; flatten the record", where) from None
    except orjson.JSONDecodeError as e:
        if isinstance(raw, bytes):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as u:
                raise RecordError("invalid_utf8", f"invalid UTF-8 at byte {u.start} of the record; "
                                  f"re-encode the file as UTF-8", where) from None
        if "depth limit" in str(e):  # valid JSON, but deeper than the parser reads
            raise RecordError("invalid_json", f"the record is nested deeper than {MAX_JSON_DEPTH} levels, which "
                              f"sftdata does not read; flatten the record", where) from None
        raise RecordError("invalid_json", _not_json(e, where), where) from None


def is_tool_record(obj: Any) -> bool:
    """True when a record carries tool schemas, calls (also as ``tool_call`` content
    parts) or results."""
    if not isinstance(obj, dict):
        return False
    for key in ("tools", "functions"):
        v = obj.get(key)
        # glaive-style files write "no tools" as the JSON text "[]"
        if v and not (isinstance(v, str) and v.strip() in ("", "[]", "null")):
            return True
    msgs = obj.get("messages", obj.get("conversations"))
    if not isinstance(msgs, list):
        return False
    for m in msgs:
        if not isinstance(m, dict):
            continue
        role = m.get("role", m.get("from"))
        if isinstance(role, str) and role.lower() in TOOL_ROLES:
            return True
        if m.get("tool_calls") or m.get("function_call"):
            return True
        content = m.get("content", m.get("value"))
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "tool_call" for p in content):
            return True
    return False


def parse_chat(obj: Any, where: str, media: bool = False) -> Conversation:
    """Normalise one chat record (no tools) into a ``Conversation`` (``media``: as ``parse_record``)."""
    msgs, fmt = raw_messages(obj, where)
    repairs: list[str] = []
    counts: list[str] = []
    turns: list[Turn] = []
    at: list[int] = []  # each turn's message index (-1: the top-level system)
    top_system = obj.get("system")
    if top_system is not None:
        turns.append(Turn("system", top_system_text(top_system, where)))
        at.append(-1)
    kwargs = read_template_kwargs(obj, where)
    lists = media_lists(obj, where, media)
    text_key = "content" if fmt == "openai" else "value"
    for i, m in enumerate(msgs):
        role_name = message_role(m, fmt)
        role = CHAT_ROLES.get(role_name)
        if role is None:
            if role_name in TOOL_ROLES:
                raise RecordError("tool_conversation", f"message {i} has role {role_name!r}: this is a "
                                  f"tool-calling record; prepare it with `sftdata prepare-tool`", where)
            raise unknown_role(role_name, where, i, "user/human, assistant/gpt/chatgpt/bing/bard/model, "
                                                    "system/developer")
        content = m.get(text_key, m.get("content"))
        if role == "assistant":
            a = read_assistant(m, content, where, i, media)
            repairs += a.repairs
            counts += a.notes
            turns.append(Turn("assistant", a.text, reasoning=a.reasoning, untrained="" if a.trained else "weight_0"))
        else:
            turns.append(context_turn(role, content, where, i, media=media))
        at.append(i)
    if lists or any(t.media for t in turns):
        turns = place_listed(list(zip(at, turns)), lists, where)
    normal = normalise_turns(turns, where, repairs)
    return Conversation(normal, (), tuple(repairs), tuple(counts),
                        given=normalise_given(turns, normal, where, {t.role for t in turns}, repairs),
                        template_kwargs=kwargs)


def parse_record(raw: Any, where: str, mode: str = "chat", policy: TurnPolicy = TurnPolicy(),
                 media: bool = False) -> Conversation:
    """Decode (if bytes) and normalise one record. ``mode`` is ``chat`` or ``tool``;
    ``policy`` applies ``--reasoning`` and ``--train-on``; ``media``: read images and
    videos (``records.media``: ``Turn.media``) where the caller renders them; without it
    a record holding any is refused as ``non_text_content``, as before media were read."""
    obj = decode_json(raw, where) if isinstance(raw, (bytes, str)) else raw
    if mode in ("chat", "tool"):
        conv = plain_conversation(obj)  # the common shapes, in one pass (the same conversation)
        if conv is None and mode == "tool":
            conv = plain_tool_conversation(obj)
        if conv is not None:  # no reasoning and nothing untrained: only --train-on last changes it
            return apply_policy(conv, policy, where) if policy.train_on == "last" else conv
    if mode == "chat":
        if is_tool_record(obj):
            raise RecordError("tool_conversation", "the record has tool schemas, calls or results; "
                              "prepare it with `sftdata prepare-tool`", where)
        conv = parse_chat(obj, where, media)
    elif mode == "tool":
        conv = parse_tool(obj, where, media)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return apply_policy(conv, policy, where)
