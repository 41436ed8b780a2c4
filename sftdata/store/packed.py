"""The segments of packed splits (what rebuilds each row's conversations)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DatasetError
from .format import SEGMENT_FIELDS, SEGMENTS_FILE
from .reader import Split


@dataclass
class Segments:
    """The segments of a packed split, global row ids, int64 arrays (source -1 = unknown)."""

    row: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    prefix: np.ndarray
    episode: np.ndarray
    episode_start: np.ndarray
    source: np.ndarray

    def of_rows(self, rows) -> Segments:
        """The segments of the given rows, in the order of ``rows`` (then offset)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        a = np.searchsorted(self.row, rows, side="left")
        b = np.searchsorted(self.row, rows, side="right")
        n = b - a
        idx = np.repeat(a - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        return Segments(*(getattr(self, f)[idx] for f in SEGMENT_FIELDS))


def split_segments(split: Split) -> Segments:
    """All segments of a packed split with global row ids."""
    parts = []
    for si, sh in enumerate(split.shards):
        if sh.segments is None:
            raise DatasetError(f"{sh.path / SEGMENTS_FILE} is missing; the packed dataset is incomplete. "
                               f"Re-create it with `sftdata pack`")
        a = np.asarray(sh.segments).astype(np.int64)  # NO_SOURCE wraps to -1
        a[:, 0] += int(split.episode_offsets[si])
        parts.append(a)
    a = np.concatenate(parts) if parts else np.empty((0, len(SEGMENT_FIELDS)), np.int64)
    return Segments(*(np.ascontiguousarray(a[:, i]) for i in range(len(SEGMENT_FIELDS))))
