"""The packed-row source (datasets of ``kind: "packed"``): fixed rows of several segments.

A stored row holds ``L = block_size + 1`` tokens; a batch row is shifted like an
episode row, and carries the per-token segment layout (docs/PACKING.md)::

    row (L = 9):        S  u  E  A  a  E  EOS | U  v
    x = row[:-1]        S  u  E  A  a  E  EOS   U
    y = row[1:]         u  E  A  a  E  EOS U    v
    mask (aligned to y) 0  0  1  1  1  0   0    0      (stored mask[1:])
    position_ids        0  1  2  3  4  5   6    0      (of x)
    seq_ids             0  0  0  0  0  0   0    1      (of x; padding -1)

Every field of the ``Batch`` is set: int64 arrays of shape ``(batch_size, block_size)``,
mask float32. Attention isolation: ``sftdata.attention.block_causal_mask(seq_ids)``.

Rows are visited once, in the epoch order of ARCHITECTURE.md §4
(``sftdata.order.row_order``, the order ``replay-order`` replays): training ends when
the loader ends, with no second epoch. With ``epoch_drop_last=false`` the last batch is
completed with padding rows (all padding, mask 0, seq_ids -1) rather than rows of a
second pass.
"""

from __future__ import annotations

import numpy as np

from ..config import LoaderConfig
from ..errors import ConfigError, DatasetError
from ..order import BatchOrder, row_order
from ..packing import PAD_SEQ_ID, row_layout, varlen_layout, varlen_width
from ..ranges import trained_per_episode
from ..store import Dataset, Segments, Split, split_segments
from .batch import Batch


def packed_batch(split: Split, seg: Segments, rows: np.ndarray, row_len: int, pad_id: int,
                 use_loss_mask: bool = True, pad_to_multiple_of: int = 1, width: int | None = None) -> Batch:
    """The numpy ``Batch`` of the given global row ids (-1 = a padding row), with its
    ``cu_seqlens``, ``cu_seqlens_padded`` and ``max_seqlen`` (``packing.varlen``).

    Without ``use_loss_mask`` every target inside a segment is trained (never one that
    crosses into the next segment or into padding). ``pad_to_multiple_of`` N > 1 moves
    each segment to start at a multiple of N in rows ``width`` wide (``varlen_width``),
    the gaps padding (pad id, mask 0, seq_id -1, position 0)."""
    rows = np.asarray(rows, dtype=np.int64)
    b, L = rows.size, int(row_len)
    toks = np.full((b, L), pad_id, dtype=np.int64)
    mask = np.zeros((b, L), dtype=np.float32)
    real = np.flatnonzero(rows >= 0)
    shard = split.shard_of(rows[real])
    for si in np.unique(shard).tolist():
        sel = real[shard == si]
        sh = split.shards[si]
        local = rows[sel] - int(split.item_offsets[si])
        toks[sel] = np.asarray(sh.tokens).reshape(-1, L)[local]
        mask[sel] = np.asarray(sh.mask).reshape(-1, L)[local]
    s = seg.of_rows(rows)  # none for a padding row
    where = np.repeat(np.arange(b), np.searchsorted(seg.row, rows, "right") - np.searchsorted(seg.row, rows, "left"))
    seq, pos = row_layout(where, s.offset, s.length, b, L)
    if not use_loss_mask:
        mask[:, 1:] = (seq[:, 1:] == seq[:, :-1]) & (seq[:, 1:] != PAD_SEQ_ID)
    T = L - 1
    lay = varlen_layout(where, s.offset, s.length, b, T, pad_to_multiple_of, width)
    x, y, m, p, q = toks[:, :-1], toks[:, 1:], mask[:, 1:], pos[:, :-1], seq[:, :-1]
    if lay.width == T:
        x, y, m, p, q = x, y.copy(), np.ascontiguousarray(m), p.copy(), q.copy()
    else:
        out = []
        for a, fill in ((x, pad_id), (y, pad_id), (m, 0), (p, 0), (q, PAD_SEQ_ID)):
            o = np.full((b, lay.width), fill, dtype=a.dtype)
            o.reshape(-1)[lay.dst] = np.ascontiguousarray(a).reshape(-1)[lay.src]
            out.append(o)
        x, y, m, p, q = out
    return Batch(x, y, m, p, q, cu_seqlens=lay.cu_seqlens, cu_seqlens_padded=lay.cu_seqlens_padded,
                 max_seqlen=lay.max_seqlen)


class PackedSource:
    """Which rows are in step N of a split (one pass), and the batch of those rows."""

    mode = "packed"
    tag = "PackedLoader"  # the log lines' prefix
    items = "rows"
    sampling = "epoch"
    end_id = None  # rows carry a mask, always

    def __init__(self, cfg: LoaderConfig, ds: Dataset, world_size: int = 1):
        if "train" not in ds.splits:
            raise DatasetError(f"{ds.root} has no train split")
        packing = ds.packing or {}
        if cfg.batch_tokens is not None:
            raise ConfigError(f"{ds.root} is packed: every row already holds block_size + 1 tokens, so a batch of "
                              f"B rows is B x block_size tokens; leave batch_tokens null and set batch_size")
        if cfg.block_size != packing.get("block_size"):
            raise ConfigError(f"{ds.root} was packed with block_size {packing.get('block_size')}, but the config "
                              f"says block_size {cfg.block_size}; set block_size {packing.get('block_size')} or "
                              f"re-pack with `sftdata pack --block-size {cfg.block_size}`")
        self.pad_id = int(packing["pad_token_id"])
        if cfg.pad_token_id is not None and cfg.pad_token_id != self.pad_id:
            raise ConfigError(f"{ds.root} was packed with pad id {self.pad_id}, but the config says pad_token_id "
                              f"{cfg.pad_token_id}; leave pad_token_id null or re-pack with --pad-id")
        self.cfg = cfg
        self.ds = ds
        self.world_size = world_size
        self.root = ds.root
        self.splits = tuple(ds.splits)
        self.tokenizer_state = ds.tokenizer_state
        self.row_len = int(packing["row_len"])
        self.strategy = packing.get("strategy")
        self._orders: dict[str, BatchOrder] = {}
        self._segments: dict[str, Segments] = {}

    def order(self, split: str) -> BatchOrder:
        o = self._orders.get(split)
        if o is None:
            o = self._orders[split] = row_order(self.cfg, self.ds.split(split).num_rows, self.world_size,
                                                what=f"split {split!r} of {self.ds.root}")
        return o

    def size(self, split: str) -> int:
        return self.ds.split(split).num_rows

    def segments(self, split: str) -> Segments:
        s = self._segments.get(split)
        if s is None:
            s = self._segments[split] = split_segments(self.ds.split(split))
        return s

    def width(self, split: str) -> int:
        """The width of this split's batches: block_size, or with ``pad_to_multiple_of`` N
        room for every segment of the fullest row padded to a multiple of N."""
        n = self.cfg.pad_to_multiple_of or 1
        if n <= 1:
            return self.row_len - 1
        seg = self.segments(split)
        most = int(np.bincount(seg.row).max()) if seg.row.size else 1
        return varlen_width(self.row_len - 1, n, most)

    def trained_per_item(self, split: str) -> np.ndarray:
        """Trained targets of each row of ``split`` (int64, by row id), before any batch
        is built; without ``use_loss_mask`` every target inside a segment (l - 1 of a
        segment of l tokens)."""
        sp = self.ds.split(split)
        if not self.cfg.use_loss_mask:
            seg = self.segments(split)
            return np.bincount(seg.row, weights=seg.length - 1, minlength=sp.num_rows).astype(np.int64)
        out = np.zeros(sp.num_rows, np.int64)
        for si, sh in enumerate(sp.shards):
            a, b = int(sp.item_offsets[si]), int(sp.item_offsets[si + 1])
            if b > a:
                starts = np.arange(b - a, dtype=np.int64) * self.row_len
                out[a:b], _ = trained_per_episode(sh.mask, starts + 1, starts + self.row_len)
        return out

    def batch(self, split: str, ids: np.ndarray) -> Batch:
        return packed_batch(self.ds.split(split), self.segments(split), ids, self.row_len, self.pad_id,
                            self.cfg.use_loss_mask, self.cfg.pad_to_multiple_of or 1, self.width(split))

    # -- what the loader logs, audits and fingerprints --------------------------------
    def describe(self, split: str) -> str:
        return f"rows={self.ds.split(split).num_rows} row_len={self.row_len} strategy={self.strategy}"

    def epoch_note(self, split: str) -> str:
        o = self.order(split)
        return f"rows_not_trained={o.n % o.global_batch if o.drop_last else 0}"

    def audit_fields(self) -> dict:
        return {"packing_strategy": self.strategy, **{f"num_{s}_rows": sp.num_rows for s, sp in self.ds.splits.items()}}

    def fingerprint(self) -> dict:
        return {"batch_sampling_mode": self.sampling, "epoch_shuffle": self.cfg.epoch_shuffle,
                "epoch_drop_last": self.cfg.epoch_drop_last,
                "num_rows": {s: self.ds.splits[s].num_rows for s in sorted(self.ds.splits)}}

    def notes(self) -> list[tuple[int, str]]:
        return []
