"""store.format: the on-disk encoding of segments (segments.idx) round-trips, keeps
unknown records as -1, and tolerates damaged values; a split's segments get global rows."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.errors import DatasetError
from sftdata.packing import Segments
from sftdata.store import open_dataset, split_segments
from sftdata.store.format import NO_SOURCE, SEGMENT_FIELDS, decode_segments, encode_segments
from tests.helpers.audit import make_packed, read_segments, shard


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


def test_a_packed_split_names_its_items_rows_and_warns_on_the_older_episode_names(tmp_path):
    packed = make_packed(tmp_path, "bfd", block_size=63, shard_tokens=128)  # 2 rows per shard
    sp = open_dataset(packed).split("train")
    assert sp.packed and sp.what == "row" and sp.num_rows == sp.num_items == 4
    toks, mask = sp.row(3)
    assert toks.shape == mask.shape == (64,) and toks.tolist() == sp.item(3)[0].tolist()
    with pytest.raises(DatasetError, match=r"row 4 does not exist in split 'train', which has 4 rows \(ids 0..3\)"):
        sp.row(4)
    old = r"split 'train' is packed: its items are rows; Split.{} is the older name, use Split.{}"
    with pytest.warns(DeprecationWarning, match=old.format("num_episodes", "num_rows")):
        assert sp.num_episodes == 4
    with pytest.warns(DeprecationWarning, match=old.format(r"episode\(i\)", r"row\(i\)")):
        assert sp.episode(3)[0].tolist() == toks.tolist()
    with pytest.warns(DeprecationWarning, match=old.format("episode_offsets", "item_offsets")):
        assert sp.episode_offsets.tolist() == sp.item_offsets.tolist() == [0, 2, 4]
    sh = sp.shards[1]
    with pytest.warns(DeprecationWarning, match=r"shard train/shard_00001 is packed: its items are rows; "
                      r"Shard.num_episodes is the older name, use Shard.num_items"):
        assert sh.num_episodes == sh.num_items == 2
    with pytest.warns(DeprecationWarning, match=r"Shard.episodes is the older name, use Shard.index"):
        assert sh.episodes.tolist() == sh.index.tolist() == [[0, 64], [64, 64]]
