"""Segments and the layout of a packed row: the one description pack, the store, verify,
the report and the loader share. Pure; no I/O.

A row holds ``row_len = block_size + 1`` tokens (``x = row[:-1]``, ``y = row[1:]``).
Each piece of an episode placed in a row is a *segment*; segments run from offset 0,
padding (``pad_id``, mask 0) fills the rest::

    row (row_len = 12):   U  u  E  A  a  E  EOS | U  v  E  EOS | pad
    segment:              0 (offset 0, length 7) | 1 (7, 4)     | -
    seq_ids:              0  0  0  0  0  0  0   | 1  1  1  1   | -1
    position_ids:         0  1  2  3  4  5  6   | 0  1  2  3   |  0

The mask of a row is ``plan.row_mask``: the dataset's mask rule per segment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..util.ranges import range_index

PAD_SEQ_ID = -1  # seq_id of padding positions


@dataclass
class Segments:
    """Segment records, one entry per segment: int64 arrays of one length, sorted by
    (row, offset). The field order is the order of the columns of ``segments.idx``.

    ``row`` counts rows the way its holder says (a split's global row ids, a chunk's or
    a shard's local ones); ``length`` includes the ``prefix`` injected tokens (context,
    stream packing) at the segment's start, followed by ``take`` tokens of episode
    ``episode`` from its token ``episode_start``; ``source`` is the episode's input
    record number, -1 when unknown.
    """

    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    prefix: np.ndarray
    episode: np.ndarray
    episode_start: np.ndarray
    source: np.ndarray

    @classmethod
    def empty(cls) -> Segments:
        return cls(*(np.zeros(0, np.int64) for _ in fields(cls)))

    @classmethod
    def concat(cls, parts: list[Segments]) -> Segments:
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    def __len__(self) -> int:
        return int(self.row.shape[0])

    def __getitem__(self, idx) -> Segments:
        """The segments at ``idx`` (a slice, an index array or a bool mask), all fields."""
        return Segments(*(getattr(self, f.name)[idx] for f in fields(self)))

    @property
    def take(self) -> np.ndarray:
        """Episode tokens of each segment (its length without the injected prefix)."""
        return self.length - self.prefix

    def row_range(self, r0: int, r1: int) -> tuple[int, int]:
        """Index range ``[a, b)`` of the segments of rows ``r0 .. r1 - 1``."""
        a, b = np.searchsorted(self.row, [r0, r1], side="left")
        return int(a), int(b)

    def of_rows(self, rows) -> Segments:
        """The segments of the given rows, in the order of ``rows`` (then offset)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        a = np.searchsorted(self.row, rows, side="left")
        b = np.searchsorted(self.row, rows, side="right")
        return self[range_index(a, b - a)]

    def flat_start(self, row_len: int) -> np.ndarray:
        """Position of each segment's first token in its rows laid end to end."""
        return self.row * row_len + self.offset


def row_layout(seg_row: np.ndarray, seg_offset: np.ndarray, seg_length: np.ndarray, num_rows: int,
               row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``seq_ids`` and ``position_ids`` (int64, shape (num_rows, row_len)) of rows whose
    segments (``seg_row`` local to these rows, sorted by (row, offset), contiguous from
    offset 0) are given. Segment ``i`` of a row has seq_id ``i``; padding has
    ``PAD_SEQ_ID`` and position 0 (each padding token is its own length-1 sequence).
    """
    seg_row = np.asarray(seg_row, dtype=np.int64)
    seg_offset = np.asarray(seg_offset, dtype=np.int64)
    seg_length = np.asarray(seg_length, dtype=np.int64)
    L = row_len
    starts = np.zeros((num_rows, L), dtype=np.int64)
    starts[seg_row, seg_offset] = 1
    seq = np.cumsum(starts, axis=1) - 1
    real = np.zeros(num_rows, dtype=np.int64)
    np.maximum.at(real, seg_row, seg_offset + seg_length)
    col = np.arange(L, dtype=np.int64)
    pad = col[None, :] >= real[:, None]
    seg_start = np.maximum.accumulate(np.where(starts == 1, col[None, :], 0), axis=1)
    pos = col[None, :] - seg_start
    seq[pad] = PAD_SEQ_ID
    pos[pad] = 0
    return seq, pos


def episode_positions(seg: Segments, row_len: int) -> np.ndarray:
    """Where the episode tokens of ``seg`` lie in their rows laid end to end (segment
    order; injected prefixes and padding excluded)."""
    return range_index(seg.flat_start(row_len) + seg.prefix, seg.take)
