"""One packed shard from pieces of it written apart (``pack --engine ray``'s tasks over
part of a shard): the pieces' files concatenated, their row numbers rebased, so that the
shard's bytes, sha256 and record are those ``PackedSplitWriter`` writes for the same rows
at once.

A packed shard's files are per row, in row order: ``tokens.bin`` and ``mask.bin`` (the
rows), ``episodes.idx`` (each row's start token in the shard and its length) and
``segments.idx`` (each segment's row in the shard first, then fields that do not depend
on where the row is). A piece is a one-shard split of consecutive rows, numbered from 0;
only the two row-relative columns change when it is placed after the rows before it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .format import (
    EPISODES_FILE,
    IDX_DTYPE,
    LAST_REPLY_DTYPE,
    LAST_REPLY_FILE,
    LAST_REPLY_KEY,
    MASK_FILE,
    SEGMENT_FIELDS,
    SEGMENTS_FILE,
    TOKENS_FILE,
)

COPY_BYTES = 16 << 20  # what is copied at once


class _Out:
    """A new file written in order, with its size and sha256."""

    def __init__(self, path: Path):
        self.f = open(path, "xb")
        self.h = hashlib.sha256()
        self.bytes = 0

    def write(self, data) -> None:
        data = memoryview(data).cast("B")
        self.f.write(data)
        self.h.update(data)
        self.bytes += len(data)

    def close(self) -> dict:
        self.f.close()
        return {"bytes": self.bytes, "sha256": self.h.hexdigest()}


def _copy(src: Path, out: _Out) -> None:
    with open(src, "rb") as f:
        while block := f.read(COPY_BYTES):
            out.write(block)


def merge_packed_pieces(pieces: list[tuple[Path, dict]], row_len: int, dest: Path, name: str) -> dict:
    """Write shard folder ``dest`` from ``pieces`` (each: a piece's shard folder and its
    record, as ``PackedSplitWriter`` gives it), in row order; returns the shard's record
    (named ``name``), equal to the one writing the rows at once gives."""
    dest.mkdir()
    out = {fn: _Out(dest / fn) for fn in (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SEGMENTS_FILE)}
    rows = 0
    flags = []  # each piece's segments' "last reply only" flags (a piece without the file: none)
    for folder, rec in pieces:
        _copy(folder / TOKENS_FILE, out[TOKENS_FILE])
        _copy(folder / MASK_FILE, out[MASK_FILE])
        idx = np.fromfile(folder / EPISODES_FILE, dtype=IDX_DTYPE).reshape(-1, 2)
        idx[:, 0] += np.uint64(rows * row_len)
        out[EPISODES_FILE].write(np.ascontiguousarray(idx))
        seg = np.fromfile(folder / SEGMENTS_FILE, dtype=IDX_DTYPE).reshape(-1, len(SEGMENT_FIELDS))
        seg[:, SEGMENT_FIELDS.index("row")] += np.uint64(rows)
        out[SEGMENTS_FILE].write(np.ascontiguousarray(seg))
        flags.append(np.fromfile(folder / LAST_REPLY_FILE, dtype=LAST_REPLY_DTYPE)
                     if LAST_REPLY_FILE in rec["files"] else np.zeros(seg.shape[0], LAST_REPLY_DTYPE))
        rows += int(rec["rows"])
    record = {"name": name, **{k: sum(int(r[k]) for _, r in pieces)
                               for k in ("rows", "segments", "tokens", "trained_tokens")},
              "files": {fn: f.close() for fn, f in out.items()}}
    flagged = sum(int(r.get(LAST_REPLY_KEY, 0)) for _, r in pieces)
    if flagged:  # as PackedSplitWriter writes it: the file and the count only where a segment is flagged
        f = _Out(dest / LAST_REPLY_FILE)
        f.write(np.ascontiguousarray(np.concatenate(flags)))
        record["files"][LAST_REPLY_FILE] = f.close()
        record[LAST_REPLY_KEY] = flagged
    for key in ("token_id_range", "mask_value_range"):
        ranges = [r[key] for _, r in pieces if key in r]
        if ranges:
            record[key] = [min(lo for lo, _ in ranges), max(hi for _, hi in ranges)]
    return record
