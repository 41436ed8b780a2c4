"""Sums of a (memory-mapped) array over many ranges, without reading it more than once.

Used by ``inspect`` to count the trained tokens of every episode of a 1 GB dataset in
well under a second::

    mask:      0 0 1 1 0 | 1 1 1 0 | 0 0
    episodes:  [0, 5)      [5, 9)    [9, 11)
    trained:   2           3         0
"""

from __future__ import annotations

import numpy as np

CHUNK_TOKENS = 1 << 26  # mask values read at once


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


def _ones_before(words: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Ones in ``mask[:x]`` for each ``x``, the 0/1 mask bytes seen as little-endian
    uint64 words (8 mask values per word) with ``cum`` their running popcount."""
    q, r = x >> 3, (x & 7).astype(np.uint64)
    low = (np.uint64(1) << (r * np.uint64(8))) - np.uint64(1)  # the bytes of the word before x
    return cum[q] + np.bitwise_count(words[q] & low)


def trained_per_episode(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray, keep: int | None = None,
                        chunk: int = CHUNK_TOKENS) -> tuple[np.ndarray, np.ndarray | None]:
    """Trained tokens of each episode (sorted, non-empty ranges of ``mask``), and with
    ``keep`` those past an episode's first ``keep`` tokens; reads the mask once, about
    ``chunk`` values at a time. A uint8 mask is counted by popcount over 8-byte words
    and prefix sums (5x faster than a reduceat); any other by ``range_sums``."""
    n = len(starts)
    trained = np.zeros(n, np.int64)
    late = None if keep is None else np.zeros(n, np.int64)
    fast = mask.dtype == np.uint8 and hasattr(np, "bitwise_count")  # numpy >= 2.0
    i = 0
    while i < n:
        j = max(i + 1, int(np.searchsorted(ends, int(starts[i]) + chunk, side="right")))
        lo, hi = int(starts[i]), int(ends[j - 1])
        s, e = starts[i:j] - lo, ends[i:j] - lo
        long_ = None if keep is None else np.flatnonzero(e - s > keep)
        if fast:
            buf = read_range(mask, lo, hi, pad=16 - (hi - lo) % 8)
            words = buf.view("<u8")
            cum = np.concatenate([[0], np.cumsum(np.bitwise_count(words), dtype=np.int64)])
            at_e = _ones_before(words, cum, e)
            trained[i:j] = at_e - _ones_before(words, cum, s)
            if long_ is not None:
                late[i + long_] = at_e[long_] - _ones_before(words, cum, s[long_] + keep)
        else:
            buf = read_range(mask, lo, hi)
            trained[i:j] = range_sums(buf, s, e)
            if long_ is not None:
                late[i + long_] = range_sums(buf, s[long_] + keep, e[long_])
        i = j
    return trained, late
