"""The coordinator's plan: which staged episodes each final shard holds, from the
partitions' episode counts and lengths alone (8 bytes an episode; no token is read).

::

    staged parts (input order)   part 0: 5 episodes      part 1: 4 episodes (record 7 dropped: keep)
    kept episodes, numbered      0 1 2 3 4               5 6 - 7
    the exact split (is_val)     . v . . .               . v   .        (split.split_assignment)
    train, its shards by the     [0 2 3][4 5] [7]  <- store.split_writer.shard_starts: the writer's rule
    writer's rolling rule
    a shard's job                shard 1 of train: part 0 episodes [4, 5), part 1 episodes [0, 1)

Each ``ShardJob`` names the staged episodes of one final shard as ``Piece``s (a range of
a part's episodes, with the ones to take where not all are), so a worker writes exactly
the shard the single-process run writes at that place (``shard_task.write_shard``).
Pure functions of numpy arrays: the same plan for any number of workers or engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..store.split_writer import shard_starts
from .results import StagedPart


@dataclass(frozen=True)
class Piece:
    """Episodes ``[first, stop)`` of the staged shard at ``path``, those where ``take`` is
    True (None: every one); their record numbers are ``record_offset`` + the staged ones."""

    path: str
    first: int
    stop: int
    take: np.ndarray | None
    record_offset: int


@dataclass(frozen=True)
class ShardJob:
    """Final shard ``index`` of ``split``: its episodes are the pieces', in order (none: an
    empty shard, as an empty split's writer leaves)."""

    split: str
    index: int
    pieces: tuple[Piece, ...]
    tokens: int  # the shard's tokens (the plan's figure; the task writes exactly these)


def kept_lengths(parts: list[StagedPart]) -> np.ndarray:
    """The lengths of the episodes the run keeps, in input order (what the split draws from)."""
    if not parts:
        return np.empty(0, np.int64)
    return np.concatenate([p.lengths if p.keep is None else p.lengths[p.keep] for p in parts]).astype(np.int64,
                                                                                                    copy=False)


def plan_shards(parts: list[StagedPart], is_val: np.ndarray, shard_tokens: int, splits: tuple[str, ...]
                ) -> list[ShardJob]:
    """Every final shard of ``splits`` ("train", and "val" when the run has one): the kept
    episodes (``StagedPart.keep``) in input order, to val where ``is_val``, each split cut
    into shards of ``shard_tokens`` by the writer's rule."""
    lengths = kept_lengths(parts)
    counts = [p.kept for p in parts]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # kept episodes before each part
    local = [None if p.keep is None else np.flatnonzero(p.keep) for p in parts]  # kept -> staged index
    jobs: list[ShardJob] = []
    for split in splits:
        chosen = is_val if split == "val" else ~is_val
        pos = np.flatnonzero(chosen)  # the split's episodes, as kept indices in input order
        starts = shard_starts(lengths[pos], shard_tokens)
        if starts.size == 0:
            jobs.append(ShardJob(split, 0, (), 0))
            continue
        bounds = np.concatenate([starts, [pos.shape[0]]])
        for k in range(starts.shape[0]):
            a, b = int(bounds[k]), int(bounds[k + 1])
            g0, g1 = int(pos[a]), int(pos[b - 1]) + 1  # the kept indices the shard spans
            pieces = []
            for p in range(int(np.searchsorted(offsets, g0, side="right")) - 1, len(parts)):
                lo, hi = max(g0, int(offsets[p])), min(g1, int(offsets[p + 1]))
                if lo >= g1:
                    break
                if lo >= hi:
                    continue
                a0, a1 = lo - int(offsets[p]), hi - int(offsets[p])
                loc = np.arange(a0, a1) if local[p] is None else local[p][a0:a1]
                first, stop = int(loc[0]), int(loc[-1]) + 1
                mine = chosen[lo:hi]
                if loc.shape[0] == stop - first and mine.all():
                    take = None
                else:
                    take = np.zeros(stop - first, dtype=bool)
                    take[loc[mine] - first] = True
                pieces.append(Piece(parts[p].path, first, stop, take, parts[p].record_offset))
            jobs.append(ShardJob(split, k, tuple(pieces), int(lengths[pos[a:b]].sum())))
    return jobs
