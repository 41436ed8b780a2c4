"""The common tool-calling record read in one pass without the general parser (pure, I/O-free).

A *plain tool* record is what tool-calling datasets mostly hold, in either format:

* OpenAI: ``{"tools": [...], "messages": [...]}``, each message exactly ``role`` and
  ``content`` (a string), but an assistant message may carry ``tool_calls`` (its
  ``content`` then a string, null or missing) and a result (``role: tool``) a
  ``tool_call_id``;
* ShareGPT / glaive: ``{"tools": "<JSON list>" | [...], "conversations": [...]}``, each
  message exactly ``from`` and a string ``value``, a ``function_call`` turn holding a
  call;

no ``functions`` key, no media list (``images``, ``videos``, ``audios``), no text holding
``MEDIA_MARK``, an optional top-level ``system`` string, valid
``chat_template_kwargs`` (kept), and then: system messages
first, a user message next, no two user or two assistant turns in a row (but consecutive
``function_call`` turns, which are one turn's calls), every call's results right after it
in call order (by ``tool_call_id`` when given) before anything else, every call naming a
declared tool (when tools are declared), no blank user or assistant text without a call,
no reasoning or ``<think>``, and the last turn the assistant's. Its conversation is then
its messages as turns, with nothing repaired, counted or untrained: exactly what
``tools.parse_tool`` returns for it.

``plain_tool_conversation`` returns that conversation, or None for any other record (and
for a record one of whose schemas or calls is invalid), which the general parser then
reads (tests give both parsers many shapes and compare). It exists for speed: the
general parser reads every field a message could carry and repairs in separate passes.
"""

from __future__ import annotations

from typing import Any

from ..errors import RecordError
from .plain import has_media_lists, opens_thinking, template_kwargs, with_system
from .tools import CALL_FROMS, RESULT_ROLES, openai_calls, parse_tool_specs, sharegpt_calls, str_id
from .turns import ASSISTANT_ALIASES, MEDIA_MARK, SYSTEM_ALIASES, USER_ALIASES, Conversation, ToolCall, Turn

_OPENAI = {**USER_ALIASES, **ASSISTANT_ALIASES, **SYSTEM_ALIASES, **dict.fromkeys(RESULT_ROLES, "tool")}
_SHAREGPT = {**_OPENAI, **dict.fromkeys(CALL_FROMS, "call")}


def _messages(obj: Any) -> tuple[list, dict] | None:
    if type(obj) is not dict or "functions" in obj or has_media_lists(obj):
        return None
    if "messages" in obj:
        msgs, kinds = obj["messages"], _OPENAI
    elif "conversations" in obj:
        msgs, kinds = obj["conversations"], _SHAREGPT
    else:
        return None
    return (msgs, kinds) if type(msgs) is list else None


def plain_tool_conversation(obj: Any) -> Conversation | None:
    """The conversation of a plain tool record (module docstring), or None."""
    found = _messages(obj)
    if found is None:
        return None
    msgs, kinds = found
    kwargs = template_kwargs(obj)
    if kwargs is False:
        return None
    sharegpt = kinds is _SHAREGPT
    top = obj.get("system")
    if top is not None and (type(top) is not str or MEDIA_MARK in top):
        return None
    try:
        tools, specs = parse_tool_specs(obj.get("tools"), "")
    except RecordError:
        return None
    systems = [] if top is None else [top]
    read = _Turns({t["name"] for t in tools})
    for i, m in enumerate(msgs):
        message = _message(m, kinds, sharegpt)
        if message is None:
            return None
        kind, text, calls_value = message
        if kind == "system":
            if read.turns:  # after the conversation started: the general parser rejects it
                return None
            systems.append(text)
        elif not read.add(m, kind, text, calls_value, i, sharegpt):
            return None
    if read.last not in ("assistant", "call"):
        return None
    return with_system(systems, read.turns, tools, specs, kwargs)


def _message(m: Any, kinds: dict, sharegpt: bool) -> tuple[str, Any, Any] | None:
    """A message's kind (``kinds``' word for its role), text and OpenAI ``tool_calls``, or
    None where it holds anything but the keys its kind reads."""
    if type(m) is not dict:
        return None
    if sharegpt:
        role, text, calls_value = m.get("from"), m.get("value"), None
        if len(m) != 2 or type(role) is not str or type(text) is not str:
            return None
    else:
        role, text = m.get("role"), m.get("content")
        if type(role) is not str:
            return None
    kind = kinds.get(role) or kinds.get(role.lower())
    if kind is None or (type(text) is str and MEDIA_MARK in text):
        return None
    if not sharegpt:  # exactly the keys this kind reads; a string content (null beside calls)
        extra = "tool_calls" if kind == "assistant" else "tool_call_id" if kind == "tool" else None
        if len(m) != 1 + ("content" in m) + (extra in m) or (type(text) is not str and (
                text is not None or "tool_calls" not in m or kind != "assistant")):
            return None
        calls_value = m.get("tool_calls")
    return kind, text, calls_value


class _Turns:
    """The turns read so far; ``add`` takes the next non-system message, False where the
    record is not plain. ``pending``: the ids of the last calls still waiting for their
    results, in order; ``last``: the kind of the last turn."""

    __slots__ = ("names", "turns", "pending", "last")

    def __init__(self, names: set[str]):
        self.names = names
        self.turns: list[Turn] = []
        self.pending: list[str | None] = []
        self.last = ""

    def add(self, m: dict, kind: str, text: Any, calls_value: Any, i: int, sharegpt: bool) -> bool:
        if kind == "tool":
            return self._result(m, text, sharegpt)
        last = self.last
        if kind == "call" and last == "call" and len(self.pending) == len(self.turns[-1].tool_calls):
            return self._more_calls(text, i)
        if self.pending or kind == last or (kind == "call" and last == "assistant") or (
                kind == "assistant" and last == "call"):
            return False  # a call unanswered, or a run the general parser merges
        if kind == "user":
            if not text or text.isspace():
                return False
            self.turns.append(Turn("user", text))
            self.last = kind
            return True
        if not self.turns:  # a leading assistant turn: the general parser keeps it untrained
            return False
        return self._reply(m, kind, text, calls_value, i)

    def _result(self, m: dict, text: str, sharegpt: bool) -> bool:
        if not self.pending:
            return False
        call_id = None if sharegpt else str_id(m.get("tool_call_id"))
        if call_id is not None and self.pending[0] != call_id:  # answers a later call: reordered
            return False
        del self.pending[0]
        self.turns.append(Turn("tool", text, tool_call_id=call_id))
        self.last = "tool"
        return True

    def _more_calls(self, text: str, i: int) -> bool:
        """Consecutive function_call turns, none answered yet: the format's parallel calls."""
        try:
            calls = sharegpt_calls(text, "", i)
        except RecordError:
            return False
        if self.names and any(c.name not in self.names for c in calls):
            return False
        self.turns[-1] = Turn("assistant", "", self.turns[-1].tool_calls + calls)
        self.pending += [c.id for c in calls]
        return True

    def _reply(self, m: dict, kind: str, text: Any, calls_value: Any, i: int) -> bool:
        calls: tuple[ToolCall, ...] = ()
        try:
            if kind == "call":
                calls = sharegpt_calls(text, "", i)
                text = ""
            elif calls_value is not None:
                calls = openai_calls(m, "", i)
        except RecordError:
            return False
        text = text or ""
        if not calls:
            if not text or text.isspace():
                return False
        elif not text.strip():
            text = ""
        if calls and self.names and any(c.name not in self.names for c in calls):
            return False
        if opens_thinking(text):
            return False
        self.turns.append(Turn("assistant", text, calls))
        self.pending = [c.id for c in calls]
        self.last = "call" if calls else "assistant"
        return True
