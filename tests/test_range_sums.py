"""range_sums: per-range sums of a mask, by reduceat and by popcount, equal plain sums."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.range_sums import range_sums, read_range, trained_per_episode


def test_range_sums():
    v = np.array([1, 0, 1, 1, 0, 1, 1], dtype=np.uint8)
    assert range_sums(v, np.array([0, 2, 5]), np.array([2, 4, 7])).tolist() == [1, 2, 2]
    assert range_sums(v, np.array([1, 3]), np.array([3, 5])).tolist() == [1, 1]
    assert range_sums(v.astype("<f4"), np.array([0]), np.array([7])).tolist() == [5]
    assert range_sums(v, np.array([], np.int64), np.array([], np.int64)).tolist() == []


@pytest.mark.parametrize("seed", range(5))
def test_trained_per_episode_popcount_equals_plain_sums(tmp_path, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, 300)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    mask = (rng.random(int(ends[-1])) < 0.4).astype(np.uint8)
    mask.tofile(tmp_path / "m.bin")
    mm = np.memmap(tmp_path / "m.bin", dtype=np.uint8, mode="r")
    keep = int(rng.integers(1, 30))
    want = [int(mask[a:b].sum()) for a, b in zip(starts, ends)]
    want_late = [int(mask[a + keep:b].sum()) if b - a > keep else 0 for a, b in zip(starts, ends)]
    for m in (mask, mm, mask.astype("<f4")):  # popcount on uint8 (in memory, mapped); reduceat on float32
        for chunk in (1 << 20, 97):  # one read, and many small reads
            trained, late = trained_per_episode(m, starts[1:], ends[1:], keep, chunk=chunk)
            assert trained.tolist() == want[1:] and late.tolist() == want_late[1:]


def test_read_range_of_a_memory_map_with_padding(tmp_path):
    a = np.arange(100, dtype="<u4")
    a.tofile(tmp_path / "a.bin")
    mm = np.memmap(tmp_path / "a.bin", dtype="<u4", mode="r")
    assert read_range(mm, 10, 15, pad=3).tolist() == [10, 11, 12, 13, 14, 0, 0, 0]
    assert read_range(a, 98, 100).tolist() == [98, 99]
