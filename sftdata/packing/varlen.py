"""Kernel-ready packed batches: ``cu_seqlens`` for varlen attention, and each sequence
padded to a multiple of N (context parallelism splits every sequence into 2 x CP chunks,
so its length must divide). Pure numpy over the segments of a batch's rows.

A batch's ``x`` is ``(B, T)``; segment ``j`` of a row covers ``x`` positions
``[offset, offset + xlen)`` (``xlen = min(length, T - offset)``: the row's last token is
only a target). The batch is seen flattened to ``B * W`` tokens, one sequence per
segment::

    T = 8, N = 4, two rows:    row 0: a a a b b . . .     (segments of 3 and 2 tokens)
                               row 1: c c c c c c . .     (one of 6)
    relaid (W = 16):           row 0: a a a _ b b _ _ _ _ _ _ _ _ _ _
                               row 1: c c c c c c _ _ _ _ _ _ _ _ _ _
    cu_seqlens        (real tokens, unpadded):   [0, 3, 5, 11]
    cu_seqlens_padded (offsets in the B*W view): [0, 4, 16, 32]   each a multiple of N
    max_seqlen = 16 (the longest padded sequence: an upper bound of every real one)

* ``cu_seqlens``: the real tokens of every sequence, laid end to end (the input of
  ``flash_attn_varlen_func`` after gathering the real tokens, ``seq_ids >= 0``);
* ``cu_seqlens_padded``: where each sequence starts in the flattened ``(B * W)`` batch,
  its padding included; the last sequence of a row also takes the row's tail, so the
  padded lengths tile the batch (``cu_seqlens_padded[-1] == B * W``: Transformer
  Engine's ``cu_seqlens_q_padded``). Causal attention over a padded sequence gives its
  real tokens exactly the unpadded result (padding comes after them);
* a row with no segment (a padding row) is one sequence of 0 real tokens and W padded.

``W = T`` when ``N == 1`` (nothing moves); else the smallest multiple of N that holds
``T + (N - 1) * max_segments`` (fixed for a split: ``max_segments`` is the most
segments any row of it holds; 2 above, so W = 16), so every batch has the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..util.ranges import range_index


def varlen_width(T: int, multiple: int, max_segments: int) -> int:
    """The row width of a batch padded to ``multiple``: T itself for 1."""
    if multiple <= 1:
        return int(T)
    need = int(T) + (int(multiple) - 1) * max(int(max_segments), 1)
    return -(-need // int(multiple)) * int(multiple)


@dataclass(frozen=True)
class VarlenLayout:
    """Where the tokens of a batch go, and its cumulative sequence lengths."""

    width: int  # W
    src: np.ndarray  # (k,) flat position in the (B, T) batch of every real token moved
    dst: np.ndarray  # (k,) its flat position in the (B, W) batch
    cu_seqlens: np.ndarray  # int32
    cu_seqlens_padded: np.ndarray  # int32
    max_seqlen: int


def varlen_layout(seg_batch_row: np.ndarray, offset: np.ndarray, length: np.ndarray, num_rows: int, T: int,
                  multiple: int = 1, width: int | None = None) -> VarlenLayout:
    """The layout of a batch of ``num_rows`` rows (``x`` width ``T``) whose segments are
    given by batch row (sorted by row, then offset), offset and token length."""
    multiple = max(int(multiple), 1)
    W = int(T) if width is None else int(width)
    row = np.asarray(seg_batch_row, dtype=np.int64)
    off = np.asarray(offset, dtype=np.int64)
    xlen = np.minimum(np.asarray(length, dtype=np.int64), T - off)
    keep = xlen > 0  # a one-token segment at the row's last position is only a target
    row, off, xlen = row[keep], off[keep], xlen[keep]
    padded = -(-xlen // multiple) * multiple
    first = np.ones(row.size, dtype=bool)
    first[1:] = row[1:] != row[:-1]
    csum = np.cumsum(padded)
    row_base = np.repeat(csum[first] - padded[first], np.diff(np.r_[np.flatnonzero(first), row.size]))
    new_off = csum - padded - row_base  # exclusive cumsum of padded lengths within the row
    if row.size and int((new_off + padded).max()) > W:
        raise ValueError(f"the padded segments need {int((new_off + padded).max())} positions, the width is {W}")
    src = range_index(row * T + off, xlen)
    dst = range_index(row * W + new_off, xlen)
    last = np.ones(row.size, dtype=bool)
    last[:-1] = row[1:] != row[:-1]
    padded = np.where(last, W - new_off, padded)  # the row's tail goes to its last sequence
    # a row without any segment: one sequence of 0 real tokens, W padded
    empty = np.setdiff1d(np.arange(num_rows, dtype=np.int64), row)
    all_rows = np.concatenate([row, empty])
    order = np.argsort(all_rows, kind="stable")
    real = np.concatenate([xlen, np.zeros(empty.size, np.int64)])[order]
    pad_len = np.concatenate([padded, np.full(empty.size, W, np.int64)])[order]
    cu = np.concatenate([[0], np.cumsum(real)]).astype(np.int32)
    cu_p = np.concatenate([[0], np.cumsum(pad_len)]).astype(np.int32)
    return VarlenLayout(W, src, dst, cu, cu_p, int(pad_len.max()) if pad_len.size else 0)
