"""A ``Conversation`` as the message dicts chat templates read (the OpenAI / Hugging Face
shape, as transformers' ``apply_chat_template`` passes them), and how a template wants
tool-call arguments and message content.

    {"role": "assistant", "content": "4.", "thinking": "2 and 2.", "reasoning_content": "2 and 2."}
    {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    {"role": "tool", "content": "18C", "tool_call_id": "c1", "name": "get_weather"}

* Reasoning is a field, never text in the content: ``reasoning_content``, and ``thinking``
  beside it (transformers fills both, gpt-oss templates read ``thinking``).
* Tool calls keep the record's id; ``arguments`` is a dict (Hugging Face's convention,
  most templates ``| tojson`` it) or, for a template that prints arguments as they are,
  the JSON text exactly as the record gave it (``ToolCall.text``), as ``arguments_style``
  found the template expects. A call-only message's ``content`` is "" (a null or missing
  content makes many templates fail, Qwen3's among them).
* A tool result carries the called function's ``name`` (matched by id, else by position)
  for templates that print it.
* Content is a string, or ``[{"type": "text", "text": ...}]`` for a template that reads
  only content parts (``content_style``).
* Tools are the record's schemas with every key (``Conversation.tool_specs``).
* A turn with media is content parts in order, as transformers passes the OpenAI form:
  ``[{"type": "image"}, {"type": "text", "text": "What is this?"}]`` (no empty text part).
"""

from __future__ import annotations

import json
from typing import Literal

from ..errors import TemplateError, TemplateLimitError
from ..records.conversation import Conversation
from ..records.turns import MEDIA_MARK, Turn
from .environment import render
from .limits import DEFAULT_LIMITS, TemplateLimits

ArgumentsStyle = Literal["dict", "string"]
ContentStyle = Literal["string", "parts"]

_PROBE_ARGS = {"city": "Paris", "days": 2}
_PROBE_TEXT = "What is the weather like?"


def tool_schemas(conv: Conversation) -> list[dict] | None:
    """The tool schemas a template is given: the record's own (every key), else the
    canonical ones of a conversation built without them."""
    if conv.tool_specs:
        return list(conv.tool_specs)
    if not conv.tools:
        return None
    return [{"type": "function", "function": dict(t)} for t in conv.tools]


def _content(text: str, style: ContentStyle):
    return [{"type": "text", "text": text}] if style == "parts" else text


def media_parts(turn: Turn) -> list[dict]:
    """A turn with media as content parts: its text between the items, and each item's part."""
    pieces = turn.text.split(MEDIA_MARK)
    out: list[dict] = [{"type": "text", "text": pieces[0]}] if pieces[0] else []
    for ref, piece in zip(turn.media, pieces[1:]):
        out.append({"type": ref.kind})
        if piece:
            out.append({"type": "text", "text": piece})
    return out


def conversation_messages(conv: Conversation, arguments: ArgumentsStyle = "dict", content: ContentStyle = "string",
                          turns: tuple[Turn, ...] | None = None) -> list[dict]:
    """The message dicts for ``turns`` (default: the record's turns as given,
    ``Conversation.given_turns``); fresh objects: a caller may change them."""
    out: list[dict] = []
    pending: list[tuple[str | None, str]] = []  # (id, name) of calls not yet answered
    for turn in conv.given_turns if turns is None else turns:
        if turn.role == "assistant":
            msg: dict = {"role": "assistant", "content": _content(turn.text, content)}
            if turn.tool_calls:
                calls = []
                for call in turn.tool_calls:
                    if arguments == "dict":
                        args = call.arguments
                    else:
                        args = call.text if call.text is not None else json.dumps(call.arguments, ensure_ascii=False)
                    entry: dict = {} if call.id is None else {"id": call.id}
                    entry.update(type="function", function={"name": call.name, "arguments": args})
                    calls.append(entry)
                    pending.append((call.id, call.name))
                msg["tool_calls"] = calls
            if turn.reasoning:  # as transformers' _alias_reasoning_fields passes it
                msg = {"thinking": turn.reasoning, **msg, "reasoning_content": turn.reasoning}
            out.append(msg)
        elif turn.role == "tool":
            msg = {"role": "tool", "content": _content(turn.text, content)}
            match = next((i for i, (cid, _) in enumerate(pending) if turn.tool_call_id and cid == turn.tool_call_id),
                         0 if pending else None)
            if match is not None:
                msg["name"] = pending.pop(match)[1]
            if turn.tool_call_id is not None:
                msg["tool_call_id"] = turn.tool_call_id
            out.append(msg)
        else:
            out.append({"role": turn.role, "content": media_parts(turn) if turn.media else _content(turn.text, content)})
    return out


def _probe_text(compiled, msgs: list[dict], name: str, variables: dict | None, limits: TemplateLimits) -> str | None:
    """The render of a probe conversation, or None where the template refuses it; a template
    that runs past its limits is refused, never taken as refusing the probe."""
    try:
        return render(compiled, msgs, variables=variables, name=name, limits=limits).text
    except TemplateLimitError:
        raise
    except TemplateError:
        return None


def arguments_style(compiled, name: str, variables: dict | None = None,
                    limits: TemplateLimits = DEFAULT_LIMITS) -> tuple[ArgumentsStyle, str]:
    """Whether the template expects tool-call arguments as a dict or as JSON text, and why.

    Renders one call both ways: a dict printed as a Python repr means the template prints
    arguments as they are (give it text); JSON text escaped again means it ``tojson``s them
    (give it a dict); the same render both ways means it accepts either (dict)."""
    def probe(args) -> str | None:
        return _probe_text(compiled, [{"role": "user", "content": "What is the weather?"},
                                      {"role": "assistant", "content": "", "tool_calls": [
                                          {"type": "function", "id": "call_1",
                                           "function": {"name": "get_weather", "arguments": args}}]}],
                           name, variables, limits)

    as_dict = probe(dict(_PROBE_ARGS))
    as_text = probe(json.dumps(_PROBE_ARGS))
    if as_dict is None and as_text is None:
        return "dict", "the template renders no tool call; arguments would be given as a dict"
    if as_dict is None:
        return "string", "the template fails on dict arguments and renders JSON text"
    if as_text is None:
        return "dict", "the template fails on JSON-text arguments and renders a dict"
    if as_dict == as_text:
        return "dict", "the template renders dict and JSON-text arguments the same"
    if str(_PROBE_ARGS) in as_dict:
        return "string", "the template prints arguments as they are (a dict would appear as a Python repr)"
    if '\\"city\\"' in as_text:
        return "dict", "the template serialises arguments with tojson (JSON text would be escaped twice)"
    return "dict", "no difference found that decides; dict is Hugging Face's convention"


def content_style(compiled, name: str, variables: dict | None = None,
                  limits: TemplateLimits = DEFAULT_LIMITS) -> tuple[ContentStyle, str]:
    """Whether the template reads message content as a string or only as a list of text
    parts, and why: a user message rendered both ways; the way whose text appears wins,
    a string where both do (or neither: the template then fails on records anyway)."""
    def probe(content) -> str | None:
        reply = "Sunny." if isinstance(content, str) else [{"type": "text", "text": "Sunny."}]  # the same form
        return _probe_text(compiled, [{"role": "user", "content": content}, {"role": "assistant", "content": reply}],
                           name, variables, limits)

    as_string = probe(_PROBE_TEXT)
    if as_string is not None and _PROBE_TEXT in as_string:
        return "string", "the template renders string content"
    as_parts = probe([{"type": "text", "text": _PROBE_TEXT}])
    if as_parts is not None and _PROBE_TEXT in as_parts:
        return "parts", "the template renders content given as text parts only"
    return "string", "the template renders neither form of a user message's text; string is the convention"
