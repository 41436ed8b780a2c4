"""A ``Conversation`` as the message dicts chat templates read (the OpenAI / Hugging Face
shape), and how a template wants tool-call arguments.

    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    {"role": "tool", "content": "18C", "tool_call_id": "c1", "name": "get_weather"}

``arguments`` is a dict (Hugging Face's convention, most templates ``| tojson`` it) or the
JSON text, as ``arguments_style`` found the template expects. A tool result carries the
called function's ``name`` (matched by id, else by position) for templates that print it.
Tools are ``{"type": "function", "function": {name, description, parameters}}``.
"""

from __future__ import annotations

import json
from typing import Literal

from ..errors import TemplateError, TemplateLimitError
from ..records.conversation import Conversation
from .environment import render
from .limits import DEFAULT_LIMITS, TemplateLimits

ArgumentsStyle = Literal["dict", "string"]

_PROBE_ARGS = {"city": "Paris", "days": 2}


def tool_schemas(conv: Conversation) -> list[dict] | None:
    if not conv.tools:
        return None
    return [{"type": "function", "function": dict(t)} for t in conv.tools]


def conversation_messages(conv: Conversation, arguments: ArgumentsStyle = "dict") -> list[dict]:
    """The message dicts for ``conv`` (fresh objects: a caller may change them)."""
    out: list[dict] = []
    pending: list[tuple[str | None, str]] = []  # (id, name) of calls not yet answered
    for turn in conv.turns:
        if turn.role == "assistant" and turn.tool_calls:
            calls = []
            for call in turn.tool_calls:
                args = call.arguments if arguments == "dict" else json.dumps(call.arguments, ensure_ascii=False)
                entry: dict = {"type": "function", "function": {"name": call.name, "arguments": args}}
                if call.id is not None:
                    entry["id"] = call.id
                calls.append(entry)
                pending.append((call.id, call.name))
            out.append({"role": "assistant", "content": _with_reasoning(turn), "tool_calls": calls})
        elif turn.role == "tool":
            msg: dict = {"role": "tool", "content": turn.text}
            match = next((i for i, (cid, _) in enumerate(pending) if turn.tool_call_id and cid == turn.tool_call_id),
                         0 if pending else None)
            if match is not None:
                msg["name"] = pending.pop(match)[1]
            if turn.tool_call_id is not None:
                msg["tool_call_id"] = turn.tool_call_id
            out.append(msg)
        else:
            out.append({"role": turn.role, "content": _with_reasoning(turn) if turn.role == "assistant" else turn.text})
    return out


def _with_reasoning(turn) -> str:
    """An assistant turn's text with its reasoning inline before it, as Qwen3 and DeepSeek-R1
    templates read it (a template that knows no reasoning renders it as part of the reply)."""
    return f"<think>\n{turn.reasoning}\n</think>\n\n{turn.text}" if turn.reasoning else turn.text


def arguments_style(compiled, name: str, variables: dict | None = None,
                    limits: TemplateLimits = DEFAULT_LIMITS) -> tuple[ArgumentsStyle, str]:
    """Whether the template expects tool-call arguments as a dict or as JSON text, and why.

    Renders one call both ways: a dict printed as a Python repr means the template prints
    arguments as they are (give it text); JSON text escaped again means it ``tojson``s them
    (give it a dict); the same render both ways means it accepts either (dict)."""
    def probe(args) -> str | None:
        msgs = [{"role": "user", "content": "What is the weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": args}}]}]
        try:
            return render(compiled, msgs, variables=variables, name=name, limits=limits).text
        except TemplateLimitError:
            raise
        except TemplateError:
            return None

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
