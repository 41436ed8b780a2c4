"""Preference and RL records: one decoded JSON record -> its prompt and completions (pure, I/O-free).

``parse_preference(obj, where, form)`` returns a ``PreferenceRecord``: the prompt's
messages, the completions' messages (chosen and rejected, or KTO's one completion and
its label), and the record's other keys that rendering reads (``tools``, ``system``,
``chat_template_kwargs``). ``PreferenceRecord.conversations()`` gives one chat record per
completion, ``prompt + completion``, that ``conversation.parse_record`` reads like any
``prepare-chat`` record: every message spelling, tool call, tool result and reasoning
form it knows, with the same rejects and repairs.

Record forms (``--format``; ``auto`` tells them apart by their keys, record by record):

==================  =====================================================================
form                keys
==================  =====================================================================
trl                 ``prompt``, ``chosen``, ``rejected``: message lists (conversational),
                    or strings (standard: the prompt a user message, a completion an
                    assistant message); without ``prompt``, ``chosen`` and ``rejected``
                    are whole conversations and the prompt is their longest common prefix
                    of messages (implicit prompt), which must end right before an
                    assistant message in both
kto                 ``prompt``, ``completion``, ``label`` (true: desirable); or
                    ``messages`` + ``label`` (LLaMA-Factory's KTO: the last message is the
                    completion)
ultrafeedback       ``prompt`` or ``instruction``, ``completions``: a list of
                    ``{"response", "overall_score"}`` (also ``score``, ``rating``,
                    ``fine-grained_score``); chosen = the highest score, rejected = the
                    lowest, the first of equals
llamafactory        ``conversations`` (the prompt, from/value) and ``chosen``/``rejected``
                    (one message each, or a list); or Alpaca's ``instruction`` (+ ``input``)
                    with ``chosen``/``rejected`` strings
==================  =====================================================================

Rejected, by reason: ``not_preference_record`` (no form fits), ``invalid_preference``
(a field of the wrong kind), ``implicit_prompt_ambiguous`` (no common prefix ending before
an assistant message), ``implicit_prompt_in_text`` (standard rows without ``prompt``: a
split in text is what trl#1153 is about), ``identical_completions``, ``no_preference``
(all scores equal), ``invalid_label``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import RecordError
from .values import json_kind

FORMS = ("auto", "trl", "kto", "ultrafeedback", "llamafactory")
PREFERENCE_KEYS = frozenset(("prompt", "chosen", "rejected", "completion", "label", "completions", "conversations",
                             "messages", "instruction", "input", "score_chosen", "score_rejected"))
CARRIED_KEYS = ("tools", "functions", "system", "chat_template_kwargs")  # what rendering reads besides messages
SCORE_KEYS = ("overall_score", "score", "rating", "fine-grained_score")
RESPONSE_KEYS = ("response", "text", "content", "output")


@dataclass(frozen=True)
class PreferenceRecord:
    """``prompt``: message dicts; ``completions``: (chosen, rejected) or (completion,),
    each a tuple of message dicts; ``label``: KTO's (None for pairs); ``key``: the message
    list key the messages use (``messages``: role/content, ``conversations``: from/value);
    ``carried``: the record's keys rendering reads (tools, system, template variables)."""

    form: str
    prompt: tuple[dict, ...]
    completions: tuple[tuple[dict, ...], ...]
    label: bool | None = None
    key: str = "messages"
    carried: dict = field(default_factory=dict)

    def conversations(self) -> list[dict]:
        """One chat record per completion: ``prompt + completion`` with the carried keys."""
        return [{**self.carried, self.key: [*self.prompt, *c]} for c in self.completions]


def _bad(reason: str, message: str, where: str) -> RecordError:
    return RecordError(reason, message, where)


def _is_messages(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(m, dict) for m in v)


def _key_of(msgs) -> str:
    return "conversations" if any("from" in m and "role" not in m for m in msgs) else "messages"


def _role(m: dict) -> str:
    r = m.get("role", m.get("from"))
    r = r.lower() if isinstance(r, str) else ""
    return {"human": "user", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant", "bing": "assistant",
            "bard": "assistant"}.get(r, r)


def _user(text: str, key: str) -> dict:
    return {"from": "human", "value": text} if key == "conversations" else {"role": "user", "content": text}


def _assistant(text: str, key: str) -> dict:
    return {"from": "gpt", "value": text} if key == "conversations" else {"role": "assistant", "content": text}


def _messages(v: Any, name: str, as_role: str, key: str, where: str) -> tuple[dict, ...]:
    """A field holding messages: a list of message objects, one message object, or a
    string (then one ``as_role`` message)."""
    if isinstance(v, str):
        return (_user(v, key) if as_role == "user" else _assistant(v, key),)
    if isinstance(v, dict):
        return (v,)
    if _is_messages(v):
        return tuple(v)
    raise _bad("invalid_preference", f"'{name}' is {json_kind(v)}; give a string, a message object or a list of "
               f"message objects", where)


def _carried(obj: dict) -> dict:
    return {k: obj[k] for k in CARRIED_KEYS if k in obj}


def _one_key(values: list, where: str) -> str:
    """The one message spelling of ``values`` (message lists, message objects; strings
    take the spelling of the rest)."""
    parts = [(v,) if isinstance(v, dict) else v for v in values if isinstance(v, (list, tuple, dict))]
    keys = {_key_of(p) for p in parts if p and all(isinstance(m, dict) for m in p)}
    if len(keys) > 1:
        raise _bad("invalid_preference", "the prompt and the completions mix message spellings (role/content and "
                   "from/value); give every message in one spelling", where)
    return keys.pop() if keys else "messages"


def _implicit(chosen: list[dict], rejected: list[dict], where: str) -> tuple[tuple, tuple, tuple]:
    """The longest common prefix of messages as the prompt; it must end right before an
    assistant message in both (TRL's ``extract_prompt`` takes a prefix of one sequence that
    the other merely starts with as the prompt: trl#6960, #6472)."""
    k = 0
    while k < min(len(chosen), len(rejected)) and chosen[k] == rejected[k]:
        k += 1
    if k == len(chosen) and k == len(rejected):
        raise _bad("identical_completions", "'chosen' and 'rejected' are the same conversation; a pair needs two "
                   "different completions", where)
    if k == len(chosen) or k == len(rejected):
        which = "chosen" if k == len(chosen) else "rejected"
        raise _bad("implicit_prompt_ambiguous", f"'{which}' is the other conversation's first {k} message(s), so "
                   f"it has no completion of its own; give 'prompt' explicitly", where)
    if k == 0 or _role(chosen[k]) != "assistant" or _role(rejected[k]) != "assistant":
        raise _bad("implicit_prompt_ambiguous", f"'chosen' and 'rejected' first differ at message {k}, which is not "
                   f"an assistant message in both (after a shared prompt); give 'prompt' explicitly", where)
    return tuple(chosen[:k]), tuple(chosen[k:]), tuple(rejected[k:])


def _trl(obj: dict, where: str) -> PreferenceRecord:
    chosen, rejected = obj["chosen"], obj["rejected"]
    if "prompt" not in obj:
        if isinstance(chosen, str) and isinstance(rejected, str):
            raise _bad("implicit_prompt_in_text", "'chosen' and 'rejected' are texts with no 'prompt': splitting "
                       "their shared start as the prompt is a split in text, which merges tokens across it "
                       "(trl#1153); give 'prompt', or whole conversations as message lists", where)
        if not (_is_messages(chosen) and _is_messages(rejected)):
            raise _bad("invalid_preference", f"'chosen' is {json_kind(chosen)} and 'rejected' "
                       f"{json_kind(rejected)}; give two message lists (or 'prompt' with two completions)", where)
        prompt, c, r = _implicit(chosen, rejected, where)
        key = _one_key([prompt, c, r], where)
        return PreferenceRecord("trl", prompt, (c, r), key=key, carried=_carried(obj))
    key = _one_key([obj["prompt"], chosen, rejected], where)
    prompt = _messages(obj["prompt"], "prompt", "user", key, where)
    c = _messages(chosen, "chosen", "assistant", key, where)
    r = _messages(rejected, "rejected", "assistant", key, where)
    if c == r:
        raise _bad("identical_completions", "'chosen' and 'rejected' are the same; a pair needs two different "
                   "completions", where)
    return PreferenceRecord("trl", prompt, (c, r), key=key, carried=_carried(obj))


def _label(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise _bad("invalid_label", f"'label' is {json_kind(v)} {v!r}; give true (desirable) or false", where)


def _kto(obj: dict, where: str) -> PreferenceRecord:
    label = _label(obj["label"], where)
    if "completion" in obj:
        if "prompt" not in obj:
            raise _bad("invalid_preference", "a KTO row with 'completion' needs 'prompt'", where)
        key = _one_key([obj["prompt"], obj["completion"]], where)
        prompt = _messages(obj["prompt"], "prompt", "user", key, where)
        completion = _messages(obj["completion"], "completion", "assistant", key, where)
        return PreferenceRecord("kto", prompt, (completion,), label=label, key=key, carried=_carried(obj))
    msgs = obj.get("messages", obj.get("conversations"))
    if not _is_messages(msgs) or len(msgs) < 2 or _role(msgs[-1]) != "assistant":
        raise _bad("invalid_preference", "a KTO row with 'messages' needs a list whose last message is the "
                   "assistant's completion", where)
    return PreferenceRecord("kto", tuple(msgs[:-1]), ((msgs[-1],),), label=label, key=_key_of(msgs),
                            carried=_carried(obj))


def _score(c: dict, i: int, where: str) -> float:
    for k in SCORE_KEYS:
        v = c.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    raise _bad("invalid_preference", f"completion {i} has no numeric score ({', '.join(SCORE_KEYS)})", where)


def _ultrafeedback(obj: dict, where: str) -> PreferenceRecord:
    comps = obj["completions"]
    if not (isinstance(comps, list) and len(comps) >= 2 and all(isinstance(c, dict) for c in comps)):
        raise _bad("invalid_preference", "'completions' must list at least two scored completions (objects)", where)
    scores = [_score(c, i, where) for i, c in enumerate(comps)]
    best = max(range(len(comps)), key=lambda i: (scores[i], -i))
    worst = min(range(len(comps)), key=lambda i: (scores[i], i))
    if scores[best] == scores[worst]:
        raise _bad("no_preference", f"every completion scores {scores[best]:g}; nothing is preferred", where)

    def text(i: int) -> str:
        v = next((comps[i][k] for k in RESPONSE_KEYS if k in comps[i]), None)
        if not isinstance(v, str):
            raise _bad("invalid_preference", f"completion {i} has no text ({', '.join(RESPONSE_KEYS)})", where)
        return v

    prompt = obj.get("prompt", obj.get("instruction"))
    if not isinstance(prompt, str) and not _is_messages(prompt):
        raise _bad("invalid_preference", f"the prompt ('prompt' or 'instruction') is {json_kind(prompt)}", where)
    key = _key_of(prompt) if isinstance(prompt, list) else "messages"
    p = _messages(prompt, "prompt", "user", key, where)
    return PreferenceRecord("ultrafeedback", p, ((_assistant(text(best), key),), (_assistant(text(worst), key),)),
                            key=key, carried=_carried(obj))


def _llamafactory(obj: dict, where: str) -> PreferenceRecord:
    if "conversations" in obj:
        prompt = obj["conversations"]
        if not _is_messages(prompt):
            raise _bad("invalid_preference", f"'conversations' is {json_kind(prompt)}, not a list of messages", where)
        key = _key_of(prompt)
        c = _messages(obj["chosen"], "chosen", "assistant", key, where)
        r = _messages(obj["rejected"], "rejected", "assistant", key, where)
        _one_key([prompt, c, r], where)
        prompt = tuple(prompt)
    else:
        inst, extra = obj["instruction"], obj.get("input", "")
        if not isinstance(inst, str) or not isinstance(extra, str):
            raise _bad("invalid_preference", "'instruction' and 'input' must be strings", where)
        key = "messages"
        prompt = (_user(f"{inst}\n{extra}" if extra else inst, key),)
        c = _messages(obj["chosen"], "chosen", "assistant", key, where)
        r = _messages(obj["rejected"], "rejected", "assistant", key, where)
    if c == r:
        raise _bad("identical_completions", "'chosen' and 'rejected' are the same; a pair needs two different "
                   "completions", where)
    return PreferenceRecord("llamafactory", prompt, (c, r), key=key, carried=_carried(obj))


def detect_form(obj: dict) -> str | None:
    """The form of a record by its keys (None: no preference form fits)."""
    if "label" in obj and ("completion" in obj or "messages" in obj or "conversations" in obj):
        return "kto"
    if "completions" in obj and ("prompt" in obj or "instruction" in obj):
        return "ultrafeedback"
    if "chosen" in obj and "rejected" in obj:
        return "llamafactory" if "conversations" in obj or "instruction" in obj else "trl"
    return None


_PARSERS = {"trl": _trl, "kto": _kto, "ultrafeedback": _ultrafeedback, "llamafactory": _llamafactory}
_NEEDS = {"trl": ("chosen", "rejected"), "kto": ("label",), "ultrafeedback": ("completions",),
          "llamafactory": ("chosen", "rejected")}


def parse_preference(obj: Any, where: str, form: str = "auto") -> PreferenceRecord:
    """A decoded record as a ``PreferenceRecord`` of ``form`` (``auto``: by its keys).
    Raises ``RecordError`` with the reasons of the module docstring."""
    if not isinstance(obj, dict):
        raise _bad("not_an_object", f"the record is {json_kind(obj)}, not an object", where)
    found = detect_form(obj) if form == "auto" else form
    if found is None:
        keys = ", ".join(sorted(obj)[:8]) or "none"
        raise _bad("not_preference_record", f"no preference form fits the keys ({keys}): give prompt/chosen/rejected "
                   f"(TRL), prompt/completion/label (KTO), completions with scores (UltraFeedback) or "
                   f"conversations/chosen/rejected (LLaMA-Factory)", where)
    missing = [k for k in _NEEDS[found] if k not in obj]
    if missing:
        raise _bad("not_preference_record", f"--format {found} needs '{missing[0]}', which the record lacks", where)
    return _PARSERS[found](obj, where)


@dataclass(frozen=True)
class PromptRecord:
    """An RL row: ``prompt`` messages (ending with a user or tool message), ``key`` as in
    ``PreferenceRecord``, ``carried`` keys and ``columns``: every other key's name."""

    prompt: tuple[dict, ...]
    key: str
    carried: dict
    columns: tuple[str, ...]

    def conversation(self) -> dict:
        return {**self.carried, self.key: list(self.prompt)}


def parse_prompt(obj: Any, where: str) -> PromptRecord:
    """An RL row: ``prompt`` (a string: one user message; or messages), else ``messages``
    (all of it the prompt). Every key other than the prompt's and ``CARRIED_KEYS`` is a column."""
    if not isinstance(obj, dict):
        raise _bad("not_an_object", f"the record is {json_kind(obj)}, not an object", where)
    name = next((k for k in ("prompt", "messages", "conversations") if k in obj), None)
    if name is None:
        keys = ", ".join(sorted(obj)[:8]) or "none"
        raise _bad("no_prompt", f"no 'prompt' (a string or messages) or 'messages' (keys: {keys})", where)
    v = obj[name]
    key = _key_of(v) if _is_messages(v) else "messages"
    prompt = _messages(v, name, "user", key, where)
    if _role(prompt[-1]) == "assistant":
        raise _bad("prompt_ends_with_assistant", f"the prompt's last message ({len(prompt) - 1}) is the assistant's; "
                   f"an RL prompt ends where the model's reply begins: drop the reply", where)
    return PromptRecord(prompt, key, _carried(obj), tuple(k for k in obj if k != name and k not in CARRIED_KEYS))


def _skip_ws(b: bytes, i: int) -> int:
    while i < len(b) and b[i] in b" \t\r\n":
        i += 1
    return i


def _skip_string(b: bytes, i: int) -> int:
    """The index after the JSON string starting at ``b[i]`` (a quote)."""
    i += 1
    while True:
        j = b.find(b'"', i)
        if j < 0:
            raise ValueError("unterminated string")
        k = j - 1
        while b[k] == 0x5C:  # backslashes before the quote
            k -= 1
        if (j - 1 - k) % 2 == 0:
            return j + 1
        i = j + 1


def _skip_value(b: bytes, i: int) -> int:
    if b[i] == 0x22:
        return _skip_string(b, i)
    if b[i] in b"[{":
        depth = 0
        while i < len(b):
            c = b[i]
            if c == 0x22:
                i = _skip_string(b, i)
                continue
            if c in b"[{":
                depth += 1
            elif c in b"]}":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise ValueError("unterminated value")
    j = i
    while j < len(b) and b[j] not in b",} \t\r\n":
        j += 1
    return j


def value_texts(raw: bytes) -> dict[bytes, bytes]:
    """The JSON text of each top-level value of the object ``raw`` holds, byte for byte
    as written, by its key's JSON text (quotes included): ``b'{"a": 1.50}'`` ->
    ``{b'"a"': b'1.50'}``. ``raw`` must be valid JSON (decoded before)."""
    b = bytes(raw)
    out: dict[bytes, bytes] = {}
    i = _skip_ws(b, 0) + 1  # past "{"
    while True:
        i = _skip_ws(b, i)
        if b[i] == 0x7D:
            return out
        j = _skip_string(b, i)
        key = b[i:j]
        i = _skip_ws(b, _skip_ws(b, j) + 1)  # past ":"
        k = _skip_value(b, i)
        out[key] = b[i:k]
        i = _skip_ws(b, k)
        if b[i] == 0x2C:
            i += 1
