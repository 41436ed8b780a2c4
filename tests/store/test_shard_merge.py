"""A packed shard merged from pieces (``pack --engine ray``) is byte for byte the shard
written at once, the "last reply only" flags of its segments included."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.store.format import LAST_REPLY_FILE, LAST_REPLY_KEY
from sftdata.store.shard import Shard
from sftdata.store.shard_merge import merge_packed_pieces
from sftdata.store.split_writer import PackedSplitWriter

L = 8  # row_len
# four rows of two segments each: (row, offset, length, prefix, episode, episode_start, source)
SEGMENTS = np.array([[r, o, 4, 0, 2 * r + i, 0, 2 * r + i] for r in range(4) for i, o in enumerate((0, 4))])
TOKENS = np.arange(4 * L, dtype=np.int64).reshape(4, L) % 50
MASK = (np.arange(4 * L).reshape(4, L) % 3 == 0).astype(np.uint8)


def _write(folder, rows: slice, flags):
    folder.mkdir()
    w = PackedSplitWriter(folder, "s", np.dtype("<u2"), L, 1 << 20)
    seg = SEGMENTS[(SEGMENTS[:, 0] >= rows.start) & (SEGMENTS[:, 0] < rows.stop)].copy()
    keep = np.isin(SEGMENTS[:, 0], np.arange(rows.start, rows.stop))
    seg[:, 0] -= rows.start
    w.add_rows(TOKENS[rows], MASK[rows], seg, last_only=None if flags is None else flags[keep])
    return w.close()["shards"][0]


@pytest.mark.parametrize("flags", [None, np.array([0, 0, 0, 0, 1, 1, 0, 1], np.uint8),
                                   np.array([1, 0, 0, 0, 0, 0, 0, 0], np.uint8)])
def test_a_merged_shard_is_the_shard_written_at_once(tmp_path, flags):
    whole = _write(tmp_path / "whole", slice(0, 4), flags)
    pieces = [(tmp_path / f"p{i}" / "s" / "shard_00000", _write(tmp_path / f"p{i}", slice(2 * i, 2 * i + 2), flags))
              for i in range(2)]
    merged = merge_packed_pieces(pieces, L, tmp_path / "merged", "shard_00000")
    assert merged == whole
    flagged = 0 if flags is None else int(flags.sum())
    assert whole.get(LAST_REPLY_KEY, 0) == flagged and (LAST_REPLY_FILE in whole["files"]) == bool(flagged)
    for name in whole["files"]:
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "whole" / "s" / "shard_00000" / name).read_bytes()
    shard = Shard(tmp_path / "merged", np.dtype("<u2"), packed=True)
    assert shard.last_only().tolist() == ([False] * 8 if flags is None else (flags != 0).tolist())
