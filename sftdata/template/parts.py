"""Whether a template's render holds every part of a record it must carry: nothing the user
marked for training (a reply's text, its reasoning, its tool calls) may be dropped or
emptied, nor what a trained reply answers (tool results, tool schemas). Generic: no
knowledge of any template, each part's text (or its JSON) must occur in the render.

    >>> missing_part(text, messages, {4: (120, 188)}, tools)   # None, or (reason, what is lost)
    ('template_drops_tool_calls', "assistant message 4's call 'get_weather'")

* a reply's text (stripped: templates trim), its ``reasoning_content``, and each call's
  name and each key and value of its arguments must occur in the reply's span (a string
  as written or JSON-escaped; a number, boolean or null as JSON or as Python writes it);
* each tool result's text must occur in the render, as must each tool's name, its
  description and the names of its parameters, outside the replies' spans: a template
  that renders no schema (DeepSeek V3.1) still writes a called function's name and
  argument names in the call, which is not the schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import orjson

#: the reason code of each kind of part a render may lose
DROPS = {"reply": "template_drops_reply", "reasoning": "template_drops_reasoning",
         "tool_calls": "template_drops_tool_calls", "tool_results": "template_drops_tool_results",
         "tools": "template_drops_tools"}


def _forms(value) -> Iterator[str]:
    """The ways a template may write a leaf value."""
    if isinstance(value, str):
        text = value.strip()
        yield text
        yield json.dumps(text, ensure_ascii=False)[1:-1]
        yield json.dumps(text)[1:-1]
    elif value is None:
        yield from ("null", "None")
    elif isinstance(value, bool):
        yield from (("true", "True") if value else ("false", "False"))
    else:
        yield json.dumps(value)
        yield str(value)


def _found(value, window: str) -> bool:
    return not (value.strip() if isinstance(value, str) else True) or any(f in window for f in _forms(value))


def _leaves(value) -> Iterator:
    """Every key and leaf value of a JSON value."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield k
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # text parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return ""


def _arguments(raw):
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


def missing_reply_part(message: dict, window: str, k: int) -> tuple[str, str] | None:
    """The first part of assistant message ``k`` that its span ``window`` does not hold."""
    if not _found(_text(message.get("content")), window):
        return DROPS["reply"], f"assistant message {k}'s text"
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and not _found(reasoning, window):
        return DROPS["reasoning"], f"assistant message {k}'s reasoning"
    for call in message.get("tool_calls") or ():
        fn = call.get("function", call) if isinstance(call, dict) else {}
        name = fn.get("name")
        if isinstance(name, str) and not _found(name, window):
            return DROPS["tool_calls"], f"assistant message {k}'s call {name!r}"
        for leaf in _leaves(_arguments(fn.get("arguments"))):
            if not _found(leaf, window):
                return DROPS["tool_calls"], f"assistant message {k}'s call {name!r} (its argument text {leaf!r})"
    return None


def _outside(text: str, spans: Mapping[int, tuple[int, int]]) -> str:
    """``text`` with each reply's span cut out (a NUL where it was)."""
    out, at = [], 0
    for a, b in sorted(v for k, v in spans.items() if k >= 0):
        if a >= at:
            out += [text[at:a], "\x00"]
        at = max(at, b)
    return "".join(out) + text[at:]


def missing_context_part(text: str, messages: list[dict], tools: list[dict] | None,
                         schema_text: str | None = None) -> tuple[str, str] | None:
    """The first tool result or tool schema of ``messages`` and ``tools`` that ``text`` does
    not hold (a schema is looked for in ``schema_text``: the render less the replies' spans)."""
    for i, m in enumerate(messages):
        if m.get("role") == "tool" and not _found(_text(m.get("content")), text):
            return DROPS["tool_results"], f"the tool result of message {i}"
    schema_text = text if schema_text is None else schema_text
    for spec in tools or ():
        fn = spec.get("function", spec) if isinstance(spec, Mapping) else {}
        name = fn.get("name")
        if isinstance(name, str) and name not in schema_text:
            return DROPS["tools"], f"the tool schema {name!r}"
        description = fn.get("description")
        if isinstance(description, str) and not _found(description, schema_text):
            return DROPS["tools"], f"the tool schema {name!r} (its description)"
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, Mapping) else None
        for p in props if isinstance(props, Mapping) else ():
            if p not in schema_text:
                return DROPS["tools"], f"the tool schema {name!r} (its parameter {p!r})"
    return None


def missing_part(text: str, messages: list[dict], spans: Mapping[int, tuple[int, int]],
                 tools: list[dict] | None) -> tuple[str, str] | None:
    """``(reason, what)`` of the first part ``text`` does not hold, or None. ``spans``: each
    trained assistant message's ``(start, end)`` in ``text`` (its parts are looked for
    there); ``-1`` keys a span that no message owns (``{% generation %}`` blocks): every
    trained message's parts are then looked for in the whole text."""
    whole = -1 in spans
    for k, m in enumerate(messages):
        if m.get("role") != "assistant" or (k not in spans and not whole):
            continue
        a, b = (0, len(text)) if whole else spans[k]
        found = missing_reply_part(m, text[a:b], k)
        if found is not None:
            return found
    return missing_context_part(text, messages, tools, text if whole else _outside(text, spans))
