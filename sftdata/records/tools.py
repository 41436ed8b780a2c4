"""Tool-calling records -> ``Conversation`` (parse + validate; pure, I/O-free).

Formats, detected per record (see docs/TOOLS.md for examples):

* OpenAI fine-tuning format: ``{"tools": [{"type": "function", "function": {name,
  description, parameters}}], "messages": [...]}``; assistant messages carry
  ``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments"}}``,
  ``arguments`` a JSON string or an object; ``content`` missing or null), results are
  ``{"role": "tool", "tool_call_id", "content"}``. The legacy ``functions`` /
  ``function_call`` / ``role: function`` form is read the same way.
* ShareGPT / glaive: ``{"tools": "<JSON list>" | [...], "conversations": [...]}`` with
  ``from`` in human / gpt / function_call / observation (results also as ``tool``),
  a function_call ``value`` being JSON ``{"name", "arguments"}`` (or a list of them).
* A record with neither calls nor results is a plain chat and is accepted.

Decisions (why: ids are never rendered, so the order of spans is the only link
between a call and its result; both formats must give the same tokens):

* Parallel calls: several calls in one assistant message, consecutive function_call
  turns, or consecutive call-only assistant messages form ONE assistant span with the
  calls in order. Their results follow as one ``<|TOOL|>`` span each, put in call
  order (matched by ``tool_call_id`` when given, else positionally); a reorder is the
  repair ``reordered_tool_results``.
* Tool schemas are normalised to ``{"name", "description", "parameters"}`` (other keys
  dropped, empty description omitted), kept in the given order.

Rejections (reason codes, counted by prepare): ``invalid_tools``,
``invalid_tool_call``, ``invalid_arguments``, ``unknown_function``,
``unknown_tool_call_id``, ``orphan_tool_result``, ``unanswered_tool_call``, plus the
chat ones (``no_assistant_turn`` when the assistant never speaks or calls, ...).
A final assistant call with no result after it is a legitimate training target.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import orjson

from ..errors import RecordError
from .content import context_turn, read_assistant, read_weight, top_system_text
from .exact_json import InexactJSON, check_exact, loads
from .media import media_lists, place_listed
from .turns import (
    ASSISTANT_ALIASES,
    SYSTEM_ALIASES,
    USER_ALIASES,
    Conversation,
    ToolCall,
    Turn,
    message_role,
    normalise_given,
    normalise_turns,
    raw_messages,
    read_template_kwargs,
    unknown_role,
)
from .values import json_kind

CALL_FROMS = {"function_call", "tool_call"}  # ShareGPT turns holding a call
RESULT_ROLES = {"tool", "observation", "function", "function_response", "ipython"}


def _loads(text: str) -> Any:
    """JSON text inside a record (arguments, a function_call value, tools), refusing a
    number that would be rendered changed. Raises orjson.JSONDecodeError or InexactJSON
    (both ValueErrors)."""
    value = loads(text)
    check_exact(value)
    return value


def str_id(v: Any) -> str | None:
    if isinstance(v, str):
        return v or None
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return None


def parse_tools(value: Any, where: str, key: str = "tools") -> tuple[dict, ...]:
    """Normalise a ``tools`` value (list, or JSON-encoded list) to canonical schemas.
    ``key`` names the record's key in messages (``tools``, or the legacy ``functions``)."""
    return parse_tool_specs(value, where, key)[0]


def parse_tool_specs(value: Any, where: str, key: str = "tools") -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """``parse_tools``' canonical schemas, and the schemas as the record gave them for a
    chat template (``Conversation.tool_specs``: every key kept; a bare function schema
    wrapped as ``{"type": "function", "function": schema}``, the form transformers'
    ``get_json_schema`` gives)."""
    if value is None or value == []:
        return (), ()
    if isinstance(value, str):
        if not value.strip():
            return (), ()
        try:
            value = loads(value)  # numbers are checked where they are kept (the parameters)
        except InexactJSON as e:
            raise RecordError("invalid_tools", f"{key!r}: {e}", where) from None
        except orjson.JSONDecodeError as e:
            raise RecordError("invalid_tools", f"{key!r} is a string but not valid JSON ({e}); give a "
                              f"list of function schemas or its JSON text", where) from None
        if value is None:
            return (), ()
    if not isinstance(value, list):
        raise RecordError("invalid_tools", f"{key!r} is {json_kind(value)}, expected a list of "
                          f"function schemas", where)
    out: list[dict] = []
    specs: list[dict] = []
    seen: set[str] = set()
    for k, entry in enumerate(value):
        fn = entry
        specs.append(entry if isinstance(entry, dict) and "function" in entry else {"type": "function", "function": entry})
        if isinstance(entry, dict) and "function" in entry:
            if entry.get("type", "function") != "function":
                raise RecordError("invalid_tools", f"tool {k} has type {entry.get('type')!r}; only "
                                  f"'function' tools are supported", where)
            fn = entry["function"]
        if not isinstance(fn, dict):
            raise RecordError("invalid_tools", f"tool {k} is {json_kind(fn)}, expected an object "
                              f"with 'name', 'description', 'parameters'", where)
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RecordError("invalid_tools", f"tool {k} has no 'name' string", where)
        if name in seen:
            raise RecordError("invalid_tools", f"tool {k} repeats the name {name!r}; each function "
                              f"must be declared once", where)
        seen.add(name)
        schema: dict = {"name": name}
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise RecordError("invalid_tools", f"tool {name!r} has a description that is not a string", where)
        if desc:
            schema["description"] = desc
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise RecordError("invalid_tools", f"tool {name!r} has 'parameters' that are "
                                  f"{json_kind(params)}; expected a JSON schema object", where)
            try:
                check_exact(params)
            except InexactJSON as e:
                raise RecordError("invalid_tools", f"tool {name!r}: {e}", where) from None
            schema["parameters"] = params
        out.append(schema)
    return tuple(out), tuple(specs)


def parse_arguments(raw: Any, name: str, where: str, index: int) -> dict:
    """A call's arguments as a dict: a JSON object, or its JSON text."""
    value = raw
    if isinstance(raw, str):
        try:
            value = _loads(raw)
        except InexactJSON as e:
            raise RecordError("invalid_arguments", f"message {index}: the arguments of call {name!r}: {e}",
                              where) from None
        except orjson.JSONDecodeError as e:
            shown = raw if len(raw) <= 60 else raw[:57] + "..."
            raise RecordError("invalid_arguments", f"message {index}: the arguments of call {name!r} are "
                              f"not valid JSON ({e}): {shown!r}; write them as a JSON object "
                              f"('{{}}' for none)", where) from None
    elif isinstance(raw, dict):  # read with the record: check what _loads checks for JSON text
        try:
            check_exact(raw)
        except InexactJSON as e:
            raise RecordError("invalid_arguments", f"message {index}: the arguments of call {name!r}: {e}",
                              where) from None
    if not isinstance(value, dict):
        raise RecordError("invalid_arguments", f"message {index}: the arguments of call {name!r} are "
                          f"{json_kind(value)}, not an object; wrap them as {{\"param\": value}}",
                          where)
    return value


def read_call(fn: Any, call_id: Any, where: str, index: int) -> ToolCall:
    """One ``{"name", "arguments"}`` object as a ToolCall."""
    if not isinstance(fn, dict):
        raise RecordError("invalid_tool_call", f"message {index}: a call is {json_kind(fn)}, "
                          f"expected an object with 'name' and 'arguments'", where)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RecordError("invalid_tool_call", f"message {index}: a call has no 'name' string", where)
    if "arguments" not in fn:
        raise RecordError("invalid_tool_call", f"message {index}: call {name!r} has no 'arguments' "
                          f"(use {{}} for a call without arguments)", where)
    raw = fn["arguments"]
    return ToolCall(name, parse_arguments(raw, name, where, index), str_id(call_id), raw if isinstance(raw, str) else None)


def openai_calls(m: dict, where: str, index: int) -> tuple[ToolCall, ...]:
    calls = m.get("tool_calls")
    out: list[ToolCall] = []
    if calls is not None:
        if not isinstance(calls, list):
            raise RecordError("invalid_tool_call", f"message {index}: 'tool_calls' is "
                              f"{json_kind(calls)}, expected a list", where)
        for c in calls:
            if isinstance(c, dict) and isinstance(c.get("function"), dict):
                if c.get("type", "function") != "function":
                    raise RecordError("invalid_tool_call", f"message {index}: a call has type "
                                      f"{c.get('type')!r}; only 'function' calls are supported", where)
                out.append(read_call(c["function"], c.get("id"), where, index))
            else:
                out.append(read_call(c, c.get("id") if isinstance(c, dict) else None, where, index))
    legacy = m.get("function_call")
    if legacy is not None:
        out.append(read_call(legacy, None, where, index))
    return tuple(out)


def sharegpt_calls(value: Any, where: str, index: int) -> tuple[ToolCall, ...]:
    if isinstance(value, str):
        try:
            value = loads(value)  # the arguments' numbers are checked by parse_arguments
        except InexactJSON as e:
            raise RecordError("invalid_tool_call", f"message {index}: the function_call value: {e}",
                              where) from None
        except orjson.JSONDecodeError as e:
            raise RecordError("invalid_tool_call", f"message {index}: the function_call value is not "
                              f"valid JSON ({e}); expected {{\"name\": ..., \"arguments\": {{...}}}}",
                              where) from None
    items = value if isinstance(value, list) else [value]
    if not items:
        raise RecordError("invalid_tool_call", f"message {index}: the function_call value is an empty list",
                          where)
    return tuple(read_call(v, v.get("id") if isinstance(v, dict) else None, where, index) for v in items)


def _unknown_role(role_name: str, where: str, index: int) -> RecordError:
    return unknown_role(role_name, where, index, "user/human, assistant/gpt, system, function_call, "
                                                 "tool/observation/function (results)")


def _same_weight(prev: Turn, t: Turn, j: int, i: int, where: str) -> None:
    """Parallel calls are one assistant turn: trained together or not at all."""
    if prev.untrained != t.untrained:
        raise RecordError("invalid_weight", f"messages {j} and {i} are parallel calls of one assistant turn, but only "
                          f"one has weight 0 (or train false); give them the same weight", where)


def _read_turns(obj: dict, msgs: list[dict], fmt: str, where: str, counts: list[str], repairs: list[str],
                media: bool = False) -> list[tuple[int, Turn, tuple[int, ...]]]:
    """Format-specific reading: (message index, turn, the message index of each of its
    calls) triples, before any validation. Appends per-turn counts (empty reasoning) and
    repairs made while reading."""
    turns: list[tuple[int, Turn, tuple[int, ...]]] = []
    prev_function_call = False
    lists = media_lists(obj, where, media)
    top_system = obj.get("system")
    if top_system is not None:
        turns.append((-1, Turn("system", top_system_text(top_system, where)), ()))
    for i, m in enumerate(msgs):
        role_name = message_role(m, fmt)
        content = m.get("content") if fmt == "openai" else m.get("value", m.get("content"))
        if fmt == "sharegpt" and role_name in CALL_FROMS:
            calls = sharegpt_calls(content, where, i)
            turn = Turn("assistant", "", calls, untrained="" if read_weight(m, where, i) else "weight_0")
            if prev_function_call:  # consecutive function_call turns: the format's parallel calls
                j, prev, at = turns[-1]
                _same_weight(prev, turn, j, i, where)
                turns[-1] = (j, Turn("assistant", "", prev.tool_calls + calls, untrained=prev.untrained),
                             at + (i,) * len(calls))
            else:
                turns.append((i, turn, (i,) * len(calls)))
            prev_function_call = True
            continue
        prev_function_call = False
        if role_name in USER_ALIASES or role_name in SYSTEM_ALIASES:
            role = USER_ALIASES.get(role_name) or SYSTEM_ALIASES[role_name]
            turns.append((i, context_turn(role, content, where, i, media=media), ()))
        elif role_name in ASSISTANT_ALIASES:
            a = read_assistant(m, content, where, i, media)
            calls = openai_calls(m, where, i) + tuple(c for v in a.calls for c in sharegpt_calls(v, where, i))
            counts += a.notes
            repairs += a.repairs
            turns.append((i, Turn("assistant", a.text if a.text.strip() or not calls else "", calls,
                                  reasoning=a.reasoning, untrained="" if a.trained else "weight_0"),
                          (i,) * len(calls)))
        elif role_name in RESULT_ROLES:
            turns.append((i, context_turn("tool", content, where, i, str_id(m.get("tool_call_id")), media), ()))
        else:
            raise _unknown_role(role_name, where, i)
    if lists or any(t.media for _, t, _ in turns):
        placed = place_listed([(i, t) for i, t, _ in turns], lists, where)
        turns = [(i, t, at) for (i, _, at), t in zip(turns, placed)]
    return turns


def _result_list(text: str, n: int) -> list[str] | None:
    """The ``n`` results of one tool message holding a JSON list of ``n`` items (LLaMA-Factory
    writes the results of ``n`` parallel calls so), each as text: a string item as it is,
    any other item as its JSON; None for any other text."""
    if not text.lstrip().startswith("["):
        return None
    try:
        items = loads(text)
    except ValueError:
        return None
    if not isinstance(items, list) or len(items) != n:
        return None
    return [x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in items]


def link_calls(turns: list[tuple[int, Turn, tuple[int, ...]]], tools: tuple[dict, ...], where: str,
               repairs: list[str]) -> tuple[list[Turn], list[Turn]]:
    """Check every call and result, merge parallel call messages, split one message holding
    the JSON list of the results of several calls into one result each, and put each run of
    results in the order of the calls they answer. Returns those turns, and the turns as
    the record gave them (nothing merged, split or reordered: ``Conversation.given``)."""
    names = {t["name"] for t in tools}
    out: list[Turn] = []
    given: list[Turn] = []
    keys: list[int] = []  # per out turn: index of the answered call in its group (tool turns)
    group: list[tuple[ToolCall, int]] = []  # calls of the current group and their message index
    pending: list[int] = []  # indices into group still waiting for a result

    def unanswered(at: int) -> RecordError:
        call, j = group[pending[0]]
        return RecordError("unanswered_tool_call", f"call {call.name!r} (message {j}) gets no tool result "
                           f"before message {at}; add its result, or end the conversation with the call",
                           where)

    for n, (i, t, call_at) in enumerate(turns):
        if t.role in ("user", "assistant") and not t.text.strip() and not t.tool_calls and not t.reasoning:
            repairs.append("dropped_empty_turn")
            continue
        after_calls = bool(out) and out[-1].role == "assistant" and bool(out[-1].tool_calls)
        if t.role == "tool":
            if not pending:
                raise RecordError("orphan_tool_result", f"message {i} is a tool result but no unanswered "
                                  f"call comes before it; drop it or add the call", where)
            results = [t]
            alone = n + 1 == len(turns) or turns[n + 1][1].role != "tool"
            if len(pending) > 1 and t.tool_call_id is None and alone:
                items = _result_list(t.text, len(pending))
                if items is not None:
                    results = [Turn("tool", x) for x in items]
                    repairs.append("split_tool_results")
            given.append(t)
            for r in results:
                if r.tool_call_id is not None:
                    match = [k for k in pending if group[k][0].id == r.tool_call_id]
                    if not match:
                        ids = ", ".join(repr(group[k][0].id) for k in pending)
                        raise RecordError("unknown_tool_call_id", f"message {i} answers tool_call_id "
                                          f"{r.tool_call_id!r}, which matches none of the unanswered calls "
                                          f"before it ({ids})", where)
                    k = match[0]
                else:
                    k = pending[0]
                pending.remove(k)
                out.append(r)
                keys.append(k)
            continue
        if t.role == "assistant" and t.tool_calls:
            for c in t.tool_calls:
                if names and c.name not in names:
                    known = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
                    raise RecordError("unknown_function", f"message {i} calls {c.name!r}, which is not in "
                                      f"'tools' ({known}); declare it or fix the call", where)
            given.append(t)
            if after_calls and not t.text.strip():  # a call-only message right after calls: parallel
                prev = out[-1]
                _same_weight(prev, t, group[-1][1], i, where)
                reasoning = "\n\n".join(r for r in (prev.reasoning, t.reasoning) if r)
                out[-1] = replace(prev, tool_calls=prev.tool_calls + t.tool_calls, reasoning=reasoning)
                repairs.append("merged_same_role")
            else:
                if pending:
                    raise unanswered(i)
                group = []
                out.append(t)
                keys.append(-1)
            group += list(zip(t.tool_calls, call_at))
            pending += range(len(group) - len(t.tool_calls), len(group))
            continue
        if pending:  # a user, system or assistant text message while calls wait for results
            raise unanswered(i)
        out.append(t)
        given.append(t)
        keys.append(-1)
    return _order_results(out, keys, repairs), given


def _order_results(out: list[Turn], keys: list[int], repairs: list[str]) -> list[Turn]:
    """Sort each run of consecutive tool turns by the index of the call it answers."""
    i = 0
    reordered = False
    while i < len(out):
        if out[i].role != "tool":
            i += 1
            continue
        j = i
        while j < len(out) and out[j].role == "tool":
            j += 1
        run = sorted(range(i, j), key=lambda p: keys[p])
        if run != list(range(i, j)):
            out[i:j] = [out[p] for p in run]
            reordered = True
        i = j
    if reordered:
        repairs.append("reordered_tool_results")
    return out


def parse_tool(obj: Any, where: str, media: bool = False) -> Conversation:
    """Normalise one tool-calling (or plain chat) record into a ``Conversation`` (``media``:
    as ``conversation.parse_record``)."""
    msgs, fmt = raw_messages(obj, where)
    key, raw_tools = "tools", obj.get("tools")
    if raw_tools is None or raw_tools == [] or (isinstance(raw_tools, str) and not raw_tools.strip()):
        key, raw_tools = "functions", obj.get("functions")
    tools, specs = parse_tool_specs(raw_tools, where, key)
    kwargs = read_template_kwargs(obj, where)
    repairs: list[str] = []
    counts: list[str] = []
    read = _read_turns(obj, msgs, fmt, where, counts, repairs, media)
    turns, given = link_calls(read, tools, where, repairs)
    roles = {t.role for _, t, _ in read}
    normal = normalise_turns(turns, where, repairs, given=roles)
    return Conversation(normal, tools, tuple(repairs), tuple(counts), given=normalise_given(given, normal, where, roles,
                        repairs), tool_specs=specs, template_kwargs=kwargs)
