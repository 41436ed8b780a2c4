"""The on-disk encoding of segments (``segments.idx``) and the segments of a packed split.

``segments.idx`` holds one record of ``len(SEGMENT_FIELDS)`` little-endian uint64 per
segment, the fields of ``packing.Segments`` in that order, ``source`` -1 written as
``NO_SOURCE``. The type is the packer's (``sftdata.packing``); only its encoding lives here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import DatasetError
from ..packing import Segments
from .format import NO_SOURCE, SEGMENT_FIELDS, SEGMENTS_FILE
from .split import Split

_CLIP = np.uint64(2**62)  # damaged values stay large and positive (int64 would wrap them negative)


def encode_segments(seg: Segments) -> np.ndarray:
    """(k, 7) int64 records in ``SEGMENT_FIELDS`` order (what ``PackedSplitWriter.add_rows``
    takes; it writes ``source`` -1 as ``NO_SOURCE``)."""
    return np.stack([np.asarray(getattr(seg, f), dtype=np.int64) for f in SEGMENT_FIELDS], axis=1)


def decode_segments(records: np.ndarray) -> Segments:
    """``Segments`` of (k, 7) uint64 records as stored: ``NO_SOURCE`` becomes -1, and a
    damaged value past 2**62 is clipped to 2**62 (so checks see it out of range)."""
    a = np.asarray(records)
    if a.ndim != 2 or a.shape[1] != len(SEGMENT_FIELDS):
        raise ValueError(f"segment records must be (k, {len(SEGMENT_FIELDS)}), got shape {a.shape}")
    out = np.minimum(a, _CLIP).astype(np.int64)
    col = {f: np.ascontiguousarray(out[:, i]) for i, f in enumerate(SEGMENT_FIELDS)}
    col["source"][a[:, SEGMENT_FIELDS.index("source")] == NO_SOURCE] = -1
    return Segments(**col)


def split_segments(split: Split) -> Segments:
    """All segments of a packed split, with global row ids."""
    parts = []
    for si, sh in enumerate(split.shards):
        if sh.segments is None:
            raise DatasetError(f"{sh.path / SEGMENTS_FILE} is missing; the packed dataset is incomplete. "
                               f"Re-create it with `sftdata pack`")
        seg = decode_segments(sh.segments)
        parts.append(replace(seg, row=seg.row + int(split.item_offsets[si])))
    return Segments.concat(parts)
