"""Episodes or rows chosen by id, input record or sample: ``sftdata inspect --episode/--row/
--record/--sample``. An episodes dataset gives ``EpisodeView``s, a packed one ``RowView``s.

One episode as data: what ``sftdata inspect DATASET --episode N`` shows.

An episode becomes pieces of decoded text, each one marker or a run of text tokens
that are all trained or all not, and, on request, one line per token with the span it
lies in::

    <|SYSTEM|> | Be brief. | <|END|> | <|USER|> | What is ...? | <|END|> | <|ASSISTANT|> | Paris. | <|END|> | <|EOS|>
    untrained ..................................................... | trained ......................... | untrained

One packed row as data: what ``sftdata inspect PACKED --row R`` shows.

A row (docs/PACKING.md) is segments from offset 0, then padding::

    row:            U  u  E  A  a  E  EOS | U  v  E  EOS | pad pad
    seq_ids:        0  0  0  0  0  0  0   | 1  1  1  1   | -1  -1
    position_ids:   0  1  2  3  4  5  6   | 0  1  2  3   |  0   0

``row_view`` returns each segment with its offset, positions, source episode and input
record, its text as pieces (trained or not, markers apart), the padding, and, on
request, one line per token with its ``seq_id`` and ``position_id``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
import orjson

from ..chat.loss_rule import LossRule, MarkerRule, rule_from_state
from ..chat.tokenizer import ChatTokenizer, load_tokenizer, recorded_tokenizer
from ..errors import DatasetError, UsageError
from ..media.item import VIDEO, MediaSpan
from ..packing.layout import row_layout
from ..packing.plan import row_mask
from ..store.format import REJECTS_FILE, TOKENIZER_FILE
from ..store.reader import Dataset
from ..store.shard import split_segment_flags, split_segments
from ..tokenize import is_hf_state
from ..tokenize.hf import HFTokenizer
from ..tokenize.open import hf_tokenizer_from_state

Tokenizer = ChatTokenizer | HFTokenizer


@dataclass
class Piece:
    """A run of decoded text: one marker, or text tokens that are all trained or all not."""

    text: str
    trained: bool
    marker: bool
    injected: bool = False  # packed rows: context the packer prepended (never trained)
    media: bool = False  # one media item's placeholder tokens, shown as its label (``media_label``)


@dataclass
class EpisodeToken:
    position: int
    id: int
    text: str
    trained: bool
    marker: bool
    span: str  # the span the token lies in: system, user, assistant, tool, or "" outside


@dataclass
class EpisodeView:
    split: str
    episode: int
    record: int | None  # input record number (sources.idx), when stored
    shard: str
    start: int  # token offset in the shard's tokens.bin
    length: int
    trained_tokens: int | None
    pieces: list[Piece]
    tokens: list[EpisodeToken] | None = None
    rule_differs_at: list[int] | None = None  # positions where the stored mask is not the rule's
    last_reply_only: bool = False  # served as one reply's prefix: its last reply alone trained (last_reply.bin)
    media: list[dict] = field(default_factory=list)  # its media spans: MediaSpan.row without "episode"

    def as_dict(self) -> dict:
        return asdict(self)


def media_label(span: MediaSpan, number: int) -> str:
    """What a media item's run of placeholder tokens is shown as: ``<image 1: 480x640 -> 391 tokens>``
    (width x height as shown; a video adds its frames)."""
    item = span.item
    frames = f", {item.count.frames} frames" if item.kind == VIDEO else ""
    return f"<{item.kind} {number}: {item.size[0]}x{item.size[1]}{frames} -> {item.count.tokens} tokens>"


def span_end(ids: np.ndarray, span: MediaSpan) -> int:
    """One past a span's last media token in ``ids``: its tokens are the next ``tokens`` of its
    first token's id from ``offset`` (a timestamped video's or a tiled image's have text between
    them, shown inside its label); ``offset + tokens`` where ``ids`` holds fewer."""
    a, n = span.offset, span.item.count.tokens
    hits = np.flatnonzero(ids[a:] == ids[a]) if 0 <= a < ids.shape[0] and n > 0 else np.zeros(0, np.int64)
    return a + int(hits[n - 1]) + 1 if hits.size >= n > 0 else a + n


def span_rows(spans) -> list[dict]:
    """Media spans as ``--json`` gives them: each one's media table line without its ``episode``."""
    return [{k: v for k, v in s.row(0).items() if k != "episode"} for s in spans]


def media_pieces(ids: np.ndarray, trained: np.ndarray, marker: np.ndarray, tok: Tokenizer, spans, numbers,
                 injected: bool = False) -> list[Piece]:
    """``pieces_of`` with each media span (offsets into ``ids``) one piece, its label: media
    tokens are never decoded as text (hundreds of placeholders say nothing)."""
    out: list[Piece] = []
    pos = 0
    for span, number in zip(spans, numbers):
        a, b = span.offset, span_end(ids, span)
        out += pieces_of(ids[pos:a], trained[pos:a], marker[pos:a], tok, injected)
        out.append(Piece(media_label(span, number), bool(trained[a:b].any()), True, injected, media=True))
        pos = b
    return out + pieces_of(ids[pos:], trained[pos:], marker[pos:], tok, injected)


def media_numbers(spans) -> list[int]:
    """Each span's number among the items of its kind, from 1 (``image 1``, ``image 2``, ``video 1``)."""
    seen: dict[str, int] = {}
    out = []
    for s in spans:
        seen[s.item.kind] = seen.get(s.item.kind, 0) + 1
        out.append(seen[s.item.kind])
    return out


def spans_of(ids: np.ndarray, tok: Tokenizer, rule: LossRule | None = None) -> list[str]:
    """The span each token lies in: system, user, assistant, tool, or "" outside any (a
    model's template: assistant, header, or "")."""
    return (rule or MarkerRule(tok.ids)).span_names(ids)


def pieces_of(ids: np.ndarray, trained: np.ndarray, is_marker: np.ndarray, tok: Tokenizer,
              injected: bool = False) -> list[Piece]:
    """Runs of text that break at every marker and wherever training starts or stops."""
    n = ids.shape[0]
    cut = np.flatnonzero(is_marker[1:] | is_marker[:-1] | (trained[1:] != trained[:-1])) + 1
    bounds = [0, *cut.tolist(), n] if n else [0]
    return [Piece(tok.token_text(int(ids[a])) if is_marker[a] else tok.decode(ids[a:b].tolist()),
                  bool(trained[a]), bool(is_marker[a]), injected) for a, b in zip(bounds[:-1], bounds[1:])]


def is_marker(ids: np.ndarray, tok: Tokenizer) -> np.ndarray:
    """Bool per token: a marker (or EOS; a model's special token), drawn apart from the text."""
    return np.isin(ids, list(tok.special_tokens.values()))


def read_episode(ds: Dataset, split: str, episode: int):
    """Episode ``episode`` of ``split``: (shard, ids int64, stored mask or None, trained
    bool, its input record number or None, its start in the shard). An id out of range says so."""
    sp = ds.split(split)
    shard, local = sp.locate(episode)
    ids, mask = sp.episode(episode)
    ids = np.asarray(ids, dtype=np.int64)
    trained = np.zeros(ids.shape[0], bool) if mask is None else np.asarray(mask) != 0
    src = shard.sources
    record = None if src is None or local >= src.shape[0] else int(src[local])
    return shard, ids, mask, trained, record, int(shard.index[local, 0])


def episode_flag(ds: Dataset, split: str, episode: int, rule: LossRule) -> bool:
    """Whether ``episode`` is flagged to train its last reply only (``last_reply.bin``: a
    template's episode served as one reply's prefix)."""
    return rule.kind == "template" and bool(ds.split(split).last_only_of([episode])[0])


def row_flags(ds: Dataset, split: str, row: int, segments: int, rule: LossRule) -> np.ndarray | None:
    """The "last reply only" flag of each of the ``segments`` segments of packed ``row``
    (None: none flagged)."""
    sp = ds.split(split)
    if rule.kind != "template" or not sp.flagged:
        return None
    a = int(np.searchsorted(split_segments(sp).row, row, side="left"))
    return split_segment_flags(sp)[a:a + segments]


def episode_view(ds: Dataset, split: str, episode: int, tok: Tokenizer, rule: LossRule | None = None, *,
                 tokens: bool = False) -> EpisodeView:
    """One episode as pieces of text (and, with ``tokens``, one line per token), decoded
    with ``tok`` and compared with ``rule`` (default: the chat markers of ``tok``)."""
    rule = rule or MarkerRule(tok.ids)
    shard, ids, mask, trained, record, start = read_episode(ds, split, episode)
    flag = episode_flag(ds, split, episode, rule)
    marker = is_marker(ids, tok)
    lines = None
    if tokens:
        spans = rule.span_names(ids, flag)
        lines = [EpisodeToken(p, int(t), tok.token_text(int(t)), bool(trained[p]), bool(marker[p]), spans[p])
                 for p, t in enumerate(ids)]
    derived = rule.masks(ids, np.array([ids.shape[0]]), last_only=np.array([flag]) if flag else None)
    differs = None if mask is None else np.flatnonzero(derived != trained).tolist()
    spans = ds.media_spans(split, episode)
    return EpisodeView(split=split, episode=int(episode), record=record, shard=shard.name, start=start,
                       length=int(ids.shape[0]),
                       trained_tokens=None if mask is None else int(trained.sum()),
                       pieces=media_pieces(ids, trained, marker, tok, spans, media_numbers(spans)), tokens=lines,
                       rule_differs_at=differs, last_reply_only=flag, media=span_rows(spans))


def find_record(ds: Dataset, record: int) -> tuple[str, int]:
    """(split, episode id) of the episode made from input record ``record``."""
    for name, sp in ds.splits.items():
        src = sp.sources
        if src is None:
            raise DatasetError(f"split {name} has no sources.idx: record numbers are not stored in this dataset; "
                               f"use --episode")
        hit = np.flatnonzero(src == record)
        if hit.size:
            return name, int(hit[0])
    why = ""
    rejects = ds.root / REJECTS_FILE
    if rejects.is_file():
        with open(rejects, "rb") as f:
            for line in f:
                try:
                    r = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if r.get("record") == record:
                    why = f": it was rejected at prepare time ({r.get('reason')}: {r.get('message')}; {r.get('where')})"
                    break
    raise DatasetError(f"input record {record} is in no split of {ds.root}{why or ' (no such record was kept)'}")


def sample_ids(n: int, k: int, seed: int) -> list[int]:
    """``k`` distinct ids of ``n`` (episodes, or rows), drawn with ``RandomState(seed)``, in id order."""
    if k < 1:
        raise UsageError(f"--sample must be at least 1, got {k}")
    return sorted(np.random.RandomState(seed).choice(n, min(k, n), replace=False).tolist()) if n else []


@dataclass
class SegmentView:
    index: int  # its seq_id in the row
    offset: int  # first position in the row; its position_ids run 0..length-1 from here
    length: int
    prefix: int  # injected tokens at its start (stream packing)
    episode: int  # global episode id in the source split
    episode_start: int  # first episode token it holds
    record: int | None  # input record number, when known
    trained_tokens: int
    pieces: list[Piece]


@dataclass
class RowToken:
    position: int  # in the row
    id: int
    text: str
    trained: bool
    marker: bool
    seq_id: int  # -1 on padding
    position_id: int
    span: str


@dataclass
class RowView:
    split: str
    row: int
    shard: str
    row_len: int
    segments: list[SegmentView]
    padding: int  # padding tokens at the end of the row
    pad_id: int | None
    real_tokens: int
    trained_tokens: int | None
    tokens: list[RowToken] | None = None
    rule_differs_at: list[int] | None = None  # positions where the stored mask is not the rule's per segment
    media: list[dict] = field(default_factory=list)  # its media spans (offsets in the row): MediaSpan.row less "episode"

    def as_dict(self) -> dict:
        return asdict(self)


def read_row(ds: Dataset, split: str, row: int):
    """Row ``row`` of a packed split: (shard, ids int64, stored mask or None, trained bool,
    its segments with rows numbered local to this one row). An id out of range says so."""
    sp = ds.split(split)
    shard, _ = sp.locate(row)
    ids, mask = sp.row(row)
    ids = np.asarray(ids, dtype=np.int64)
    trained = np.zeros(ids.shape[0], bool) if mask is None else np.asarray(mask) != 0
    seg = split_segments(sp).of_rows([row])
    return shard, ids, mask, trained, replace(seg, row=np.zeros(len(seg), np.int64))


def row_view(ds: Dataset, split: str, row: int, tok: Tokenizer, rule: LossRule | None = None, *,
             tokens: bool = False) -> RowView:
    """One row: its segments (text, positions, episode, record), padding, tokens; decoded
    with ``tok``, compared with ``rule`` per segment (default: the chat markers of ``tok``)."""
    rule = rule or MarkerRule(tok.ids)
    shard, ids, mask, trained, seg = read_row(ds, split, row)
    flags = row_flags(ds, split, row, len(seg), rule)
    L = ids.shape[0]
    marker = is_marker(ids, tok)
    media = ds.media_spans(split, row)
    segments = []
    for i in range(len(seg)):
        a, b = int(seg.offset[i]), int(seg.offset[i] + seg.length[i])
        c = a + int(seg.prefix[i])  # injected context [a, c), episode tokens [c, b)
        pieces = pieces_of(ids[a:c], trained[a:c], marker[a:c], tok, injected=True) if c > a else []
        mine = [replace(s, offset=s.offset - c) for s in media if c <= s.offset < b]  # never cut: in one segment
        pieces += media_pieces(ids[c:b], trained[c:b], marker[c:b], tok, mine, media_numbers(mine))  # from 1 each
        segments.append(SegmentView(
            index=i, offset=a, length=b - a, prefix=c - a, episode=int(seg.episode[i]),
            episode_start=int(seg.episode_start[i]), record=None if seg.source[i] < 0 else int(seg.source[i]),
            trained_tokens=int(trained[a:b].sum()), pieces=pieces))
    real = int(seg.length.sum())
    lines = None
    if tokens:  # spans restart in every segment (a segment may start inside a span: stream packing)
        seq, pos = row_layout(seg.row, seg.offset, seg.length, 1, L)
        spans = [""] * L
        for i, (a, b) in enumerate(zip(seg.offset.tolist(), (seg.offset + seg.length).tolist())):
            spans[a:b] = rule.span_names(ids[a:b], flags is not None and bool(flags[i]))
        lines = [RowToken(p, int(t), tok.token_text(int(t)), bool(trained[p]), bool(marker[p]), int(seq[0, p]),
                          int(pos[0, p]), spans[p]) for p, t in enumerate(ids)]
    differs = None if mask is None else np.flatnonzero(row_mask(ids, seg, L, rule, last_only=flags)
                                                      != trained).tolist()
    return RowView(split=split, row=int(row), shard=shard.name, row_len=L, segments=segments, padding=L - real,
                   pad_id=(ds.packing or {}).get("pad_token_id"), real_tokens=real,
                   trained_tokens=None if mask is None else int(trained.sum()), tokens=lines, rule_differs_at=differs,
                   media=span_rows(media))


def rows_of_record(ds: Dataset, record: int) -> list[tuple[str, int]]:
    """(split, row) of every row holding a piece of input record ``record``."""
    out = []
    for name, sp in ds.splits.items():
        seg = split_segments(sp)
        out += [(name, int(r)) for r in np.unique(seg.row[seg.source == record])]
    return out


def select_rows(ds: Dataset, split: str, *, rows=None, episodes=None, record=None, sample=None, seed=0
                ) -> list[tuple[str, int]]:
    """The (split, row) pairs ``inspect --row/--record/--sample`` shows on a packed dataset."""
    if episodes:
        raise UsageError("a packed dataset holds rows: use --row R (or --record N for the rows of an input record)")
    if record is not None:
        found = rows_of_record(ds, record)
        if not found:
            raise DatasetError(f"input record {record} is in no row of {ds.root} (not kept by prepare, or dropped "
                               f"by pack --overlong drop)")
        return found
    if sample is not None:
        return [(split, r) for r in sample_ids(ds.split(split).num_rows, sample, seed)]
    return [(split, int(r)) for r in rows]


def dataset_tokenizer(ds: Dataset, tokenizer: str | None = None) -> tuple[Tokenizer, LossRule, list[str]]:
    """The tokenizer that decodes ``ds``, its mask rule, and notes: the recorded one (a
    model's tokenizer.json: from ``tokenizer`` when it has moved), else for an older flat
    layout ``tokenizer`` or cl100k_base."""
    if is_hf_state(ds.tokenizer_state):
        tok = hf_tokenizer_from_state(ds.tokenizer_state, str(ds.root / TOKENIZER_FILE), path=tokenizer)
        return tok, rule_from_state(ds.tokenizer_state, str(ds.root / TOKENIZER_FILE)), []
    if ds.tokenizer_state is not None:
        tok = recorded_tokenizer(ds.root, ds.tokenizer_state)
        return tok, MarkerRule(tok.ids), []
    tok = load_tokenizer(tokenizer)
    return tok, MarkerRule(tok.ids), [f"the dataset records no tokenizer: decoded with {tok.name} (pass "
                                      f"--tokenizer to choose)"]
