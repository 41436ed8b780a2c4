"""The content checks of ``verify`` for packed datasets (``kind: "packed"``, docs/PACKING.md).

A packed shard holds rows of ``row_len`` tokens, ``episodes.idx`` with one
``(r * row_len, row_len)`` record per row, and ``segments.idx`` (``SEGMENT_FIELDS``):
each row is a run of segments from offset 0, then padding::

    row (row_len 12):  S  u  E  A  a  E  EOS | U  v  E  EOS | pad
    segment:           0 (offset 0, length 7) | 1 (7, 4)    | -
    position_ids:      0  1  2  3  4  5  6   | 0  1  2  3   | 0

The row geometry and the segments are the reader's structural checks (rows,
segments); here, a chunk of rows at a time:

* vocab, mask_values: ids below the vocabulary size, mask values 0/1;
* mask_rule: the stored mask equals ``packing.row_mask``, the mask pack writes: per
  segment, 0 on its injected prefix and its first token, then the dataset's mask rule
  over its episode tokens alone (a segment that begins inside its episode is cut: a
  template's rule leaves its first reply untrained); 0 on padding;
* padding: the tail of every row after its last segment is ``packing.pad_token_id``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..packing import row_mask
from ..store import MASK_FILE, REPACK, TOKENS_FILE, Problem, Shard
from ..store.format import decode_segments, more_like_it
from ..store.structure import readable_rows
from .content import CHUNK_TOKENS
from .description import Vocab
from .stops import StopFindings


def check_packed_content(shard: Shard, vocab: Vocab | None, pad_id: int | None, row_len: int, segments_ok: bool,
                         tick: Callable[[int], None] = lambda n: None,
                         stops: StopFindings | None = None) -> list[Problem]:
    """Token ids, mask values, the per-segment mask rule and the padding, a chunk of rows
    at a time. The mask rule and the padding need sound segments (``segments_ok``: the
    reader's segments check passed on this shard)."""
    rows = readable_rows(shard, row_len)
    if shard.tokens is None or rows == 0:
        return []
    seg = decode_segments(shard.segments) if segments_ok else None
    mask, L = shard.mask, row_len
    binary = mask is None or mask.dtype == np.uint8
    first: dict[str, tuple] = {}
    counts = {"vocab": 0, "mask_values": 0, "mask_rule": 0, "padding": 0}
    step = max(1, CHUNK_TOKENS // L)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        ids = np.asarray(shard.tokens[r0 * L:r1 * L])
        m = None if mask is None else np.asarray(mask[r0 * L:r1 * L])
        if vocab is not None and int(ids.max()) >= vocab.size:
            bad = np.flatnonzero(ids >= vocab.size)
            counts["vocab"] += int(np.unique(bad // L).size)
            first.setdefault("vocab", (r0 + int(bad[0]) // L, int(bad[0]) % L, int(ids[bad[0]])))
        badv = False
        if m is not None:
            badv = bool(m.max() > 1) if binary else bool(np.any((m != 0) & (m != 1)))
            if badv:
                bad = np.flatnonzero(m > 1) if binary else np.flatnonzero((m != 0) & (m != 1))
                counts["mask_values"] += int(np.unique(bad // L).size)
                first.setdefault("mask_values", (r0 + int(bad[0]) // L, int(bad[0]) % L, m[bad[0]]))
        if seg is not None:
            s = seg[slice(*seg.row_range(r0, r1))]
            s = replace(s, row=s.row - r0)  # rows of this chunk
            ends = np.zeros(r1 - r0, np.int64)
            np.maximum.at(ends, s.row, s.offset + s.length)
            pad = np.arange(L)[None, :] >= ends[:, None]
            if pad_id is not None:
                badp = np.flatnonzero(pad.reshape(-1) & (ids != pad_id))
                if badp.size:
                    counts["padding"] += int(np.unique(badp // L).size)
                    p = int(badp[0])
                    first.setdefault("padding", (r0 + p // L, p % L, int(ids[p]), int(ends[p // L])))
            if m is not None and vocab is not None:
                exp = row_mask(ids, s, L, vocab.rule)
                stored = m if binary and not badv else (m != 0).astype(np.uint8)
                d = np.flatnonzero(exp != stored)
                if d.size:
                    counts["mask_rule"] += int(np.unique(d // L).size)
                    if "mask_rule" not in first:
                        r = int(d[0]) // L
                        in_row = np.flatnonzero(exp[r * L:(r + 1) * L] != stored[r * L:(r + 1) * L])
                        first["mask_rule"] = (r0 + r, in_row, ids[r * L:(r + 1) * L], exp[r * L:(r + 1) * L],
                                              s[s.row == r], int(ends[r]))
        if stops is not None and m is not None:
            rows_ = np.arange(r0, r1, dtype=np.int64)
            stops.add(shard, ids, m if binary else (m != 0).astype(np.uint8),
                      np.arange(r1 - r0 + 1, dtype=np.int64) * L, rows_, rows_ * L)
        tick(int(ids.nbytes) + (0 if m is None else int(m.nbytes)))
    return _packed_problems(shard, vocab, pad_id, row_len, first, counts) + \
        ([] if stops is None else stops.shard_problems(shard))


def _packed_problems(shard: Shard, vocab, pad_id, L: int, first: dict, counts: dict) -> list[Problem]:
    out = []
    isz = shard.token_dtype.itemsize
    if "vocab" in first:
        r, p, tok = first["vocab"]
        out.append(Problem("vocab", shard.file(TOKENS_FILE), message=f"token {p} of row {shard.first_gid + r} is id "
                           f"{tok:,}, past the vocabulary ({vocab.size:,} ids){more_like_it(counts['vocab'], 'rows')}",
                           fix="the tokens were damaged: restore the shard, or " + REPACK,
                           **shard.at(r, TOKENS_FILE, (r * L + p) * isz)))
    if "mask_values" in first:
        r, p, val = first["mask_values"]
        out.append(Problem("mask_values", shard.file(MASK_FILE), message=f"token {p} of row {shard.first_gid + r} has "
                           f"mask value {val}, not 0 or 1{more_like_it(counts['mask_values'], 'rows')}",
                           fix="restore the shard, or " + REPACK,
                           **shard.at(r, MASK_FILE, (r * L + p) * shard.mask.dtype.itemsize)))
    if "padding" in first:
        r, p, tok, end = first["padding"]
        out.append(Problem("padding", shard.file(TOKENS_FILE), message=f"token {p} of row {shard.first_gid + r}, "
                           f"after its segments end at {end}, is id {tok:,}, not the padding id {pad_id}"
                           f"{more_like_it(counts['padding'], 'rows')}", fix="restore the shard, or " + REPACK,
                           **shard.at(r, TOKENS_FILE, (r * L + p) * isz)))
    if "mask_rule" in first:
        r, diff, ids, exp, segs, end = first["mask_rule"]
        p = int(diff[0])
        j = int(np.searchsorted(segs.offset, p, side="right")) - 1
        if p >= end or j < 0:
            where = "the padding"
        elif p < segs.offset[j] + segs.prefix[j]:
            where = f"segment {j}'s injected context"
        else:
            a, b = int(segs.offset[j] + segs.prefix[j]), int(segs.offset[j] + segs.length[j])
            where = f"segment {j} (episode {segs.episode[j]}), {vocab.rule.where(ids[a:b], p - a)}"
        trained = "trains" if exp[p] == 0 else "leaves untrained"
        out.append(Problem("mask_rule", shard.file(MASK_FILE), message=f"the mask of row {shard.first_gid + r} "
                           f"differs from the mask rule at {diff.size} token(s): it {trained} token {p}, in {where}"
                           f"{more_like_it(counts['mask_rule'], 'rows')}",
                           fix="this mask was not made by the mask rule per segment (or was edited); " + REPACK,
                           **shard.at(r, MASK_FILE, (r * L + p) * shard.mask.dtype.itemsize)))
    return out
