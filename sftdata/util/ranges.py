"""Vectorised helpers over many ranges of one (often memory-mapped) array. Pure numpy.

A range is ``(start, length)`` or ``[start, end)`` of positions; the helpers never loop
in Python over ranges or tokens::

    arr:                 10 11 12 13 14 15 16 17
    ranges (s, n):       (5, 2)  (0, 3)
    range_index:         5 6 0 1 2
    gather_ranges:       15 16 10 11 12

* ``range_index`` / ``gather_ranges``: the positions / values of many ranges, concatenated;
* ``range_sums`` / ``OnesBefore`` / ``trained_per_episode``: per-range sums of a mask (a
  1 GB dataset's trained tokens per episode in well under a second);
* ``read_range``: a slice of a memory map read with one system call;
* ``whole_runs``: consecutive whole items (episodes, rows, segments) up to a token budget,
  the unit every chunked pass (pack, verify, the report) works in.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

CHUNK_TOKENS = 8 << 20  # tokens a chunked pass holds at once (a few tens of MB of arrays)


def whole_runs(ends, budget: int = CHUNK_TOKENS, starts=None) -> Iterator[tuple[int, int]]:
    """Runs ``[i, j)`` of consecutive items covering all of them, each spanning at most
    ``budget`` positions from its first item's start to its last item's end (at least
    one item per run, however long). Item ``k`` ends at ``ends[k]`` (sorted) and starts
    at ``starts[k]``, by default where the previous item ends (``0`` for the first).

    >>> list(whole_runs(np.cumsum([3, 4, 2, 9, 1]), budget=7))
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    ends = np.asarray(ends, dtype=np.int64)
    n = ends.shape[0]
    i = 0
    while i < n:
        lo = int(starts[i]) if starts is not None else (int(ends[i - 1]) if i else 0)
        j = max(i + 1, int(np.searchsorted(ends, lo + budget, side="right")))
        yield i, j
        i = j


def range_index(starts, lengths) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, int64.

    >>> range_index([5, 0], [2, 3]).tolist()
    [5, 6, 0, 1, 2]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths)
    return np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)


def gather_ranges(arr, starts, lengths) -> np.ndarray:
    """``concatenate([arr[s:s + n] for s, n in zip(starts, lengths)])``, one fancy index."""
    if int(np.asarray(lengths, dtype=np.int64).sum()) == 0:
        return np.asarray(arr[:0]).copy()
    return np.asarray(arr)[range_index(starts, lengths)]


def range_sums(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``values[s:e].sum()`` for each sorted, disjoint, non-empty range; one reduceat pass.

    >>> range_sums(np.array([1, 1, 0, 1, 1]), np.array([0, 3]), np.array([2, 5])).tolist()
    [2, 2]
    """
    if not len(starts):
        return np.zeros(0, np.int64)
    idx = np.empty(2 * len(starts), np.int64)
    idx[0::2], idx[1::2] = starts, ends
    if idx[-1] >= values.shape[0]:  # the last range runs to the end: reduceat's last bin does
        idx = idx[:-1]
    acc = np.uint32 if values.dtype.kind in "ub" else np.float64  # uint32: 3x faster than int64, no range > 4G
    return np.rint(np.add.reduceat(values, idx, dtype=acc)[0::2]).astype(np.int64)


def read_range(a: np.ndarray, lo: int, hi: int, pad: int = 0) -> np.ndarray:
    """``a[lo:hi]`` in memory, followed by ``pad`` zeros. A memory map is read with one
    read call: on virtual machines a page fault per 4 KB costs more than the bytes."""
    out = np.zeros(hi - lo + pad, dtype=a.dtype)
    if isinstance(a, np.memmap) and a.filename and hi > lo:
        with open(a.filename, "rb") as f:
            f.seek(a.offset + lo * a.dtype.itemsize)
            f.readinto(memoryview(out[:hi - lo]).cast("B"))
    else:
        out[:hi - lo] = a[lo:hi]
    return out


class OnesBefore:
    """Non-zero values of ``a[lo:hi]`` before any positions ``x`` (``0 <= x <= hi - lo``),
    after one read of that slice. A uint8 mask: a running popcount of its bytes read as
    little-endian 8-byte words, and the bytes of ``x``'s own word below it (5x faster
    than a reduceat); any other (float32, or numpy before 2.0): a running sum."""

    def __init__(self, a: np.ndarray, lo: int = 0, hi: int | None = None):
        hi = a.shape[0] if hi is None else hi
        if a.dtype == np.uint8 and hasattr(np, "bitwise_count"):
            self.words = read_range(a, lo, hi, pad=16 - (hi - lo) % 8).view("<u8")
            self.cum = np.concatenate([[0], np.cumsum(np.bitwise_count(self.words), dtype=np.int64)])
        else:
            self.words = None
            self.cum = np.concatenate([[0], np.cumsum(read_range(a, lo, hi) != 0, dtype=np.int64)])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.words is None:
            return self.cum[x]
        q, r = x >> 3, (x & 7).astype(np.uint64)
        low = (np.uint64(1) << (r * np.uint64(8))) - np.uint64(1)  # the bytes of x's word before x
        return self.cum[q] + np.bitwise_count(self.words[q] & low)


def trained_per_episode(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray, keep: int | None = None,
                        chunk: int = CHUNK_TOKENS) -> tuple[np.ndarray, np.ndarray | None]:
    """Trained tokens of each episode (sorted, non-empty ranges ``[starts, ends)`` of
    ``mask``), and with ``keep`` those past an episode's first ``keep`` tokens; reads the
    mask once, about ``chunk`` values at a time. A uint8 mask is counted by ``OnesBefore``
    (popcount), any other by ``range_sums``::

        mask:      0 0 1 1 0 | 1 1 1 0 | 0 0
        episodes:  [0, 5)      [5, 9)    [9, 11)
        trained:   2           3         0
    """
    n = len(starts)
    trained = np.zeros(n, np.int64)
    late = None if keep is None else np.zeros(n, np.int64)
    fast = mask.dtype == np.uint8 and hasattr(np, "bitwise_count")  # numpy >= 2.0
    for i, j in whole_runs(ends, chunk, starts):
        lo, hi = int(starts[i]), int(ends[j - 1])
        s, e = starts[i:j] - lo, ends[i:j] - lo
        long_ = None if keep is None else np.flatnonzero(e - s > keep)
        if fast:
            before = OnesBefore(mask, lo, hi)
            at_e = before(e)
            trained[i:j] = at_e - before(s)
            if long_ is not None:
                late[i + long_] = at_e[long_] - before(s[long_] + keep)
        else:
            buf = read_range(mask, lo, hi)
            trained[i:j] = range_sums(buf, s, e)
            if long_ is not None:
                late[i + long_] = range_sums(buf, s[long_] + keep, e[long_])
    return trained, late
