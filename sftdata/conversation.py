"""Conversations: the normalised turns every input format becomes, and the chat parser.

Pure and I/O-free: ``parse_record`` takes one decoded JSON value (or the raw bytes of
one JSONL line) and returns a ``Conversation`` or raises ``RecordError`` with a stable
reason code. Reading files is ``sources.py``'s job.

Chat record formats, detected per record:

* OpenAI / TRL: ``{"messages": [{"role": ..., "content": ...}, ...]}``; content is a
  string or a list of text parts (``{"type": "text", "text": ...}``, or ``"value"`` for
  ``"text"``), joined in order.
* ShareGPT: ``{"conversations": [{"from": ..., "value": ...}, ...]}`` with ``from`` in
  human/user, gpt/assistant/chatgpt/bing/bard/model, system.
* Either may carry a top-level ``"system"`` string.

What happens to messy records (each counted by reason, see docs/FORMAT.md):

=========================  ==========================================================
rejected                   invalid_json, invalid_utf8, not_an_object, no_messages,
                           unknown_role, non_text_content, misplaced_system,
                           empty_conversation, no_assistant_turn,
                           empty_assistant_turn, no_trainable_turn,
                           tool_conversation (chat mode)
repaired                   dropped_empty_turn (blank message removed),
                           merged_same_role (consecutive user or assistant turns
                           joined with a blank line), dropped_trailing_turns (turns
                           after the last assistant turn carry no target),
                           leading_assistant_untrained (a record that starts with
                           the assistant keeps that turn as untrained context)
=========================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from .errors import RecordError
from .exact_json import InexactJSON, loads

Role = Literal["system", "user", "assistant", "tool"]

USER_ALIASES = {"user": "user", "human": "user"}
ASSISTANT_ALIASES = {"assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant",
                     "bing": "assistant", "bard": "assistant", "model": "assistant"}
SYSTEM_ALIASES = {"system": "system", "developer": "system"}
TOOL_ROLES = {"tool", "function", "function_call", "observation", "ipython", "tool_call",
              "function_response"}
CHAT_ROLES = {**USER_ALIASES, **ASSISTANT_ALIASES, **SYSTEM_ALIASES}
MAX_JSON_DEPTH = 1024  # orjson's nesting limit


@dataclass(frozen=True)
class ToolCall:
    """One function call made by the assistant; ``arguments`` is a parsed JSON object."""

    name: str
    arguments: dict
    id: str | None = None


@dataclass(frozen=True)
class Turn:
    role: Role
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class Conversation:
    """A validated conversation. ``tools`` holds function schemas (dicts with at least
    ``name``) rendered into the system span; ``repairs`` names what was fixed."""

    turns: tuple[Turn, ...]
    tools: tuple[dict, ...] = ()
    repairs: tuple[str, ...] = field(default=())


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
        raise RecordError("invalid_json", f"not valid JSON ({e}); each line must hold one JSON "
                          f"object", where) from None


def _part_text(part: Any) -> str | None:
    """The text of one content part: a string, or a text part spelled ``{"type": "text",
    "text": ...}`` (OpenAI) or ``{"type": "text", "value": ...}``; None for anything else."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type", "text") == "text":
        for key in ("text", "value"):
            if isinstance(part.get(key), str):
                return part[key]
    return None


def _text_of(content: Any, where: str, index: int) -> str:
    """Message content as text: a string, or a list of text parts joined in order."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            text = _part_text(part)
            if text is not None:
                parts.append(text)
                continue
            if isinstance(part, dict) and part.get("type", "text") == "text":
                keys = ", ".join(sorted(map(str, part))) or "none"
                raise RecordError("non_text_content", f"message {index} content part {k} is a text part without "
                                  f"a 'text' string (keys: {keys}); give its text as \"text\"", where)
            what = f"of type {part.get('type')!r}" if isinstance(part, dict) else json_kind(part)
            raise RecordError("non_text_content", f"message {index} content part {k} is {what}; only "
                              f"text parts are supported (drop or convert such parts)", where)
        return "".join(parts)
    raise RecordError("non_text_content", f"message {index} content is {json_kind(content)}; "
                      f"expected a string or a list of text parts", where)


def raw_messages(obj: Any, where: str) -> tuple[list[dict], str]:
    """The message list of a record and its format name (``openai`` or ``sharegpt``)."""
    if not isinstance(obj, dict):
        raise RecordError("not_an_object", f"the record is {json_kind(obj)}, not an object "
                          f"with 'messages' or 'conversations'", where)
    if "messages" in obj:
        msgs, fmt = obj["messages"], "openai"
    elif "conversations" in obj:
        msgs, fmt = obj["conversations"], "sharegpt"
    else:
        keys = ", ".join(sorted(obj)[:6]) or "none"
        raise RecordError("no_messages", f"no 'messages' or 'conversations' list (keys: {keys})", where)
    if not isinstance(msgs, list):
        raise RecordError("no_messages", f"'{'messages' if fmt == 'openai' else 'conversations'}' is "
                          f"{json_kind(msgs)}, not a list of messages", where)
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise RecordError("not_an_object", f"message {i} is {json_kind(m)}, not an object", where)
    return msgs, fmt


def message_role(m: dict, fmt: str) -> str:
    """The lower-cased role name; ``repr`` of a role that is not a string, and
    ``"no 'role' key"`` (or ``'from'``) when there is none, for messages."""
    key = "role" if fmt == "openai" else "from"
    if key not in m and "role" not in m:
        return f"no {key!r} key"
    role = m.get(key, m.get("role") if fmt == "sharegpt" else None)
    return role.lower() if isinstance(role, str) else repr(role)


def unknown_role(role_name: str, where: str, index: int, known: str) -> RecordError:
    said = role_name if role_name.startswith("no '") else f"role {role_name}"
    return RecordError("unknown_role", f"message {index} has {said}; known roles: {known}", where)


def is_tool_record(obj: Any) -> bool:
    """True when a record carries tool schemas, calls or results."""
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
    return False


def normalise_turns(turns: list[Turn], where: str, repairs: list[str],
                    given: set[str] | None = None) -> tuple[Turn, ...]:
    """Shared clean-up of chat and tool turns: system first, no empties, merged runs,
    no dead tail, at least one trainable assistant turn. Appends repair codes.

    ``given``: the roles the record held before any empty message was dropped (the
    rejection then says what was there); by default the roles of ``turns``."""
    given = {t.role for t in turns} if given is None else given
    if not turns and not given:
        raise RecordError("empty_conversation", "the record has no messages", where)
    system = [t for t in turns if t.role == "system"]
    body = [t for t in turns if t.role != "system"]
    first_non_system = next((i for i, t in enumerate(turns) if t.role != "system"), len(turns))
    if any(t.role == "system" for t in turns[first_non_system:]):
        raise RecordError("misplaced_system", "a system message comes after the conversation started; "
                          "move it to the start or drop it", where)
    out: list[Turn] = []
    sys_text = "\n\n".join(t.text for t in system if t.text.strip())
    if sys_text:
        out.append(Turn("system", sys_text))
    kept: list[Turn] = []
    for t in body:
        if not t.text.strip() and not t.tool_calls and t.role != "tool":
            repairs.append("dropped_empty_turn")
            continue
        prev = kept[-1] if kept else None
        if prev is not None and prev.role == t.role and t.role in ("user", "assistant") \
                and not prev.tool_calls:
            repairs.append("merged_same_role")
            text = prev.text + "\n\n" + t.text if prev.text and t.text else prev.text or t.text
            kept[-1] = Turn(t.role, text, t.tool_calls, None)
            continue
        kept.append(t)
    if not kept:
        if not given - {"system"}:
            raise RecordError("no_assistant_turn", "the record holds only a system message (no user or "
                              "assistant message), so nothing would be trained", where)
        names = " and ".join(r for r in ("user", "assistant") if r in given)
        tail = "" if "assistant" in given else ", and there is no assistant message"
        raise RecordError("empty_conversation", f"every {names} message is empty{tail}", where)
    last_asst = max((i for i, t in enumerate(kept) if t.role == "assistant"), default=-1)
    if last_asst < 0:
        if "assistant" in given:
            raise RecordError("empty_assistant_turn", "every assistant message is empty (null or blank content), "
                              "so nothing would be trained", where)
        raise RecordError("no_assistant_turn", "no assistant message, so nothing would be trained", where)
    if last_asst < len(kept) - 1:
        repairs.append("dropped_trailing_turns")
        kept = kept[: last_asst + 1]
    first_ctx = next((i for i, t in enumerate(kept) if t.role in ("user", "tool")), None)
    if first_ctx is None or first_ctx > last_asst:
        raise RecordError("no_trainable_turn", "no assistant message comes after a user message (or a tool "
                          "result), so none has a context to learn from and nothing would be trained", where)
    if kept[0].role == "assistant":
        repairs.append("leading_assistant_untrained")
    return tuple(out + kept)


def parse_chat(obj: Any, where: str) -> Conversation:
    """Normalise one chat record (no tools) into a ``Conversation``."""
    msgs, fmt = raw_messages(obj, where)
    repairs: list[str] = []
    turns: list[Turn] = []
    top_system = obj.get("system")
    if top_system is not None:
        if not isinstance(top_system, str):
            raise RecordError("non_text_content", f"top-level 'system' is {json_kind(top_system)}, "
                              f"not a string", where)
        turns.append(Turn("system", top_system))
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
        turns.append(Turn(role, _text_of(m.get(text_key, m.get("content")), where, i)))
    return Conversation(normalise_turns(turns, where, repairs), (), tuple(repairs))


def has_weight_zero(obj: Any) -> bool:
    """True when an assistant message carries OpenAI's ``"weight": 0`` (do not train)."""
    msgs = obj.get("messages") if isinstance(obj, dict) else None
    return isinstance(msgs, list) and any(
        isinstance(m, dict) and m.get("weight") == 0 and m.get("role") == "assistant" for m in msgs)


def parse_record(raw: Any, where: str, mode: str = "chat") -> Conversation:
    """Decode (if bytes) and normalise one record. ``mode`` is ``chat`` or ``tool``.

    OpenAI's per-message ``"weight": 0`` cannot be expressed by the one mask rule (the
    mask must be re-derivable from the tokens): such turns are trained like any other,
    and the record is counted as ``weight_0_ignored`` so the summary says so."""
    obj = decode_json(raw, where) if isinstance(raw, (bytes, str)) else raw
    if mode == "chat":
        if is_tool_record(obj):
            raise RecordError("tool_conversation", "the record has tool schemas, calls or results; "
                              "prepare it with `sftdata prepare-tool`", where)
        conv = parse_chat(obj, where)
    elif mode == "tool":
        from .tool_format import parse_tool

        conv = parse_tool(obj, where)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    if has_weight_zero(obj):
        conv = replace(conv, repairs=conv.repairs + ("weight_0_ignored",))
    return conv
