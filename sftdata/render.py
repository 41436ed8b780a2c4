"""Render conversations to token ids and the loss mask (ARCHITECTURE.md §3).

A conversation renders as spans, then EOS::

    <|SYSTEM|> system text [tool schemas] <|END|>
    <|USER|> user text <|END|>
    <|ASSISTANT|> [<|THINK|> reasoning <|END_THINK|>] reply text
        [<|TOOL_CALL|> {"name":...,"arguments":{...}}]* <|END|>
    <|TOOL|> tool result <|END|>
    ...
    <|EOS|>

An assistant turn that is context (``weight: 0``, ``train: false``, ``--train-on
last``) opens with ``<|ASSISTANT_CONTEXT|>`` instead of ``<|ASSISTANT|>``; empty
reasoning is not rendered. Message text is encoded as ordinary text; marker ids are
inserted only here. The mask comes from ``masking.loss_mask`` over the rendered ids:
the renderer never decides what is trained, it only writes the tokens the rule reads.

The length filter (``max_tokens``): the turns before the first user turn (system span,
untrained leading assistant) plus the first *pair* (a user turn and everything up to
the next user turn) must fit in ``max_tokens``; each later pair must fit alone; the
first later pair that does not fit is dropped with everything after it (the prefix is
kept); a record whose first pair does not fit is rejected as ``too_long``, and so is one
whose pairs that fit hold no trained assistant turn. EOS is not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import orjson

from .errors import RecordError, TokenizerError
from .masking import loss_mask
from .tokenizer import ChatTokenizer
from .turns import Conversation, ToolCall

TOOLS_HEADER = "# Tools\nYou may call these functions. Each line is one function's JSON schema:\n"


def canonical_json(value) -> str:
    """Compact JSON with sorted keys: the same value always gives the same text."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")


def tool_call_text(call: ToolCall) -> str:
    """``{"name":"f","arguments":{...}}``: name first, arguments with sorted keys, compact."""
    return '{"name":' + canonical_json(call.name) + ',"arguments":' + canonical_json(call.arguments) + "}"


def system_text(conv: Conversation) -> str | None:
    """The system span's text: the system message, then the tool schemas, one per line."""
    text = conv.turns[0].text if conv.turns and conv.turns[0].role == "system" else None
    if not conv.tools:
        return text
    schemas = "\n".join(canonical_json(t) for t in conv.tools)
    return (text + "\n\n" if text else "") + TOOLS_HEADER + schemas


@dataclass
class Rendered:
    """One episode: ids (uint32), mask (uint8) and how many trailing pairs were dropped."""

    ids: np.ndarray
    mask: np.ndarray
    pairs_dropped: int = 0


def _marker(token_id: int | None, name: str, tok: ChatTokenizer) -> int:
    if token_id is None:
        raise TokenizerError(f"this tokenizer has no {name} marker (it was rebuilt from a dataset written before "
                             f"{name} existed); render with load_tokenizer({(tok.path or tok.name)!r})")
    return token_id


def _plan(conv: Conversation, tok: ChatTokenizer, texts: list[str]) -> list[tuple[bool, list, bool]]:
    """Spans as (starts_pair, items, trained); an item is ("m", marker id) or ("t", index
    into texts); ``trained``: an assistant turn the mask rule trains."""
    ids = tok.ids
    spans: list[tuple[bool, list, bool]] = []
    seen_context = False

    def text(s: str) -> tuple[str, int]:
        texts.append(s)
        return ("t", len(texts) - 1)

    def m(i: int) -> tuple[str, int]:
        return ("m", i)

    sys_text = system_text(conv)
    if sys_text is not None:
        spans.append((False, [m(ids.system), text(sys_text), m(ids.end)], False))
    for turn in conv.turns:
        if turn.role == "system":
            continue
        if turn.role == "user":
            spans.append((True, [m(ids.user), text(turn.text), m(ids.end)], False))
            seen_context = True
        elif turn.role == "tool":
            spans.append((False, [m(ids.tool), text(turn.text), m(ids.end)], False))
            seen_context = True
        else:
            opener = _marker(ids.assistant_context, "<|ASSISTANT_CONTEXT|>", tok) if turn.untrained else ids.assistant
            items: list = [m(opener)]
            if turn.reasoning:
                items += [m(_marker(ids.think, "<|THINK|>", tok)), text(turn.reasoning),
                          m(_marker(ids.end_think, "<|END_THINK|>", tok))]
            if turn.text:
                items.append(text(turn.text))
            for call in turn.tool_calls:
                items += [m(ids.tool_call), text(tool_call_text(call))]
            items.append(m(ids.end))
            spans.append((False, items, seen_context and not turn.untrained))
    return spans


def _cut(spans: list[tuple[bool, list, bool]], lengths: list[int], max_tokens: int | None, where: str):
    """How many spans to keep under the length filter, and how many pairs it drops."""
    if max_tokens is None:
        return len(spans), 0
    starts = [i for i, (p, _, _) in enumerate(spans) if p] + [len(spans)]
    head_and_first = sum(lengths[: starts[1]]) if len(starts) > 1 else sum(lengths)
    if head_and_first > max_tokens:
        raise RecordError("too_long", f"the first user/assistant pair with the system span is "
                          f"{head_and_first} tokens > --max-tokens {max_tokens}", where)
    if len(starts) <= 2:
        return len(spans), 0
    pairs = len(starts) - 1
    for k in range(1, pairs):
        a, b = starts[k], starts[k + 1]
        if sum(lengths[a:b]) > max_tokens:
            if not any(trained for _, _, trained in spans[:a]):
                raise RecordError("too_long", f"pair {k + 1} is {sum(lengths[a:b])} tokens > --max-tokens {max_tokens}, "
                                  f"and the pairs before it hold no trained assistant turn (weight 0, train false or "
                                  f"--train-on last), so nothing would be trained", where)
            return a, pairs - k
    return len(spans), 0


def render_batch(convs: Sequence[Conversation], tok: ChatTokenizer, *, wheres: Sequence[str] | None = None,
                 max_tokens: int | None = None, num_threads: int = 1) -> list[Rendered | RecordError]:
    """Render many conversations with one batched encode and one mask pass.

    Returns, per conversation, a ``Rendered`` or the ``RecordError`` (``too_long``)
    that rejected it.
    """
    texts: list[str] = []
    plans = [_plan(c, tok, texts) for c in convs]
    encoded = tok.encode_batch(texts, num_threads=num_threads) if texts else []
    text_len = [len(e) for e in encoded]
    flat: list[list[int]] = []
    out: list[Rendered | RecordError] = []
    sizes: list[int] = []
    eos = [tok.eos_id]
    for ci, spans in enumerate(plans):
        lengths = [_span_len(items, text_len) for _, items, _ in spans]
        try:
            keep, dropped = _cut(spans, lengths, max_tokens, wheres[ci] if wheres else f"record {ci}")
        except RecordError as e:
            out.append(e)
            continue
        pieces: list[list[int]] = []
        for _, items, _ in spans[:keep]:
            for kind, v in items:
                pieces.append([v] if kind == "m" else encoded[v])
        pieces.append(eos)
        flat.extend(pieces)
        sizes.append(sum(lengths[:keep]) + 1)
        out.append(Rendered(np.empty(0, np.uint32), np.empty(0, np.uint8), dropped))
    if sizes:
        ids = np.fromiter(chain.from_iterable(flat), dtype=np.uint32, count=sum(sizes))
        mask = loss_mask(ids, tok.ids)
        bounds = np.cumsum([0] + sizes)
        j = 0
        for r in out:
            if isinstance(r, Rendered):
                r.ids = ids[bounds[j]:bounds[j + 1]]
                r.mask = mask[bounds[j]:bounds[j + 1]]
                j += 1
    return out


def _span_len(items, text_len) -> int:
    return sum(1 if kind == "m" else text_len[v] for kind, v in items)


def render(conv: Conversation, tok: ChatTokenizer, max_tokens: int | None = None) -> Rendered:
    """Render one conversation; raises ``RecordError('too_long')`` under the length filter."""
    (r,) = render_batch([conv], tok, max_tokens=max_tokens)
    if isinstance(r, RecordError):
        raise r
    return r
