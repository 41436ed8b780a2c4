"""One pass over a split's mask (and tokens) for the report's per-episode figures.

Reads each shard in chunks of whole episodes (``ranges.whole_runs``), so memory stays
at a few tens of MB whatever the dataset's size. Per chunk, the trained tokens before
any position (episode starts and ends, and ``start + keep`` of the episodes longer than
``keep``) come from a running popcount over the mask's bytes read as 8-byte words, the
way ``ranges.trained_per_episode`` counts::

    mask:          0 0 1 1 0 | 1 1 1 0          episodes [0, 5) and [5, 9); keep = 2
    ones before:   at 0: 0, at 2: 0, at 5: 2, at 7: 4, at 9: 5
    trained:       2 - 0 = 2, 5 - 2 = 3;   past keep: 2 - 0 = 2, 5 - 4 = 1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ranges import CHUNK_TOKENS, read_range, whole_runs
from ..store import Split
from .overview import episode_bounds


@dataclass
class SplitScan:
    trained: np.ndarray | None  # trained tokens per episode (None without mask.bin)
    trained_past: list[int] | None  # per keep: trained tokens past each episode's first ``keep``
    turns: np.ndarray | None  # per episode: how many of the ``openers`` ids it holds


class OnesBefore:
    """Non-zero values of a mask chunk before any positions ``x`` (``0 <= x <= len``).

    A uint8 mask: a running popcount of its bytes read as little-endian 8-byte words, and
    the bytes of ``x``'s own word below it; any other mask (float32, or numpy before 2.0,
    which has no popcount): a running sum."""

    def __init__(self, mask: np.ndarray):
        n = mask.shape[0]
        if mask.dtype == np.uint8 and hasattr(np, "bitwise_count"):
            buf = np.zeros(n + 16 - n % 8, np.uint8)
            buf[:n] = mask
            self.words = buf.view("<u8")
            self.cum = np.concatenate([[0], np.cumsum(np.bitwise_count(self.words), dtype=np.int64)])
        else:
            self.words = None
            self.cum = np.concatenate([[0], np.cumsum(mask != 0, dtype=np.int64)])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.words is None:
            return self.cum[x]
        q, r = x >> 3, (x & 7).astype(np.uint64)
        low = (np.uint64(1) << (r * np.uint64(8))) - np.uint64(1)  # the bytes of x's word before x
        return self.cum[q] + np.bitwise_count(self.words[q] & low)


def is_opener(tokens: np.ndarray, openers: list[int]) -> np.ndarray:
    """Bool per token: one of ``openers``. Consecutive ids (the chat markers are) take one
    unsigned subtraction, in place (``tokens`` is overwritten), and one comparison."""
    lo, hi = min(openers), max(openers)
    if hi - lo + 1 == len(set(openers)) and tokens.dtype.kind == "u":
        np.subtract(tokens, tokens.dtype.type(lo), out=tokens)  # ids below lo wrap to large values
        return tokens <= hi - lo
    return np.isin(tokens, openers)


def scan_split(sp: Split, keeps: list[int], openers: list[int] | None = None, chunk: int = CHUNK_TOKENS
               ) -> SplitScan:
    """Trained tokens per episode, trained tokens past each ``keep`` (all episodes
    together), and with ``openers`` (marker ids) the count of those ids per episode."""
    n = sp.num_items
    trained = np.zeros(n, np.int64) if sp.has_mask else None
    past = np.zeros(len(keeps), np.int64) if sp.has_mask else None
    turns = np.zeros(n, np.int64) if openers else None
    for sh, (starts, ends, first) in zip(sp.shards, episode_bounds(sp)):
        for i, j in whole_runs(ends, chunk, starts):
            lo, hi = int(starts[i]), int(ends[j - 1])
            s, e = starts[i:j] - lo, ends[i:j] - lo
            if trained is not None:
                before = OnesBefore(read_range(sh.mask, lo, hi))
                at_e = before(e)
                trained[first + i:first + j] = at_e - before(s)
                for k, keep in enumerate(keeps):
                    long_ = np.flatnonzero(e - s > keep)
                    past[k] += int((at_e[long_] - before(s[long_] + keep)).sum())
            if turns is not None:
                pos = np.flatnonzero(is_opener(read_range(sh.tokens, lo, hi), openers))
                turns[first + i:first + j] = np.searchsorted(pos, e) - np.searchsorted(pos, s)
    return SplitScan(trained, None if past is None else past.tolist(), turns)
