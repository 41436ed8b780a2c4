"""Find each assistant reply in a template's render of the WHOLE conversation.

Many templates are not prefix-stable (the render of a conversation prefix is not a prefix
of the whole render: Qwen3 adds an empty think block to the final reply only, Mistral
moves the system text to the last user message), so spans are never found by rendering
prefixes. Instead:

1. render the conversation (R), and render it again with every message text (and the
   first tool-call name of each reply) replaced by a unique sentinel (S);
2. S is the template's own text with the sentinels in it: the pieces between sentinels
   must appear in R in order, with each message's text (possibly trimmed or rewritten by
   the template) between them; that gives every piece's place in R;
3. a reply's span starts after the last assistant header before its first sentinel and
   ends after the first end-of-turn text after its last sentinel (before any other
   message's sentinel); both are found in S's own pieces and mapped to R.

When that fails (a template that drops or duplicates a reply's text, or makes the pieces
ambiguous), ``locate_last_reply`` serves one reply at a time from the render of the
conversation up to it.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SENT_OPEN, SENT_CLOSE = "\ufdd2", "\ufdd3"
_SENT_RE = re.compile(f"{SENT_OPEN}([cn])(\\d+){SENT_CLOSE}")
THINK_END = "</think>"

RenderFn = Callable[..., str]  # (messages, add_generation_prompt=False) -> text


class NotLocated(Exception):
    """A reply could not be located; ``index`` is its message index (None: the whole render)."""

    def __init__(self, index: int | None, why: str):
        super().__init__(why)
        self.index = index
        self.why = why


@dataclass(frozen=True)
class Layout:
    """What marks a reply in this template's text: the headers that open one, the
    end-of-turn texts that close one."""

    header_texts: tuple[str, ...]
    end_texts: tuple[str, ...]


def sentinel_messages(messages: list[dict]) -> tuple[list[dict], dict[tuple[str, int], str]]:
    """A copy of ``messages`` with sentinels, and the text each sentinel replaced."""
    out: list[dict] = []
    originals: dict[tuple[str, int], str] = {}
    for i, m in enumerate(messages):
        m = dict(m)
        content = m.get("content")
        # content given as one text part (a template that reads only parts): its text
        part = content[0] if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict) \
            and content[0].get("type") == "text" and isinstance(content[0].get("text"), str) else None
        text = part["text"] if part is not None else content
        if m.get("role") in ("user", "assistant", "tool") and isinstance(text, str) and text:
            # reasoning written inline (``<think>...</think>`` then the answer) is kept, so a
            # template that moves or drops it renders the same structure with the sentinel
            cut = text.rfind(THINK_END) + len(THINK_END) if m.get("role") == "assistant" and THINK_END in text else 0
            marked = f"{text[:cut]}{SENT_OPEN}c{i}{SENT_CLOSE}"
            m["content"] = marked if part is None else [{**part, "text": marked}]
            originals[("c", i)] = text[cut:]
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            first = dict(calls[0])
            first["function"] = dict(first["function"])
            originals[("n", i)] = first["function"]["name"]
            first["function"]["name"] = f"{SENT_OPEN}n{i}{SENT_CLOSE}"
            m["tool_calls"] = [first, *calls[1:]]
        out.append(m)
    return out, originals


def plain_structure(messages: list[dict]) -> tuple | None:
    """What the sentinel copy of ``messages`` depends on, when every message is a plain
    ``{"role", "content": str}`` with no inline reasoning (the sentinel copy is then the
    same for every conversation of that structure); None otherwise."""
    key = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if len(m) != 2 or not isinstance(content, str) or (role == "assistant" and THINK_END in content):
            return None
        key.append((role, True) if content and role in ("user", "assistant", "tool") else (role, content))
    return tuple(key)


def _plain_originals(messages: list[dict]) -> dict[tuple[str, int], str]:
    """``sentinel_messages(messages)[1]`` of messages ``plain_structure`` accepts."""
    return {("c", i): m["content"] for i, m in enumerate(messages)
            if m["content"] and m["role"] in ("user", "assistant", "tool")}


def _verbatim(r: str, pos: int, orig: str, piece: str, last: bool) -> int | None:
    """Where the template's next ``piece`` starts in ``r`` when the message text at ``pos``
    is ``orig`` as written, as Jinja's ``trim`` (or one-sided strip) left it, or escaped
    by ``tojson``: most templates trim message text, and the piece after it (an
    end-of-turn and the next header) recurs, so it cannot be searched for."""
    end = pos + len(orig)  # as written first: the common case, without building the stripped copies
    if r.startswith(orig, pos) and r.startswith(piece, end) and (not last or end + len(piece) == len(r)):
        return end
    for text in dict.fromkeys((orig.strip(), orig.rstrip(), orig.lstrip(), *_escaped(orig))):
        end = pos + len(text)
        if text != orig and r.startswith(text, pos) and r.startswith(piece, end) and \
                (not last or end + len(piece) == len(r)):
            return end
    return None


def _escaped(orig: str) -> tuple[str, ...]:
    """``orig`` as a template's ``tojson`` writes it inside its quotes (Llama 3.1 and gpt-oss
    print a tool result so), non-ASCII kept and escaped."""
    return json.dumps(orig, ensure_ascii=False)[1:-1], json.dumps(orig)[1:-1]


@dataclass(frozen=True)
class SentinelPlan:
    """What the sentinel render S alone decides (cached by S): the sentinels' keys, the
    template's pieces between them, and each target reply's start and end as ``(piece,
    offset in it)``; ``error``/``target_error``: S cannot be aligned / a target not located."""

    keys: tuple[tuple[str, int], ...]
    pieces: tuple[str, ...]
    error: NotLocated | None
    ends: tuple[tuple[int, int, int, int, int], ...]  # (message index, head piece, head offset, end piece, end offset)
    target_error: NotLocated | None


@lru_cache(maxsize=256)
def sentinel_plan(s: str, layout: Layout, targets: tuple[int, ...]) -> SentinelPlan:
    found = [(m.group(1), int(m.group(2)), m.start(), m.end()) for m in _SENT_RE.finditer(s)]
    keys = tuple((k, i) for k, i, _, _ in found)
    s_starts = [0] + [e for _, _, _, e in found]
    pieces = tuple(s[a: (found[j][2] if j < len(found) else len(s))] for j, a in enumerate(s_starts))
    # a call's name printed again in a later message (gpt-oss and Gemma 4 head a tool result
    # with the name of the call it answers) is an echo: not where its message is
    seen: set[tuple[str, int]] = set()
    own = []
    for f in found:
        if f[0] == "n" and (f[0], f[1]) in seen:
            continue
        seen.add((f[0], f[1]))
        own.append(f)
    error = None
    texts = [key for key in keys if key[0] == "c"]
    if len(set(texts)) != len(texts):
        error = NotLocated(None, "the template renders a message's text more than once")
    elif any(b[1] < a[1] for a, b in zip(own, own[1:])):
        error = NotLocated(None, "the template renders messages out of order")

    def at(x: int) -> tuple[int, int]:
        j = bisect_right(s_starts, x) - 1
        return j, x - s_starts[j]

    # each message's first and last sentinel among ``own`` (in the render's order), found
    # once: one pass for all targets, never one per target (45.7: 10k messages took 3.8 s)
    span_of: dict[int, tuple[int, int]] = {}
    for j, f in enumerate(own):
        span_of[f[1]] = (span_of.get(f[1], (j, j))[0], j)
    found_starts = [f[2] for f in found]
    ends: list[tuple[int, int, int, int, int]] = []
    floor = 0
    try:
        for i in targets:
            if i not in span_of:
                raise NotLocated(i, "its text is not in the render")
            j0, j1 = span_of[i]
            a0, a1 = own[j0][2], own[j1][3]
            lo = max(floor, own[j0 - 1][3]) if j0 > 0 else floor  # the end of the message before it
            parts = _opened(s, lo, a0, layout)
            if parts is None:
                raise NotLocated(i, "no assistant header precedes it in the render")
            nxt = bisect_left(found_starts, a1)
            while nxt < len(found) and found[nxt][1] == i:  # its own echoes: not the next message
                nxt += 1
            hi = found[nxt][2] if nxt < len(found) else len(s)
            end = _first_end(s, a1, hi, layout.end_texts)
            if end is None:
                raise NotLocated(i, "no end-of-turn token follows it before the next message")
            *closed, head = parts
            for a, b in closed:
                ends.append((i, *at(a), *at(b)))
            ends.append((i, *at(head), *at(end)))
            floor = end
    except NotLocated as e:
        return SentinelPlan(keys, pieces, error, (), e)
    return SentinelPlan(keys, pieces, error, tuple(ends), None)


def _first_header(s: str, lo: int, hi: int, headers: tuple[str, ...]) -> int | None:
    """The end of the first header in ``s[lo:hi]`` (of those starting first, the longest)."""
    best = None
    for h in headers:
        at = s.find(h, lo, hi)
        if at >= 0 and (best is None or (at, -len(h)) < (best[0], -best[1])):
            best = (at, len(h))
    return None if best is None else best[0] + best[1]


def _first_end(s: str, lo: int, hi: int, ends: tuple[str, ...]) -> int | None:
    """The end of the first end-of-turn text in ``s[lo:hi]``."""
    found = [s.find(t, lo, hi) + len(t) for t in ends if s.find(t, lo, hi) >= 0]
    return min(found) if found else None


def _opened(s: str, lo: int, a0: int, layout: Layout) -> list | None:
    """Where a reply whose text starts at ``a0`` opens, as the rule over token ids reads it:
    the first header after the previous message (``lo``), then, while an end-of-turn text
    and another header lie before the reply's text, each such closed part (gpt-oss writes
    the reasoning as a message of its own, ``<|start|>assistant<|channel|>analysis
    <|message|>...<|end|>``, before the reply's ``<|start|>assistant<|channel|>final...``):
    ``[(start, end), ..., last start]``. None: no header. An end-of-turn text not followed
    by a header before the reply leaves the reply opening at its last header (as before)."""
    head = _first_header(s, lo, a0, layout.header_texts)
    if head is None:
        return None
    parts: list = []
    while (end := _first_end(s, head, a0, layout.end_texts)) is not None:
        nxt = _first_header(s, end, a0, layout.header_texts)
        if nxt is None:
            last = max(s.rfind(h, lo, a0) + len(h) for h in layout.header_texts if s.rfind(h, lo, a0) >= 0)
            return [last]
        parts.append((head, end))
        head = nxt
    return [*parts, head]


def _align(r: str, plan: SentinelPlan, originals: dict) -> list[int]:
    """Each of S's pieces' start in R."""
    if plan.error is not None:
        raise plan.error
    pieces, keys = plan.pieces, plan.keys
    if not r.startswith(pieces[0]):
        raise NotLocated(None, "the render differs from the template's text before the first message")
    r_starts = [0]
    pos = len(pieces[0])
    last = len(pieces) - 1
    for j in range(1, len(pieces)):
        orig, piece = originals[keys[j - 1]], pieces[j]
        at = _verbatim(r, pos, orig, piece, j == last)
        if at is not None:
            pass
        elif j == last:
            at = len(r) - len(piece)
            if at < pos or not r.endswith(piece):
                raise NotLocated(None, "the render's end differs from the template's text")
        else:
            at = r.find(piece, pos) if piece else -1
            if at < 0 or r.find(piece, at + 1) >= 0:
                raise NotLocated(keys[j - 1][1], "the template changes this message's text so that it cannot be "
                                 "told from the text around it")
        r_starts.append(at)
        pos = at + len(piece)
    return r_starts


def locate_replies(render_fn: RenderFn, messages: list[dict], layout: Layout,
                   only: int | None = None, sentinel_fn: RenderFn | None = None) -> tuple[str, list[tuple[int, int, int]]]:
    """The whole render and each reply's ``(message index, start, end)`` character span.
    ``only``: locate that reply alone. ``sentinel_fn`` renders the sentinel copy (default
    ``render_fn``; a cached one, with ``cached(key)`` for a ``plain_structure`` key,
    saves a render per record). Raises ``NotLocated``."""
    r = render_fn(messages)
    key = plain_structure(messages) if getattr(sentinel_fn, "cached", None) is not None else None
    s = sentinel_fn.cached(key) if key is not None else None
    if s is not None:
        originals = _plain_originals(messages)
    else:
        sent, originals = sentinel_messages(messages)
        s = sentinel_fn(sent, key=key) if key is not None else (sentinel_fn or render_fn)(sent)
    targets = (only,) if only is not None else tuple(i for i, m in enumerate(messages) if m.get("role") == "assistant")
    plan = sentinel_plan(s, layout, targets)
    r_starts = _align(r, plan, originals)
    if plan.target_error is not None:
        raise plan.target_error
    return r, [(i, r_starts[hj] + hd, r_starts[ej] + ed) for i, hj, hd, ej, ed in plan.ends]


def locate_last_reply(render_fn: RenderFn, messages: list[dict], layout: Layout,
                      k: int, sentinel_fn: RenderFn | None = None) -> tuple[str, tuple[tuple[int, int, int], ...]]:
    """Render ``messages[:k + 1]`` (reply ``k`` last) and locate reply ``k`` in it (its
    spans: more than one where the template writes its reasoning as a message of its own):
    by the sentinel method, else as what follows the render of ``messages[:k]`` with the
    generation prompt. Raises ``NotLocated``."""
    prefix = messages[: k + 1]
    try:
        text, spans = locate_replies(render_fn, prefix, layout, only=k, sentinel_fn=sentinel_fn)
        return text, tuple(spans)
    except NotLocated:
        pass
    text = render_fn(prefix)
    head = render_fn(messages[:k], add_generation_prompt=True)
    if not text.startswith(head):
        raise NotLocated(k, "neither the whole render nor the render up to this reply shows where it starts")
    ends = [text.find(t, len(head)) + len(t) for t in layout.end_texts if text.find(t, len(head)) >= 0]
    if not ends:
        raise NotLocated(k, "no end-of-turn token follows it")
    return text, ((k, len(head), min(ends)),)


def reply_windows(spans) -> dict[int, tuple[int, int]]:
    """Each message's characters from its first span's start to its last span's end."""
    out: dict[int, tuple[int, int]] = {}
    for k, a, b in spans:
        lo, hi = out.get(k, (a, b))
        out[k] = (min(lo, a), max(hi, b))
    return out


def token_ranges(offsets: np.ndarray, spans) -> tuple[np.ndarray, np.ndarray]:
    """For each character span ``(start, end)``, the tokens ``lo:hi`` that overlap it (as
    ``return_assistant_tokens_mask`` maps them: from the token holding ``start`` through
    the one holding ``end - 1``)."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    bounds = np.asarray(list(spans), dtype=np.int64).reshape(-1, 2)
    lo = np.searchsorted(offsets[:, 1], bounds[:, 0], side="right")
    hi = np.searchsorted(offsets[:, 0], bounds[:, 1], side="left")
    return lo, np.maximum(hi, lo)


def token_mask(offsets: np.ndarray, spans) -> np.ndarray:
    """uint8 mask over tokens: 1 for every token that overlaps one of the character spans."""
    n = np.asarray(offsets).reshape(-1, 2).shape[0]
    lo, hi = token_ranges(offsets, spans)
    delta = np.bincount(lo, minlength=n + 1)[: n + 1] - np.bincount(hi, minlength=n + 1)[: n + 1]
    return (np.cumsum(delta[:n]) > 0).astype(np.uint8)


def closed_blocks(text: str, blocks, added, heads: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """``{% generation %}`` blocks ``(start, end)`` of ``text``, each ending with the last
    added token inside it when only whitespace follows that token in the block (LFM2.5's
    block holds ``<|im_end|>\n``): trained through the end-of-turn token, never the text
    after it, as for a template without blocks; and starting after the assistant header
    (one of ``heads``) where the block opens with it (TRL's gpt-oss training template puts
    ``<|start|>assistant`` inside the block): what the generation prompt supplies at
    inference is never trained, as for a template without blocks. Blocks that touch are one
    (TRL's diffusion-Gemma training template closes the reply's block and opens another for
    its ``<turn|>``). Other blocks are as given."""
    out = []
    touching: list[list[int]] = []
    for a, b in blocks:
        if touching and touching[-1][1] == a:
            touching[-1][1] = b
        else:
            touching.append([a, b])
    for a, b in touching:
        kept = a + len(text[a:b].rstrip())
        if kept < b and any(text.endswith(t, a, kept) for t in added):
            b = kept
        head = next((h for h in heads if h and text.startswith(h, a) and a + len(h) < b), None)
        out.append((a + len(head) if head else a, b))
    return out

