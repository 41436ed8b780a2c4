"""Building the rows of a packing plan from a source split: the unit both engines run.

``build_rows`` gathers each segment's tokens from the source shards (``gather_segments``),
assembles rows and their per-segment mask (``packing.assemble_rows``, the mask rule) and
appends them to a split writer, a bounded number of tokens at a time. ``--engine local``
runs it over a whole split; ``--engine ray`` over ranges of whole output shards, one Ray
task each (``sftdata.engine.ray_engine``). Returns counts only (``RowsBuilt``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..chat.loss_rule import LossRule
from ..packing.plan import PackPlan, assemble_rows, segment_masks
from ..store.format import encode_segments
from ..store.shard import Split
from ..util.ranges import gather_ranges, range_index, whole_runs


def gather_segments(split: Split, episodes: np.ndarray, starts: np.ndarray, takes: np.ndarray) -> np.ndarray:
    """Concatenated tokens ``episode[start:start+take]`` of each segment (global episode ids)."""
    episodes = np.asarray(episodes, dtype=np.int64)
    takes = np.asarray(takes, dtype=np.int64)
    total = int(takes.sum())
    dtype = split.shards[0].tokens.dtype if split.shards else np.uint32
    out = np.empty(total, dtype=dtype)
    if total == 0:
        return out
    shard = split.shard_of(episodes)
    src = split.starts[episodes] + np.asarray(starts, dtype=np.int64)
    if len(split.shards) == 1:
        return gather_ranges(split.shards[0].tokens, src, takes)
    out_start = np.cumsum(takes) - takes
    for si in np.unique(shard).tolist():
        sel = shard == si
        out[range_index(out_start[sel], takes[sel])] = gather_ranges(split.shards[si].tokens, src[sel], takes[sel])
    return out


def trained_of_episodes(split: Split, ids: np.ndarray, m: LossRule) -> int:
    """Trained tokens of whole episodes by the rule, a bounded number of tokens at a time."""
    total = 0
    lengths = split.lengths[ids]
    for i, j in whole_runs(np.cumsum(lengths)):
        toks = gather_segments(split, ids[i:j], np.zeros(j - i, np.int64), lengths[i:j])
        flags = split.last_only_of(ids[i:j]) if split.flagged else None
        total += int(np.count_nonzero(segment_masks(toks, lengths[i:j], m, last_only=flags)))
    return total


@dataclass
class RowsBuilt:
    """What building a range of rows gives back (small: no tokens): the trained tokens in
    the rows, those of the segments of episodes placed whole, and the trained tokens (by
    the rule) of the episodes it was asked to count (``extra``)."""

    trained: int = 0
    trained_whole: int = 0
    trained_extra: int = 0


def episode_sources(split: Split, episodes: np.ndarray) -> np.ndarray | None:
    """Input record number of each of ``episodes`` (global ids), read from their shards
    only; None when a shard stores none."""
    if not split.shards or any(s.sources is None for s in split.shards):
        return None
    episodes = np.asarray(episodes, dtype=np.int64)
    shard = split.shard_of(episodes)
    out = np.empty(episodes.size, dtype=np.int64)
    for si in np.unique(shard).tolist():
        sel = shard == si
        out[sel] = np.asarray(split.shards[si].sources)[episodes[sel] - split.item_offsets[si]]
    return out


def build_rows(split: Split, plan: PackPlan, seg_whole: np.ndarray, writer, m: LossRule, pad_id: int,
               extra: np.ndarray | None = None, on_rows: Callable[[int], None] | None = None,
               stopped: Callable[[], bool] | None = None) -> RowsBuilt:
    """Build every row of ``plan`` (rows 0 .. num_rows-1, segments of ``split``'s
    episodes) and append them to ``writer``, a bounded number of tokens at a time.
    ``seg_whole``: per segment, its episode is placed whole (its trained tokens then count
    for the episode too); ``extra``: episodes whose trained tokens (by the rule) to count
    as well. The one function both engines run: this process over a whole split, a Ray
    task over a range of whole shards of it. ``on_rows(r1)`` after rows up to ``r1``;
    ``stopped()`` True ends the work early (the run stopped)."""
    L = plan.row_len
    out = RowsBuilt()
    flagged = split.flagged  # episodes flagged "last reply only": each segment carries its episode's flag
    for r0, r1 in whole_runs(np.arange(1, plan.num_rows + 1, dtype=np.int64) * L):  # rows end every L tokens
        if stopped is not None and stopped():
            return out
        a, b = plan.segments.row_range(r0, r1)
        s = plan.segments[a:b]
        toks = gather_segments(split, s.episode, s.episode_start, s.take)
        flags = split.last_only_of(s.episode) if flagged else None
        rows = assemble_rows(plan, r0, r1, toks, m, pad_id, dtype=writer.token_dtype, last_only=flags)
        sources = episode_sources(split, s.episode)
        seg = replace(rows.segments, source=sources if sources is not None else s.source)
        writer.add_rows(rows.tokens, rows.mask, encode_segments(seg), last_only=flags)
        if b > a:
            trained = np.add.reduceat(rows.mask.reshape(-1).astype(np.int64), seg.flat_start(L))
            out.trained += int(trained.sum())
            out.trained_whole += int(trained[seg_whole[a:b]].sum())
        if on_rows:
            on_rows(r1)
    if extra is not None and extra.size:
        out.trained_extra = trained_of_episodes(split, extra, m)
    return out
