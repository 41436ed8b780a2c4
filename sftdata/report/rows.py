"""One packed row as data: what ``sftdata inspect PACKED --row R`` shows.

A row (docs/PACKING.md) is segments from offset 0, then padding::

    row:            U  u  E  A  a  E  EOS | U  v  E  EOS | pad pad
    seq_ids:        0  0  0  0  0  0  0   | 1  1  1  1   | -1  -1
    position_ids:   0  1  2  3  4  5  6   | 0  1  2  3   |  0   0

``row_view`` returns each segment with its offset, positions, source episode and input
record, its text as pieces (trained or not, markers apart), the padding, and, on
request, one line per token with its ``seq_id`` and ``position_id``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from ..errors import DatasetError, UsageError
from ..loss_rule import LossRule, MarkerRule
from ..packing import row_layout, row_mask
from ..store import Dataset, split_segments
from .episodes import Piece, Tokenizer, is_marker, pieces_of, sample_ids


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
    L = ids.shape[0]
    marker = is_marker(ids, tok)
    segments = []
    for i in range(len(seg)):
        a, b = int(seg.offset[i]), int(seg.offset[i] + seg.length[i])
        c = a + int(seg.prefix[i])  # injected context [a, c), episode tokens [c, b)
        pieces = pieces_of(ids[a:c], trained[a:c], marker[a:c], tok, injected=True) if c > a else []
        pieces += pieces_of(ids[c:b], trained[c:b], marker[c:b], tok)
        segments.append(SegmentView(
            index=i, offset=a, length=b - a, prefix=c - a, episode=int(seg.episode[i]),
            episode_start=int(seg.episode_start[i]), record=None if seg.source[i] < 0 else int(seg.source[i]),
            trained_tokens=int(trained[a:b].sum()), pieces=pieces))
    real = int(seg.length.sum())
    lines = None
    if tokens:  # spans restart in every segment (a segment may start inside a span: stream packing)
        seq, pos = row_layout(seg.row, seg.offset, seg.length, 1, L)
        spans = [""] * L
        for a, b in zip(seg.offset.tolist(), (seg.offset + seg.length).tolist()):
            spans[a:b] = rule.span_names(ids[a:b])
        lines = [RowToken(p, int(t), tok.token_text(int(t)), bool(trained[p]), bool(marker[p]), int(seq[0, p]),
                          int(pos[0, p]), spans[p]) for p, t in enumerate(ids)]
    differs = None if mask is None else np.flatnonzero(row_mask(ids, seg, L, rule) != trained).tolist()
    return RowView(split=split, row=int(row), shard=shard.name, row_len=L, segments=segments, padding=L - real,
                   pad_id=(ds.packing or {}).get("pad_token_id"), real_tokens=real,
                   trained_tokens=None if mask is None else int(trained.sum()), tokens=lines, rule_differs_at=differs)


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
