"""Render conversations to token ids and the loss mask (docs/ARCHITECTURE.md §3).

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

import numpy as np
import orjson

from ..errors import RecordError, TokenizerError, TokenizerFailure
from ..records.turns import Conversation, ToolCall
from ..tokenize.joined import JoinedEncoder
from ..tokenize.memo import SegmentMemo, id_array
from ..tokenize.space_runs import CL100K_PATTERNS
from .masking import loss_mask
from .tokenizer import ChatTokenizer

# split patterns for which ``splits_at_newlines`` holds: cl100k_base's, as tiktoken writes it now and before 0.7
SPLIT_SAFE_PATTERNS = CL100K_PATTERNS
TOOLS_HEADER = "# Tools\nYou may call these functions. Each line is one function's JSON schema:\n"


def canonical_json(value) -> str:
    """Compact JSON with sorted keys: the same value always gives the same text."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")


def tool_call_text(call: ToolCall) -> str:
    """``{"name":"f","arguments":{...}}``: name first, arguments with sorted keys, compact."""
    return '{"name":' + canonical_json(call.name) + ',"arguments":' + canonical_json(call.arguments) + "}"


def system_parts(conv: Conversation) -> list[str] | None:
    """The system span's text in parts that join to it: the system message with the tools
    header, then each tool schema (every part but the last ends with a newline, every part
    but the first starts with a schema's first character, never whitespace)."""
    text = conv.turns[0].text if conv.turns and conv.turns[0].role == "system" else None
    if not conv.tools:
        return None if text is None else [text]
    schemas = [canonical_json(t) for t in conv.tools]
    return [(text + "\n\n" if text else "") + TOOLS_HEADER, *(s + "\n" for s in schemas[:-1]), schemas[-1]]


def splits_at_newlines(tok) -> bool:
    """True when ``tok`` provably encodes ``a + b`` as ``encode(a) + encode(b)`` whenever
    ``a`` ends with a newline and ``b`` starts with a character that is not whitespace, so
    the system span may be encoded schema by schema (each one then a memo entry).

    Holds for cl100k_base's split pattern (every ``.tiktoken`` file is read with it): no
    piece of that pattern holds a newline followed by a non-space character, a run of
    whitespace ending in a newline is one piece whether text follows it or not (``\\s++$``
    at the end of ``a``, ``\\s*[\\r\\n]`` before ``b``), and the pattern looks behind nothing;
    BPE then merges within a piece only. Other patterns are not split (GPT-2's
    ``\\s+(?!\\S)`` cuts a newline off a run of spaces when text follows)."""
    return getattr(tok, "pat_str", None) in SPLIT_SAFE_PATTERNS


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


def _plan(conv: Conversation, tok: ChatTokenizer, texts: list[str], split_system: bool = False
          ) -> list[tuple[bool, list[int], bool]]:
    """Spans as (starts_pair, items, trained); an item is an index into ``texts`` (>= 0) or
    a marker id ``m`` as ``~m`` (< 0); ``trained``: an assistant turn the mask rule trains.
    ``split_system``: the system span's text as its parts (``system_parts``)."""
    ids = tok.ids
    spans: list[tuple[bool, list[int], bool]] = []
    seen_context = False
    add = texts.append

    def text(s: str) -> int:
        add(s)
        return len(texts) - 1

    parts = system_parts(conv)
    if parts is not None:
        if not split_system and len(parts) > 1:
            parts = ["".join(parts)]
        spans.append((False, [~ids.system, *(text(p) for p in parts), ~ids.end], False))
    for turn in conv.turns:
        role = turn.role
        if role == "system":
            continue
        if role == "user":
            spans.append((True, [~ids.user, text(turn.text), ~ids.end], False))
            seen_context = True
        elif role == "tool":
            spans.append((False, [~ids.tool, text(turn.text), ~ids.end], False))
            seen_context = True
        else:
            opener = _marker(ids.assistant_context, "<|ASSISTANT_CONTEXT|>", tok) if turn.untrained else ids.assistant
            items = [~opener]
            if turn.reasoning:
                items += [~_marker(ids.think, "<|THINK|>", tok), text(turn.reasoning),
                          ~_marker(ids.end_think, "<|END_THINK|>", tok)]
            if turn.text:
                items.append(text(turn.text))
            for call in turn.tool_calls:
                items += [~ids.tool_call, text(tool_call_text(call))]
            items.append(~ids.end)
            spans.append((False, items, seen_context and not turn.untrained))
    return spans


def _rendered_text(convs: Sequence[Conversation], tok: ChatTokenizer, marker: dict[int, str]) -> tuple[str, int]:
    """The fast path of ``_text_of_plans``: the rendered text of ``convs`` back to back, the
    markers as their strings, straight from the turns (no plans: a chunk without the length
    filter renders 20-30% faster), and how many markers it holds. ``_plan`` is the
    reference layout; tests/chat/test_render.py checks this gives its text exactly."""
    ids = tok.ids
    end, user, tool, assistant = marker[ids.end], marker[ids.user], marker[ids.tool], marker[ids.assistant]
    system, call, eos = marker[ids.system], marker[ids.tool_call], marker[tok.eos_id]
    out: list[str] = []
    add = out.append
    placed = 0
    for conv in convs:
        turns = conv.turns
        if conv.tools:
            out += (system, "".join(system_parts(conv)), end)
            placed += 2
        elif turns and turns[0].role == "system":
            out += (system, turns[0].text, end)
            placed += 2
        for turn in turns:
            role = turn.role
            if role == "user":
                out += (user, turn.text, end)
            elif role == "tool":
                out += (tool, turn.text, end)
            elif role == "system":
                continue
            elif not turn.untrained and not turn.reasoning and not turn.tool_calls:
                out += (assistant, turn.text, end)
            else:
                opener = _marker(ids.assistant_context, "<|ASSISTANT_CONTEXT|>", tok) if turn.untrained else ids.assistant
                add(marker[opener])
                if turn.reasoning:
                    out += (marker[_marker(ids.think, "<|THINK|>", tok)], turn.reasoning,
                            marker[_marker(ids.end_think, "<|END_THINK|>", tok)])
                    placed += 2
                add(turn.text)
                for c in turn.tool_calls:
                    out += (call, tool_call_text(c))
                placed += len(turn.tool_calls)
                add(end)
            placed += 2
        add(eos)
        placed += 1
    return "".join(out), placed


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


@dataclass
class RenderedChunk:
    """Many conversations rendered: the accepted episodes' ids and masks back to back
    (``lengths`` each), and per conversation its dropped pairs (int) or the
    ``RecordError`` that rejected it."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    results: list[int | RecordError]


def encode_texts(texts: list[str], tok: ChatTokenizer, memo: SegmentMemo | None = None,
                 num_threads: int = 1) -> tuple[list, list[int]]:
    """Each text's ids as a uint32 array and its token count, through ``memo`` when given."""
    if memo is not None:
        return memo.encode(texts, tok)
    encoded = [id_array(e) for e in tok.encode_batch(texts, num_threads=num_threads)] if texts else []
    return encoded, [len(e) for e in encoded]


def render_chunk(convs: Sequence[Conversation], tok: ChatTokenizer, *, wheres: Sequence[str] | None = None,
                 max_tokens: int | None = None, memo: SegmentMemo | None = None,
                 num_threads: int = 1) -> RenderedChunk:
    """Render many conversations with one batched encode and one mask pass into one array.

    With a ``memo``, texts seen before are not encoded again, and when the tokenizer
    allows it (``splits_at_newlines``) the system span is encoded schema by schema, so a
    schema shared by many records is one entry. The ids are the same either way.

    A text the tokenizer cannot encode (``TokenizerFailure``) rejects its record only
    (``tokenizer_error``): the chunk is then rendered record by record."""
    try:
        return _render_chunk(convs, tok, wheres=wheres, max_tokens=max_tokens, memo=memo, num_threads=num_threads)
    except TokenizerFailure as e:
        if len(convs) == 1:
            return RenderedChunk(np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64),
                                 [RecordError(e.reason, str(e), wheres[0] if wheres else "record 0")])
    parts = [render_chunk([c], tok, wheres=[wheres[i] if wheres else f"record {i}"], max_tokens=max_tokens,
                          memo=memo, num_threads=num_threads) for i, c in enumerate(convs)]
    return RenderedChunk(np.concatenate([p.ids for p in parts]), np.concatenate([p.mask for p in parts]),
                         np.concatenate([p.lengths for p in parts]), [r for p in parts for r in p.results])


def _render_chunk(convs: Sequence[Conversation], tok: ChatTokenizer, *, wheres: Sequence[str] | None,
                  max_tokens: int | None, memo: SegmentMemo | None, num_threads: int) -> RenderedChunk:
    """``render_chunk`` of conversations whose texts all encode."""
    if memo is not None and not memo.serves():  # idle: its texts seldom repeat, the plain path is faster
        chunk = _render_chunk(convs, tok, wheres=wheres, max_tokens=max_tokens, memo=None, num_threads=num_threads)
        memo.stats.tokens_encoded += int(chunk.ids.size - np.isin(chunk.ids, list(tok.special_tokens.values())).sum())
        return chunk
    joined = getattr(tok, "joined", None) if memo is None and num_threads == 1 else None
    if joined is not None and max_tokens is None:  # the rendered text straight from the conversations
        ids = joined.encode(*_rendered_text(convs, tok, joined.text))
        if ids is not None:
            return _joined_chunk(ids, convs, joined, tok, None, wheres)
        joined = None  # a typed marker or a lone surrogate: text by text
    texts: list[str] = []
    split = memo is not None and splits_at_newlines(tok)
    plans = [_plan(c, tok, texts, split) for c in convs]
    if joined is not None:  # the length filter needs each span: from the plans
        chunk = _render_joined(plans, texts, joined, tok, max_tokens, wheres)
        if chunk is not None:
            return chunk
    encoded, text_len = encode_texts(texts, tok, memo, num_threads)
    markers = {~i: id_array([i]) for i in tok.special_tokens.values()}  # item -> its one-id array
    parts: list = []  # uint32 arrays, joined once
    results: list[int | RecordError] = []
    sizes: list[int] = []
    eos = markers[~tok.eos_id]
    for ci, spans in enumerate(plans):
        keep, dropped = len(spans), 0
        if max_tokens is not None:
            lengths = [sum(1 if v < 0 else text_len[v] for v in items) for _, items, _ in spans]
            try:
                keep, dropped = _cut(spans, lengths, max_tokens, wheres[ci] if wheres else f"record {ci}")
            except RecordError as e:
                results.append(e)
                continue
        size = 1
        for _, items, _ in spans[:keep]:
            for v in items:
                if v >= 0:
                    parts.append(encoded[v])
                    size += text_len[v]
                else:
                    parts.append(markers[v])
                    size += 1
        parts.append(eos)
        sizes.append(size)
        results.append(dropped)
    ids = np.frombuffer(bytearray().join(parts), dtype=np.uint32)  # writable, one copy
    return RenderedChunk(ids, loss_mask(ids, tok.ids), np.asarray(sizes, dtype=np.int64), results)


def _text_of_plans(plans: list, texts: list[str], marker: dict[int, str], eos: str) -> tuple[str, int]:
    """The reference rendered text: ``_plan``'s spans of each conversation, the texts and
    the markers' strings in order, EOS after each; and how many markers it holds.
    ``_rendered_text`` builds the same text without plans (tests/chat/test_render.py
    holds it to this one)."""
    pieces: list[str] = []
    add = pieces.append
    for spans in plans:
        for _, items, _ in spans:
            for v in items:
                add(texts[v] if v >= 0 else marker[~v])
        add(eos)
    return "".join(pieces), len(pieces) - len(texts)


def _render_joined(plans: list, texts: list[str], joined: JoinedEncoder, tok: ChatTokenizer,
                   max_tokens: int | None, wheres: Sequence[str] | None) -> RenderedChunk | None:
    """``render_chunk`` by one call of the core over the chunk's rendered text (message
    texts between the markers' strings: ``tokenize.joined``); None when a text holds a marker
    string or a lone surrogate (then the texts are encoded one by one)."""
    ids = joined.encode(*_text_of_plans(plans, texts, joined.text, joined.text[tok.eos_id]))  # each text is one piece
    if ids is None:
        return None
    return _joined_chunk(ids, plans, joined, tok, max_tokens, wheres)


def _joined_chunk(ids: np.ndarray, plans: list, joined: JoinedEncoder, tok: ChatTokenizer, max_tokens: int | None,
                  wheres: Sequence[str] | None) -> RenderedChunk:
    """The chunk of the rendered ids ``ids`` of ``plans`` (``_plan``'s spans per
    conversation; only their count without ``max_tokens``), the length filter applied."""
    eos_at = np.flatnonzero(ids == tok.eos_id)
    if max_tokens is None:
        sizes = np.diff(eos_at, prepend=-1)
        return RenderedChunk(ids, loss_mask(ids, tok.ids), sizes.astype(np.int64), [0] * len(plans))
    # the length filter: a span's tokens run from its opener through its <|END|>, spans back to back
    marks = np.flatnonzero(ids >= joined.floor)
    ends = marks[ids[marks] == tok.ids.end].tolist()
    results: list[int | RecordError] = []
    sizes_: list[int] = []
    cut: list[tuple[int, int]] = []  # token ranges to remove
    start = e = 0
    for ci, (spans, stop) in enumerate(zip(plans, eos_at.tolist())):
        mine = ends[e:e + len(spans)]
        e += len(spans)
        lengths = [b - a for a, b in zip([start - 1, *mine[:-1]], mine)]
        try:
            keep, dropped = _cut(spans, lengths, max_tokens, wheres[ci] if wheres else f"record {ci}")
        except RecordError as err:
            results.append(err)
            cut.append((start, stop + 1))
        else:
            results.append(dropped)
            if keep < len(spans):
                cut.append((mine[keep - 1] + 1, stop))  # the dropped pairs; EOS stays
                sizes_.append(mine[keep - 1] + 2 - start)
            else:
                sizes_.append(stop + 1 - start)
        start = stop + 1
    if cut:
        kept = np.ones(ids.shape[0], dtype=bool)
        for a, b in cut:
            kept[a:b] = False
        ids = ids[kept]
    return RenderedChunk(ids, loss_mask(ids, tok.ids), np.asarray(sizes_, dtype=np.int64), results)


def render_batch(convs: Sequence[Conversation], tok: ChatTokenizer, *, wheres: Sequence[str] | None = None,
                 max_tokens: int | None = None, num_threads: int = 1,
                 memo: SegmentMemo | None = None) -> list[Rendered | RecordError]:
    """``render_chunk`` as one ``Rendered`` (views into the chunk's arrays) or the
    ``RecordError`` (``too_long``) that rejected it, per conversation."""
    chunk = render_chunk(convs, tok, wheres=wheres, max_tokens=max_tokens, memo=memo, num_threads=num_threads)
    bounds = np.concatenate(([0], np.cumsum(chunk.lengths))).tolist()
    out: list[Rendered | RecordError] = []
    j = 0
    for r in chunk.results:
        if isinstance(r, RecordError):
            out.append(r)
            continue
        out.append(Rendered(chunk.ids[bounds[j]:bounds[j + 1]], chunk.mask[bounds[j]:bounds[j + 1]], r))
        j += 1
    return out


def render(conv: Conversation, tok: ChatTokenizer, max_tokens: int | None = None) -> Rendered:
    """Render one conversation; raises ``RecordError('too_long')`` under the length filter."""
    (r,) = render_batch([conv], tok, max_tokens=max_tokens)
    if isinstance(r, RecordError):
        raise r
    return r
