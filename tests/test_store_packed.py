"""store.packed: the on-disk encoding of segments (segments.idx) round-trips, keeps
unknown records as -1, and tolerates damaged values; a split's segments get global rows."""

from __future__ import annotations

import numpy as np
import pytest
from audit_data import make_packed, read_segments, shard

from sftdata.packing import Segments
from sftdata.store import NO_SOURCE, SEGMENT_FIELDS, open_dataset, split_segments
from sftdata.store.packed import decode_segments, encode_segments


def test_encode_decode_round_trip_with_unknown_records():
    seg = Segments(row=np.array([0, 0, 1]), offset=np.array([0, 5, 0]), length=np.array([5, 3, 8]),
                   prefix=np.array([0, 0, 2]), episode=np.array([4, 9, 9]), episode_start=np.array([0, 0, 3]),
                   source=np.array([17, -1, -1]))
    raw = encode_segments(seg)
    assert raw.dtype == np.int64 and raw.shape == (3, len(SEGMENT_FIELDS))
    assert raw[:, 6].tolist() == [17, -1, -1] and raw[:, 2].tolist() == [5, 3, 8]
    stored = raw.astype("<u8")  # as the writer stores it: -1 becomes NO_SOURCE
    assert stored[1, 6] == NO_SOURCE
    back = decode_segments(stored)
    for f in SEGMENT_FIELDS:
        assert getattr(back, f).tolist() == getattr(seg, f).tolist() and getattr(back, f).dtype == np.int64


def test_decode_clips_damaged_values_and_checks_the_shape():
    raw = np.full((1, 7), np.iinfo(np.uint64).max, dtype="<u8")
    seg = decode_segments(raw)
    assert seg.row.tolist() == [2**62] and seg.length.tolist() == [2**62] and seg.source.tolist() == [-1]
    assert len(decode_segments(np.zeros((0, 7), "<u8"))) == 0
    with pytest.raises(ValueError, match=r"segment records must be \(k, 7\), got shape \(2, 6\)"):
        decode_segments(np.zeros((2, 6), "<u8"))


def test_split_segments_are_the_stored_records_with_global_rows(tmp_path):
    packed = make_packed(tmp_path, "bfd", block_size=63, shard_tokens=128)  # 2 rows per shard
    sp = open_dataset(packed).split("train")
    seg = split_segments(sp)
    assert len(sp.shards) == 2 and seg.row.tolist() == sorted(seg.row.tolist())
    raw = np.concatenate([read_segments(shard(packed, "train", i) / "segments.idx") for i in range(2)]).astype(np.int64)
    raw[:, 0] += np.repeat([0, 2], [read_segments(shard(packed, "train", i) / "segments.idx").shape[0]
                                    for i in range(2)])
    assert encode_segments(seg).tolist() == raw.tolist()
