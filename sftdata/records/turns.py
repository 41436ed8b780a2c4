"""The normalised turns every record format becomes, their shared clean-up, and the
per-turn policies. Pure and I/O-free.

``normalise_turns`` is the clean-up chat and tool records share (system first, no empty
turns, merged runs, no dead tail, at least one trainable assistant turn); ``apply_policy``
applies ``--reasoning keep|last|drop`` and ``--train-on all|last`` and counts what each
assistant turn holds (``Conversation.turn_counts``). Parsing a record is the job of
``conversation`` (chat) and ``tools`` (tools); reading one message's content is
``content``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ..errors import RecordError
from .values import json_kind

Role = Literal["system", "user", "assistant", "tool"]

USER_ALIASES = {"user": "user", "human": "user"}
ASSISTANT_ALIASES = {"assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant",
                     "bing": "assistant", "bard": "assistant", "model": "assistant"}
SYSTEM_ALIASES = {"system": "system", "developer": "system"}
TOOL_ROLES = {"tool", "function", "function_call", "observation", "ipython", "tool_call",
              "function_response"}
CHAT_ROLES = {**USER_ALIASES, **ASSISTANT_ALIASES, **SYSTEM_ALIASES}

@dataclass(frozen=True)
class ToolCall:
    """One function call made by the assistant; ``arguments`` is a parsed JSON object and
    ``text`` the JSON text the record gave it as (None when the record gave an object): a
    chat template that prints arguments as they are gets that text, unchanged."""

    name: str
    arguments: dict
    id: str | None = None
    text: str | None = field(default=None, compare=False)


MEDIA_MARK = "\ufffc"  # where a media item stands in a turn's text (U+FFFC, the object replacement character)


@dataclass(frozen=True)
class MediaRef:
    """One media item of a message, as the record names it: ``kind`` (``image`` or ``video``)
    and ``ref`` (a path, ``file://``, ``data:`` or fsspec URL, exactly as given; a part's
    ``base64`` as ``data:;base64,...``). Read from records by ``records.media``."""

    kind: str
    ref: str


@dataclass(frozen=True)
class Turn:
    """One turn. Assistant turns also carry ``reasoning`` ("" for none) and, when they are
    context (rendered, never trained), why: ``untrained`` is ``"weight_0"`` (marked by
    the record) or ``"train_on_last"`` (``--train-on last``); "" when trained. ``media``:
    the turn's images and videos in order, each standing at one ``MEDIA_MARK`` of ``text``."""

    role: Role
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning: str = ""
    untrained: str = ""
    media: tuple[MediaRef, ...] = ()


@dataclass(frozen=True)
class Conversation:
    """A validated conversation. ``tools`` holds function schemas (dicts with at least
    ``name``) rendered into the system span; ``repairs`` names what was fixed (counted
    per record); ``turn_counts`` holds one name per assistant turn event (counted per
    turn): ``reasoning_kept``, ``reasoning_dropped``, ``reasoning_empty``,
    ``reasoning_inline``, ``untrained_weight_0``, ``untrained_train_on_last``.

    What a model's chat template is given (it renders the record as given, and is given
    the repaired ``turns`` only where it cannot): ``given``, the turns before the
    structural repairs (``STRUCTURAL_REPAIRS``: same-role turns not merged, tool results
    in the record's order and not split; empty when they are ``turns``); ``tool_specs``,
    the tool schemas as the record gave them (every key; a bare function schema wrapped
    as ``{"type": "function", "function": ...}``); ``template_kwargs``, the record's
    ``chat_template_kwargs`` (variables for the template)."""

    turns: tuple[Turn, ...]
    tools: tuple[dict, ...] = ()
    repairs: tuple[str, ...] = field(default=())
    turn_counts: tuple[str, ...] = field(default=())
    given: tuple[Turn, ...] = ()
    tool_specs: tuple[dict, ...] = ()
    template_kwargs: dict | None = None

    @property
    def given_turns(self) -> tuple[Turn, ...]:
        """The turns as the record gave them (``given``, else ``turns``)."""
        return self.given or self.turns


REASONING_POLICIES = ("keep", "last", "drop", "inline")
TRAIN_ON = ("all", "last")
TURN_COUNTS = ("reasoning_kept", "reasoning_dropped", "reasoning_empty", "reasoning_inline",
               "reasoning_ignored_by_template", "untrained_weight_0", "untrained_train_on_last")
#: repairs that change a record's structure (sftdata's markers need them; a chat template is
#: given the record without them unless it cannot render it so: ``Conversation.given``)
STRUCTURAL_REPAIRS = ("merged_same_role", "reordered_tool_results", "split_tool_results", "leading_assistant_untrained")
THINK_INLINE = "<think>\n{reasoning}\n</think>\n\n{text}"


@dataclass(frozen=True)
class TurnPolicy:
    """``reasoning``: keep every turn's reasoning, only the final assistant turn's
    (``last``), none (``drop``), or every turn's written into its reply as text, a
    ``<think>`` block before it (``inline``). ``train_on``: every assistant turn the
    record allows (``all``), or only the last of them (``last``: the earlier ones become
    context)."""

    reasoning: str = "keep"
    train_on: str = "all"


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


TEMPLATE_KWARGS = "chat_template_kwargs"
#: what a chat template is given by sftdata itself, never by a record's variables
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt")


def read_template_kwargs(obj: dict, where: str) -> dict | None:
    """A record's ``chat_template_kwargs``: variables its chat template renders it with
    (over ``--template-var``); None when it has none."""
    value = obj.get(TEMPLATE_KWARGS)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise RecordError("invalid_template_kwargs", f"'{TEMPLATE_KWARGS}' is {json_kind(value)}; give an object of "
                          f"template variables, e.g. {{\"enable_thinking\": false}}", where)
    bad = [k for k in value if k in RESERVED_TEMPLATE_VARIABLES]
    if bad:
        raise RecordError("invalid_template_kwargs", f"'{TEMPLATE_KWARGS}' sets {bad[0]!r}, which sftdata gives the "
                          f"template itself; remove it", where)
    return dict(value) or None


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


def _merges(prev: Turn | None, t: Turn) -> bool:
    """Whether ``t`` joins the turn before it: two user turns, or two assistant turns of
    the same training flag where the first made no call and the second brings no
    reasoning of its own (reasoning stays in front of its reply)."""
    return (prev is not None and prev.role == t.role and t.role in ("user", "assistant") and not prev.tool_calls
            and prev.untrained == t.untrained and not t.reasoning)


def normalise_turns(turns: list[Turn], where: str, repairs: list[str],
                    given: set[str] | None = None, merge: bool = True) -> tuple[Turn, ...]:
    """Shared clean-up of chat and tool turns: system first, no empties, merged runs,
    no dead tail, at least one trainable assistant turn. Appends repair codes.

    ``given``: the roles the record held before any empty message was dropped (the
    rejection then says what was there); by default the roles of ``turns``. ``merge``:
    False keeps runs of same-role turns apart (the record as given, ``Conversation.given``)."""
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
    system = [t for t in system if t.text.strip()]
    if system:
        out.append(Turn("system", "\n\n".join(t.text for t in system), media=tuple(m for t in system for m in t.media)))
    kept: list[Turn] = []
    for t in body:
        if not t.text.strip() and not t.tool_calls and not t.reasoning and t.role != "tool":
            repairs.append("dropped_empty_turn")
            continue
        prev = kept[-1] if kept else None
        if merge and _merges(prev, t):
            repairs.append("merged_same_role")
            text = prev.text + "\n\n" + t.text if prev.text and t.text else prev.text or t.text
            kept[-1] = replace(prev, text=text, tool_calls=t.tool_calls, tool_call_id=None, media=prev.media + t.media)
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
    if not any(t.role == "assistant" and not t.untrained for t in kept[first_ctx:]):
        raise RecordError("no_trainable_turn", "every assistant message after the first user message (or tool "
                          "result) has weight 0 or train false, so nothing would be trained", where)
    if kept[0].role == "assistant":
        repairs.append("leading_assistant_untrained")
    return tuple(out + kept)


def normalise_given(raw: list[Turn], turns: tuple[Turn, ...], where: str, roles: set[str],
                    repairs: list[str]) -> tuple[Turn, ...]:
    """``Conversation.given``: the clean-up of ``raw`` (the turns before the structural
    repairs) without merging runs; empty when it equals ``turns`` (as it does when
    ``repairs`` names no structural repair)."""
    if not any(r in STRUCTURAL_REPAIRS[:3] for r in repairs):
        return ()
    try:
        given = normalise_turns(raw, where, [], roles, merge=False)
    except RecordError:  # not expected (the same checks as ``turns``'); the repaired turns are then what there is
        return ()
    return () if given == turns else given


def apply_policy(conv: Conversation, policy: TurnPolicy, where: str) -> Conversation:
    """``--reasoning`` and ``--train-on`` over a normalised conversation (its ``turns`` and,
    alike, its ``given`` turns), and the per-turn counts of what the episode holds
    (``Conversation.turn_counts``).

    A turn left with nothing but the reasoning the policy removed is dropped like any
    empty turn (``dropped_empty_turn``); ``--reasoning inline`` writes each turn's
    reasoning into its reply (``THINK_INLINE``); ``--train-on last`` trains the last
    assistant turn the record allows to be trained, the earlier ones become context."""
    repairs, counts = list(conv.repairs), list(conv.turn_counts)
    turns = _policy_turns(list(conv.turns), policy, where, repairs, counts)
    given = _policy_turns(list(conv.given), policy, where, [], [], merge=False) if conv.given else ()
    if not counts and len(repairs) == len(conv.repairs):  # nothing to say: nothing changed (plain text)
        return conv
    return replace(conv, turns=tuple(turns), repairs=tuple(repairs), turn_counts=tuple(counts),
                   given=() if tuple(given) == tuple(turns) else tuple(given))


def _policy_turns(turns: list[Turn], policy: TurnPolicy, where: str, repairs: list[str],
                  counts: list[str], merge: bool = True) -> list[Turn]:
    asst = [i for i, t in enumerate(turns) if t.role == "assistant"]
    if policy.reasoning == "inline":
        for i in asst:
            t = turns[i]
            if t.reasoning:
                turns[i] = replace(t, text=THINK_INLINE.format(reasoning=t.reasoning, text=t.text), reasoning="")
                counts.append("reasoning_inline")
    elif policy.reasoning != "keep" and any(turns[i].reasoning for i in asst):
        emptied = []
        for i in asst:
            t = turns[i]
            if t.reasoning and (policy.reasoning == "drop" or i != asst[-1]):
                turns[i] = replace(t, reasoning="")
                counts.append("reasoning_dropped")
                if not t.text.strip() and not t.tool_calls:
                    emptied.append(i)
        if len(emptied) == len(asst):
            raise RecordError("empty_assistant_turn", "every assistant message holds only reasoning, which "
                              "--reasoning drop removes, so nothing would be trained", where)
        if emptied:
            turns = list(normalise_turns(turns, where, repairs, merge=merge))
            asst = [i for i, t in enumerate(turns) if t.role == "assistant"]
    if policy.train_on == "last":
        first_ctx = next(i for i, t in enumerate(turns) if t.role in ("user", "tool"))
        trained = [i for i in asst if i > first_ctx and not turns[i].untrained]
        for i in trained[:-1]:
            turns[i] = replace(turns[i], untrained="train_on_last")
    for i in asst:
        t = turns[i]
        if t.reasoning:
            counts.append("reasoning_kept")
        if t.untrained:
            counts.append("untrained_" + t.untrained)
    return turns
