"""The exact seeded split: the accepted episodes into train and val, each in input order.

Exactly ``round(val_split * n)`` of the ``n`` episodes go to val (half up), chosen by
``RandomState(seed).permutation(n)``: the same for any number of workers or engine.
The staging shard (and an engine's parts) are copied into the splits' writers a window
of about ``COPY_TOKENS`` tokens at a time, so memory stays bounded by that window.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from ..store.format import PARTS_DIR, STAGING_SPLIT
from ..store.shard import Shard
from ..store.split_writer import SplitWriter
from ..store.writer import DatasetWriter
from .options import PrepareOptions
from .results import StagedPart

COPY_TOKENS = 1 << 20  # tokens read at once when splitting the staging shard (bounds memory)


def split_assignment(n: int, val_split: float, seed: int) -> np.ndarray:
    """Boolean array: True where episode ``i`` (input order) goes to val.

    Exactly ``floor(val_split * n + 0.5)`` episodes, chosen by
    ``RandomState(seed).permutation(n)``.
    """
    k = int(math.floor(val_split * n + 0.5))
    is_val = np.zeros(n, dtype=bool)
    if k:
        is_val[np.random.RandomState(seed).permutation(n)[:k]] = True
    return is_val


def _split_staging(src: Shard, is_val: np.ndarray, writers: dict[bool, SplitWriter], record_offset: int = 0) -> None:
    """Stream the staging shard into train/val writers in windows of about COPY_TOKENS
    tokens, keeping input order within each split (boolean selection, no index arrays)."""
    lengths = src.episodes[:, 1].astype(np.int64)
    ends = np.cumsum(lengths)
    n = len(lengths)
    i = 0
    while i < n:
        base = int(ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(ends, base + COPY_TOKENS, side="right")))
        j = min(j, n)
        stop = int(ends[j - 1])
        toks, mask = src.read_range(base, stop)
        lens, srcs, val = lengths[i:j], src.sources[i:j].astype(np.int64) + record_offset, is_val[i:j]
        flags = src.last_only(i, j)
        tok_val = np.repeat(val, lens)
        for flag, w in writers.items():
            if w is None:
                continue
            sel = val if flag else ~val
            if sel.any():
                tsel = tok_val if flag else ~tok_val
                w.add_many(toks[tsel], mask[tsel], lens[sel], srcs[sel], flags[sel])
        i = j


def split_parts(w: DatasetWriter, staged: dict, parts: list[StagedPart], is_val: np.ndarray, dtype: np.dtype,
                 opts: PrepareOptions) -> dict:
    """The staging shard (``staged``: its metadata), then the engine's parts, into train and
    val in input order; returns each split's metadata and removes what was staged."""
    pieces = [(w.path / STAGING_SPLIT / "shard_00000", 0)] if staged["episodes"] else []
    pieces += [(Path(p.path), p.record_offset) for p in parts]
    writers = {False: w.split("train", dtype, opts.shard_tokens),
               True: w.split("val", dtype, opts.shard_tokens) if opts.val_split > 0 else None}
    first = 0
    for path, offset in pieces:  # in input order
        src = Shard(path, dtype)
        _split_staging(src, is_val[first:first + src.num_episodes], writers, offset)
        first += src.num_episodes
        del src
    splits_meta = {name: wr.close() for name, wr in (("train", writers[False]), ("val", writers[True]))
                   if wr is not None}
    shutil.rmtree(w.path / STAGING_SPLIT)
    shutil.rmtree(w.path / PARTS_DIR, ignore_errors=True)
    return splits_meta
