"""The exact seeded split, and the rows of any kind through the store's writers and shards.

Exactly ``round(val_split * n)`` of the ``n`` rows go to val (half up), chosen by
``RandomState(seed).permutation(n)``: the same for any number of workers or engine. A
row is ``ENTRIES_PER_ROW[kind]`` sequences (an episode: one; a pair: prompt, chosen,
rejected), with its record, and its kind's extras: an episode's "last reply only" flag, a
KTO row's label, an RL prompt's columns. The staging shard (and an engine's parts) are
copied into the splits' writers a window of about ``COPY_TOKENS`` tokens at a time
(``copy_rows``), so memory stays bounded by that window.
"""

from __future__ import annotations

import math
import shutil
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from ..store.format import ENTRIES_PER_ROW, KIND_PROMPTS, PARTS_DIR, STAGING_SPLIT
from ..store.rows import Rows, shard_columns, shard_media
from ..store.shard import Shard
from ..store.split_writer import RowSplitWriter, SplitWriter
from .results import StagedPart

COPY_TOKENS = 1 << 20  # tokens read at once when copying a staged shard (bounds memory)


def split_assignment(n: int, val_split: float, seed: int) -> np.ndarray:
    """Boolean array: True where row ``i`` (input order) goes to val.

    Exactly ``floor(val_split * n + 0.5)`` rows, chosen by
    ``RandomState(seed).permutation(n)``.
    """
    k = int(math.floor(val_split * n + 0.5))
    is_val = np.zeros(n, dtype=bool)
    if k:
        is_val[np.random.RandomState(seed).permutation(n)[:k]] = True
    return is_val


def open_split(root: Path, kind: str, split: str, dtype: np.dtype, shard_tokens: int,
               media: bool = False) -> SplitWriter | RowSplitWriter:
    """The store's writer of ``split`` for rows of ``kind`` (episodes, or a row kind);
    ``media``: episodes of a vision model's dataset, every shard with its media table."""
    if kind in ENTRIES_PER_ROW:
        return RowSplitWriter(root, split, kind, dtype, shard_tokens)
    return SplitWriter(root, split, dtype, shard_tokens, media)


def add_rows(writer: SplitWriter | RowSplitWriter, rows: Rows) -> None:
    """``rows`` appended to ``writer`` (``open_split``'s)."""
    if isinstance(writer, RowSplitWriter):
        writer.add_rows(rows.ids, rows.mask, rows.lengths, rows.sources, labels=rows.labels, columns=rows.columns)
    else:
        writer.add_many(rows.ids, rows.mask, rows.lengths, rows.sources, rows.flags, rows.media)


def copy_rows(src: Shard, kind: str, first: int, stop: int, route: np.ndarray | None, writers: list,
              record_offset: int = 0) -> None:
    """Rows ``[first, stop)`` of the staged shard ``src`` (of ``kind``) appended to
    ``writers[route[i]]`` (-1: left out; None: all to ``writers[0]``), each writer's in
    input order, about ``COPY_TOKENS`` tokens at a time; their records shifted by
    ``record_offset``."""
    per = ENTRIES_PER_ROW.get(kind, 1)
    lengths = src.index[first * per:stop * per, 1].astype(np.int64)
    row_ends = np.cumsum(lengths.reshape(-1, per).sum(axis=1))
    origin = int(src.index[first * per, 0]) if stop > first else 0
    media = shard_media(src.path, first, stop) if per == 1 and kind not in ENTRIES_PER_ROW else None
    with shard_columns(src.path) if kind == KIND_PROMPTS else nullcontext() as columns:
        for _ in range(first if columns is not None else 0):
            next(columns)
        i, n = 0, stop - first
        while i < n:
            base = int(row_ends[i - 1]) if i else 0
            j = min(n, max(i + 1, int(np.searchsorted(row_ends, base + COPY_TOKENS, side="right"))))
            toks, mask = src.read_range(origin + base, origin + int(row_ends[j - 1]))
            a, b = first + i, first + j
            rows = Rows(toks, mask, lengths[i * per:j * per], src.sources[a:b].astype(np.int64) + record_offset,
                        per, flags=src.last_only(a, b) if per == 1 and kind not in ENTRIES_PER_ROW else None,
                        labels=None if src.labels is None else np.asarray(src.labels[a:b]),
                        columns=None if columns is None else [next(columns) for _ in range(j - i)],
                        media=None if media is None else media[i:j])
            to = np.zeros(j - i, np.int64) if route is None else route[i:j]
            for k, w in enumerate(writers):
                sel = to == k
                if w is not None and sel.any():
                    add_rows(w, rows if sel.all() else rows.only(sel))
            i = j


def split_staged(root: Path, kind: str, staged: dict | None, parts: list[StagedPart], is_val: np.ndarray,
                 dtype: np.dtype, val: bool, shard_tokens: int, media: bool = False) -> dict:
    """The staging shard (``staged``: its split's metadata, None: nothing staged), then the
    engine's parts, into train and (``val``) val in input order; returns each split's
    metadata and removes what was staged."""
    pieces = [(root / STAGING_SPLIT / staged["shards"][0]["name"], 0)] if staged else []
    pieces += [(Path(p.path), p.record_offset) for p in parts]
    writers = [open_split(root, kind, "train", dtype, shard_tokens, media),
               open_split(root, kind, "val", dtype, shard_tokens, media) if val else None]
    first = 0
    for path, offset in pieces:  # in input order
        src = Shard(path, dtype, entries=ENTRIES_PER_ROW.get(kind, 1))
        n = src.num_items // ENTRIES_PER_ROW.get(kind, 1)
        copy_rows(src, kind, 0, n, is_val[first:first + n].astype(np.int64), writers, offset)
        first += n
        del src
    splits_meta = {name: wr.close() for name, wr in zip(("train", "val"), writers) if wr is not None}
    shutil.rmtree(root / STAGING_SPLIT, ignore_errors=True)
    shutil.rmtree(root / PARTS_DIR, ignore_errors=True)
    return splits_meta
