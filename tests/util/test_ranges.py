"""ranges: positions and values of many ranges, per-range sums of a mask (by reduceat
and by popcount) and runs of whole items, each equal to its plain Python loop."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.util.ranges import OnesBefore, gather_ranges, range_index, range_sums, read_range, trained_per_episode, whole_runs


def test_range_index_and_gather_ranges():
    arr = np.arange(100, 120)
    assert range_index([5, 0, 17], [2, 3, 0]).tolist() == [5, 6, 0, 1, 2]
    assert gather_ranges(arr, [5, 0, 17], [2, 3, 0]).tolist() == [105, 106, 100, 101, 102]
    assert range_index([], []).tolist() == [] and range_index([], []).dtype == np.int64
    empty = gather_ranges(arr.astype(np.uint16), [], [])
    assert empty.tolist() == [] and empty.dtype == np.uint16


@pytest.mark.parametrize("seed", range(5))
def test_range_index_equals_concatenated_aranges(seed):
    rng = np.random.default_rng(seed)
    starts, lengths = rng.integers(0, 1000, 50), rng.integers(0, 20, 50)
    want = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
    assert range_index(starts, lengths).tolist() == want.tolist()


def test_whole_runs():
    assert list(whole_runs(np.cumsum([3, 4, 2, 9, 1]), budget=7)) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert list(whole_runs(np.cumsum([3, 4, 2, 9, 1]), budget=100)) == [(0, 5)]
    assert list(whole_runs(np.array([], np.int64), budget=7)) == []
    # with starts: the span of a run includes the gaps between its items
    assert list(whole_runs(np.array([2, 10, 12]), budget=5, starts=np.array([0, 8, 10]))) == [(0, 1), (1, 3)]


@pytest.mark.parametrize("seed", range(5))
def test_whole_runs_cover_every_item_once_within_the_budget(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 50, 200)
    ends = np.cumsum(lengths)
    budget = int(rng.integers(1, 200))
    runs = list(whole_runs(ends, budget))
    assert [i for a, b in runs for i in range(a, b)] == list(range(200))
    for a, b in runs:
        assert b - a == 1 or int(lengths[a:b].sum()) <= budget
        assert b == 200 or int(lengths[a:b + 1].sum()) > budget  # as many items as fit


def test_ones_before(tmp_path):
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 1, 0], np.uint8)
    at = np.array([9, 0, 2, 5, 7, 8, 9])
    assert OnesBefore(mask)(at).tolist() == [5, 0, 0, 2, 4, 5, 5]
    assert OnesBefore(mask.astype(np.float32))(at).tolist() == [5, 0, 0, 2, 4, 5, 5]
    big = (np.random.default_rng(0).random(1001) < 0.4).astype(np.uint8)
    x = np.arange(1002)
    assert OnesBefore(big)(x).tolist() == np.concatenate([[0], np.cumsum(big)]).tolist()
    big.tofile(tmp_path / "mask.bin")  # a slice of a memory map: [lo, hi) read once
    m = np.memmap(tmp_path / "mask.bin", np.uint8, "r")
    for lo, hi in ((0, 1001), (3, 11), (17, 17), (500, 1001)):
        want = np.concatenate([[0], np.cumsum(big[lo:hi])])
        assert OnesBefore(m, lo, hi)(np.arange(hi - lo + 1)).tolist() == want.tolist()
        assert OnesBefore(m.astype(np.float32), lo, hi)(np.arange(hi - lo + 1)).tolist() == want.tolist()


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
