"""The staged rows (one shard, input order) into train and val by prepare's exact seeded
split (``prepare.split.split_assignment``), a window of about ``COPY_TOKENS`` tokens at
a time, so memory stays bounded by that window: the row kinds' counterpart of
``prepare.split``'s episode copy."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import numpy as np

from ..prepare.split import COPY_TOKENS
from ..store.format import (
    COLUMNS_FILE,
    ENTRIES_PER_ROW,
    EPISODES_FILE,
    IDX_DTYPE,
    KIND_KTO,
    KIND_PROMPTS,
    LABEL_DTYPE,
    LABELS_FILE,
    MASK_DTYPE,
    MASK_FILE,
    SOURCES_FILE,
    TOKENS_FILE,
)
from ..store.split_writer import RowSplitWriter

COLUMNS_KEY = b'"columns": '  # where a columns.jsonl line's body begins (after "row" and "record", two integers)


def _columns_body(line: bytes) -> bytes:
    """The JSON object of ``columns`` in one line ``RowSplitWriter`` wrote."""
    return line[line.index(COLUMNS_KEY) + len(COLUMNS_KEY):line.rindex(b"}")]


def split_rows(shard: Path, kind: str, dtype: np.dtype, is_val: np.ndarray,
               writers: dict[bool, RowSplitWriter | None]) -> None:
    """Copy the rows of the staged ``shard`` (``kind``, written by one ``RowSplitWriter``)
    into ``writers[is_val[row]]``, each split in input order."""
    per = ENTRIES_PER_ROW[kind]
    tokens = np.memmap(shard / TOKENS_FILE, dtype=dtype, mode="r")
    mask = np.memmap(shard / MASK_FILE, dtype=MASK_DTYPE, mode="r")
    lengths = np.memmap(shard / EPISODES_FILE, dtype=IDX_DTYPE, mode="r").reshape(-1, 2)[:, 1]
    sources = np.memmap(shard / SOURCES_FILE, dtype=IDX_DTYPE, mode="r")
    labels = np.memmap(shard / LABELS_FILE, dtype=LABEL_DTYPE, mode="r") if kind == KIND_KTO else None
    n = sources.shape[0]
    row_ends = np.cumsum(np.asarray(lengths, dtype=np.int64).reshape(n, per).sum(axis=1))
    with open(shard / COLUMNS_FILE, "rb") if kind == KIND_PROMPTS else nullcontext() as cols:
        i = 0
        while i < n:
            base = int(row_ends[i - 1]) if i else 0
            j = min(n, max(i + 1, int(np.searchsorted(row_ends, base + COPY_TOKENS, side="right"))))
            stop = int(row_ends[j - 1])
            toks, msk = np.asarray(tokens[base:stop]), np.asarray(mask[base:stop])
            lens = np.asarray(lengths[i * per:j * per], dtype=np.int64)
            row_len = lens.reshape(j - i, per).sum(axis=1)
            val = is_val[i:j]
            bodies = [_columns_body(cols.readline()) for _ in range(j - i)] if cols is not None else None
            for flag, w in writers.items():
                sel = val if flag else ~val
                if w is None or not sel.any():
                    continue
                tsel = np.repeat(sel, row_len)
                w.add_rows(toks[tsel], msk[tsel], lens[np.repeat(sel, per)], np.asarray(sources[i:j])[sel],
                           labels=None if labels is None else np.asarray(labels[i:j])[sel],
                           columns=None if bodies is None else [b for b, s in zip(bodies, sel.tolist()) if s])
            i = j
