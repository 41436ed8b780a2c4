"""One pass over a split's mask (and tokens) for the report's per-episode figures.

Reads each shard in chunks of whole episodes (``ranges.whole_runs``), so memory stays
at a few tens of MB whatever the dataset's size; per chunk, prefix sums answer every
question in one vectorised step::

    mask:        0 0 1 1 0 | 1 1 1 0
    prefix sum:  0 0 0 1 2 2 | 3 4 5 5     (cs[p] = trained tokens before p)
    trained:     cs[end] - cs[start]             -> 2, 3
    past keep=2: cs[end] - cs[start + 2]         -> 1, 1 (episodes longer than keep)
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
    turns: np.ndarray | None  # per episode: opening markers (user, assistant and tool messages)


def scan_split(sp: Split, keeps: list[int], openers: list[int] | None = None, chunk: int = CHUNK_TOKENS
               ) -> SplitScan:
    """Trained tokens per episode, trained tokens past each ``keep`` (all episodes
    together), and with ``openers`` (marker ids) the count of those ids per episode."""
    n = sp.num_episodes
    trained = np.zeros(n, np.int64) if sp.has_mask else None
    past = np.zeros(len(keeps), np.int64) if sp.has_mask else None
    turns = np.zeros(n, np.int64) if openers else None
    for sh, (starts, ends, first) in zip(sp.shards, episode_bounds(sp)):
        for i, j in whole_runs(ends, chunk, starts):
            lo, hi = int(starts[i]), int(ends[j - 1])
            s, e = starts[i:j] - lo, ends[i:j] - lo
            if trained is not None:
                m = read_range(sh.mask, lo, hi)
                cs = np.zeros(hi - lo + 1, np.int64)
                np.cumsum(m != 0, out=cs[1:])
                trained[first + i:first + j] = cs[e] - cs[s]
                for k, keep in enumerate(keeps):
                    long_ = np.flatnonzero(e - s > keep)
                    past[k] += int((cs[e[long_]] - cs[s[long_] + keep]).sum())
            if turns is not None:
                pos = np.flatnonzero(np.isin(read_range(sh.tokens, lo, hi), openers))
                turns[first + i:first + j] = np.searchsorted(pos, e) - np.searchsorted(pos, s)
    return SplitScan(trained, None if past is None else past.tolist(), turns)
