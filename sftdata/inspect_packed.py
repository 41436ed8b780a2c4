"""``inspect`` for packed datasets: the split overview and one row at a time.

A row (docs/PACKING.md) is segments from offset 0, then padding::

    row:            S  u  E  A  a  E  EOS | U  v  E  EOS | pad pad
    seq_ids:        0  0  0  0  0  0  0   | 1  1  1  1   | -1  -1
    position_ids:   0  1  2  3  4  5  6   | 0  1  2  3   |  0   0

``row_view`` returns each segment with its offset, positions, source episode and input
record, its text as pieces (trained or not, markers apart), the padding, and, on
request, one row per token with its ``seq_id`` and ``position_id``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .errors import DatasetError, UsageError
from .packing import row_layout, segment_masks
from .store import Dataset, Split, split_segments
from .tokenizer import ChatTokenizer


@dataclass
class PackedInfo:
    """What packing did to one split, from the segments."""

    row_len: int
    rows: int
    segments: int
    real_tokens: int  # segment tokens, injected ones included; the rest is padding
    injected_tokens: int
    padding_tokens: int
    fill: float  # real tokens / (rows x row_len)
    segments_per_row: dict[str, float]  # min, p50, max, mean


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
    pieces: list  # inspect.Piece


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


def packed_info(sp: Split, row_len: int) -> PackedInfo:
    seg = split_segments(sp)
    rows = sp.num_episodes
    real = int(seg.length.sum())
    per_row = np.bincount(seg.row, minlength=rows) if rows else np.zeros(0, np.int64)
    stats = {} if not rows else {"p0": float(per_row.min()), "p50": float(np.median(per_row)),
                                 "p100": float(per_row.max()), "mean": round(float(per_row.mean()), 4)}
    return PackedInfo(row_len=row_len, rows=rows, segments=int(seg.row.size), real_tokens=real,
                      injected_tokens=int(seg.prefix.sum()), padding_tokens=rows * row_len - real,
                      fill=real / (rows * row_len) if rows else 0.0, segments_per_row=stats)


def segment_lengths(sp: Split) -> np.ndarray:
    return split_segments(sp).length


def _packing(ds: Dataset) -> dict:
    return (ds.metadata or {}).get("packing") or {}


def row_view(ds: Dataset, split: str, row: int, tok: ChatTokenizer, *, tokens: bool = False) -> RowView:
    """One row: its segments (text, positions, episode, record), padding, tokens."""
    from .inspect import pieces_of, spans_of  # the episode view's helpers (inspect imports this module)

    sp = ds.split(split)
    shard, local = sp.locate(row)
    ids, mask = sp.episode(row)
    ids = np.asarray(ids, dtype=np.int64)
    L = ids.shape[0]
    trained = np.zeros(L, bool) if mask is None else np.asarray(mask) != 0
    seg = split_segments(sp).of_rows([row])
    pad_id = _packing(ds).get("pad_token_id")
    is_marker = np.isin(ids, list(tok.special_tokens.values()))
    segments = []
    for i in range(seg.row.size):
        a, b = int(seg.offset[i]), int(seg.offset[i] + seg.length[i])
        c = a + int(seg.prefix[i])  # injected context [a, c), episode tokens [c, b)
        pieces = (pieces_of(ids[a:c], trained[a:c], is_marker[a:c], tok, injected=True) if c > a else [])
        pieces += pieces_of(ids[c:b], trained[c:b], is_marker[c:b], tok)
        segments.append(SegmentView(
            index=i, offset=a, length=b - a, prefix=c - a, episode=int(seg.episode[i]),
            episode_start=int(seg.episode_start[i]), record=None if seg.source[i] < 0 else int(seg.source[i]),
            trained_tokens=int(trained[a:b].sum()), pieces=pieces))
    real = int(seg.length.sum())
    seq, pos = row_layout(np.zeros(seg.row.size, np.int64), seg.offset, seg.length, 1, L)
    rows = None
    if tokens:  # spans restart in every segment (a segment may start inside a span: stream packing)
        spans = [""] * L
        for a, b in zip(seg.offset.tolist(), (seg.offset + seg.length).tolist()):
            spans[a:b] = spans_of(ids[a:b], tok)
        rows = [RowToken(p, int(t), tok.token_text(int(t)), bool(trained[p]), bool(is_marker[p]), int(seq[0, p]),
                         int(pos[0, p]), spans[p]) for p, t in enumerate(ids)]
    differs = None
    if mask is not None:  # the rule per segment, over its episode tokens (not the injected ones)
        take = seg.length - seg.prefix
        dest = np.concatenate([np.arange(a, a + t) for a, t in zip(seg.offset + seg.prefix, take)] or [[]])
        dest = dest.astype(np.int64)
        exp = np.zeros(L, np.uint8)
        exp[dest] = segment_masks(ids[dest], take, tok.ids)
        exp[seg.offset] = 0
        differs = np.flatnonzero(exp != trained).tolist()
    return RowView(split=split, row=int(row), shard=shard.name, row_len=L, segments=segments, padding=L - real,
                   pad_id=pad_id, real_tokens=real, trained_tokens=None if mask is None else int(trained.sum()),
                   tokens=rows, rule_differs_at=differs)


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
    from .inspect import sample_ids

    if episodes:
        raise UsageError("a packed dataset holds rows: use --row R (or --record N for the rows of an input record)")
    if record is not None:
        found = rows_of_record(ds, record)
        if not found:
            raise DatasetError(f"input record {record} is in no row of {ds.root} (not kept by prepare, or dropped "
                               f"by pack --overlong drop)")
        return found
    if sample is not None:
        return [(split, r) for r in sample_ids(ds.split(split).num_episodes, sample, seed)]
    return [(split, int(r)) for r in rows]
