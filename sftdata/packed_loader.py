"""``PackedDataLoader``: fixed-shape batches of packed rows (datasets of ``kind: "packed"``).

A stored row holds ``L = block_size + 1`` tokens; a batch row is shifted like an
episode row, and carries the per-token segment layout (docs/PACKING.md)::

    row (L = 9):        S  u  E  A  a  E  EOS | U  v
    x = row[:-1]        S  u  E  A  a  E  EOS   U
    y = row[1:]         u  E  A  a  E  EOS U    v
    mask (aligned to y) 0  0  1  1  1  0   0    0      (stored mask[1:])
    position_ids        0  1  2  3  4  5   6    0      (of x)
    seq_ids             0  0  0  0  0  0   0    1      (of x; padding -1)

``get_batch`` returns ``PackedBatch(x, y, mask, position_ids, seq_ids)``: int64 arrays
of shape ``(batch_size, block_size)``, mask float32 (torch tensors with the torch
backend). Attention isolation: ``sftdata.attention.block_causal_mask(seq_ids)``.

Rows are visited in the epoch order of ARCHITECTURE.md §4 (``sftdata.order``, the
function ``replay-order`` calls) exactly once: seed 002, "training ends when the loader
ends; no extra epoch cycling". ``get_batch`` raises ``StopIteration`` after the last
batch. With ``epoch_drop_last=false`` the last batch is completed with padding rows
(all padding, mask 0, seq_ids -1) rather than rows of a second pass.
"""

from __future__ import annotations

import logging
from collections import namedtuple

import numpy as np

from .audit import FIRST_IDS, AuditLog
from .backend import BatchIterable, to_backend, torch_iterable
from .config import LoaderConfig
from .episode_loader import ResumableSteps, dataset_identity
from .errors import ConfigError, DatasetError, UsageError
from .order import BatchOrder
from .packing import PAD_SEQ_ID, row_layout
from .store import Dataset, Segments, Split, split_segments

log = logging.getLogger("sftdata.loader")

PackedBatch = namedtuple("PackedBatch", "x y mask position_ids seq_ids")
PackedBatch.__doc__ = "One batch of packed rows: x, y, position_ids, seq_ids int64; mask float32 (1 = trained)."


def packed_order(split: Split, cfg: LoaderConfig, world_size: int = 1, what: str = "split") -> BatchOrder:
    """The row order of a packed split under ``cfg`` (shared by the loader and replay)."""
    sampling = cfg.batch_sampling_mode or "epoch"
    if sampling != "epoch":
        raise ConfigError(f"a packed dataset is read once in epoch order (seed 002: training ends when the "
                          f"loader ends); batch_sampling_mode={sampling!r} is not supported, leave it null or "
                          f"set it to epoch")
    return BatchOrder(np.arange(split.num_episodes, dtype=np.int64), batch_size=cfg.batch_size,
                      world_size=world_size, seed=cfg.epoch_seed, shuffle=cfg.epoch_shuffle,
                      drop_last=cfg.epoch_drop_last, sampling="epoch", what=what)


def num_steps(order: BatchOrder) -> int:
    """Global batches in the one pass over the rows."""
    g, n = order.global_batch, order.n
    return n // g if order.drop_last else -(-n // g)


def step_rows(order: BatchOrder, step: int, rank: int | None = None) -> np.ndarray:
    """Row ids of global batch ``step`` for ``rank`` (None = all ranks); -1 marks a
    padding row completing the last batch."""
    total = num_steps(order)
    if not 0 <= step < total:
        raise UsageError(f"step {step} is outside the one pass over the rows (steps 0..{total - 1})")
    epoch, pos = order.step_positions(step, rank)
    return np.where(epoch == 0, order.epoch_order(0)[np.minimum(pos, order.n - 1)], -1)


def segments_of_rows(seg: Segments, rows: np.ndarray) -> tuple[Segments, np.ndarray]:
    """The segments of ``rows`` (row ids, -1 = none) and, for each, its index in ``rows``."""
    rows = np.asarray(rows, dtype=np.int64)
    a = np.searchsorted(seg.row, rows, side="left")
    b = np.searchsorted(seg.row, rows, side="right")
    n = np.where(rows >= 0, b - a, 0)
    return seg.of_rows(rows[rows >= 0]), np.repeat(np.arange(rows.size), n)


def packed_batch(split: Split, seg: Segments, rows: np.ndarray, row_len: int, pad_id: int,
                 use_loss_mask: bool = True) -> PackedBatch:
    """The numpy ``PackedBatch`` of the given global row ids (-1 = a padding row).

    Without ``use_loss_mask`` every target inside a segment is trained (never one that
    crosses into the next segment or into padding)."""
    rows = np.asarray(rows, dtype=np.int64)
    b, L = rows.size, int(row_len)
    toks = np.full((b, L), pad_id, dtype=np.int64)
    mask = np.zeros((b, L), dtype=np.float32)
    real = np.flatnonzero(rows >= 0)
    shard = split.shard_of(rows[real])
    for si in np.unique(shard).tolist():
        sel = real[shard == si]
        sh = split.shards[si]
        local = rows[sel] - int(split.episode_offsets[si])
        toks[sel] = np.asarray(sh.tokens).reshape(-1, L)[local]
        mask[sel] = np.asarray(sh.mask).reshape(-1, L)[local]
    s, where = segments_of_rows(seg, rows)
    seq, pos = row_layout(where, s.offset, s.length, b, L)
    if not use_loss_mask:
        mask[:, 1:] = (seq[:, 1:] == seq[:, :-1]) & (seq[:, 1:] != PAD_SEQ_ID)
    return PackedBatch(toks[:, :-1], toks[:, 1:].copy(), np.ascontiguousarray(mask[:, 1:]), pos[:, :-1].copy(),
                       seq[:, :-1].copy())


class PackedDataLoader(ResumableSteps):
    """One pass over a packed dataset in seeded epoch order; see the module docstring.

    ``step(split)`` is the number of batches already returned (the ``--step`` of
    ``sftdata replay-order`` for the next batch); ``steps_total(split)`` the batches in
    the pass. ``for batch in loader`` iterates the train split to its end.
    """

    mode = "packed"

    def __init__(self, cfg: LoaderConfig, ds: Dataset, *, backend: str = "numpy", device: str = "cpu",
                 rank: int = 0, world_size: int = 1, audit: AuditLog | None = None):
        if "train" not in ds.splits:
            raise DatasetError(f"{ds.root} has no train split")
        packing = ds.packing or {}
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
        self.row_len = int(packing["row_len"])
        self.identity = dataset_identity(ds.root)
        self.backend = backend
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.audit = audit if rank == 0 else None
        self.sampling = "epoch"
        self._orders: dict[str, BatchOrder] = {}
        self._segments: dict[str, Segments] = {}
        self._steps = {name: 0 for name in ds.splits}
        self.last_ids: dict[str, np.ndarray] = {}
        self._log_init()
        self.order("train")  # fail now, not at the first batch

    # -- order ------------------------------------------------------------------------
    def order(self, split: str) -> BatchOrder:
        o = self._orders.get(split)
        if o is None:
            o = packed_order(self.ds.split(split), self.cfg, self.world_size,
                             what=f"split {split!r} of {self.ds.root}")
            self._orders[split] = o
        return o

    def segments(self, split: str) -> Segments:
        s = self._segments.get(split)
        if s is None:
            s = self._segments[split] = split_segments(self.ds.split(split))
        return s

    def step(self, split: str = "train") -> int:
        return self._steps.get(split, 0)

    def steps_total(self, split: str = "train") -> int:
        return num_steps(self.order(split))

    def batch_ids(self, split: str, step: int) -> np.ndarray:
        """Global row ids of this rank's batch at ``step`` (-1 = padding row)."""
        return step_rows(self.order(split), step, self.rank)

    # -- batches ----------------------------------------------------------------------
    def batch_at(self, split: str, step: int, ids: np.ndarray | None = None) -> PackedBatch:
        """The numpy batch of ``step`` (no state change, no logging)."""
        ids = self.batch_ids(split, step) if ids is None else ids
        return packed_batch(self.ds.split(split), self.segments(split), ids, self.row_len, self.pad_id,
                            self.cfg.use_loss_mask)

    def get_batch(self, split: str = "train") -> PackedBatch:
        step = self._steps.get(split, 0)
        total = self.steps_total(split)
        if step >= total:
            raise StopIteration(f"split {split!r} of {self.ds.root} is done: {total} batches, one pass "
                                f"(training ends when the loader ends)")
        self._emit_events(split, step)
        ids = self.batch_ids(split, step)
        batch = self.batch_at(split, step, ids)
        self.last_ids[split] = ids
        self._steps[split] = step + 1
        if step + 1 == total and self.rank == 0:
            log.info("[PackedLoader] split=%s end of data after %d batches (one pass)", split, total)
        return PackedBatch(*to_backend(tuple(batch), self.backend, self.device))

    def __iter__(self):
        while True:
            try:
                yield self.get_batch("train")
            except StopIteration:
                return

    def iterable(self, split: str = "train", start_step: int | None = None, num_steps: int | None = None,
                 torch: bool = False):
        """Numpy batches from ``start_step`` (default: the current step) to the end of
        the pass (or ``num_steps`` of them); ``torch=True`` gives a
        ``torch.utils.data.IterableDataset`` for ``DataLoader(..., batch_size=None)``."""
        start = self.step(split) if start_step is None else int(start_step)
        left = max(0, self.steps_total(split) - start)
        count = left if num_steps is None else min(int(num_steps), left)
        return (torch_iterable if torch else BatchIterable)(self, split, start, count)

    # -- state ------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        return {"dataset_mode": self.mode, "batch_sampling_mode": self.sampling, "epoch_seed": self.cfg.epoch_seed,
                "epoch_shuffle": self.cfg.epoch_shuffle, "epoch_drop_last": self.cfg.epoch_drop_last,
                "batch_size": self.cfg.batch_size, "world_size": self.world_size,
                "num_rows": {s: self.ds.splits[s].num_episodes for s in sorted(self.ds.splits)},
                "dataset_content_sha256": self.identity}

    def _resume_epoch(self, split: str, step: int):
        return 0  # one pass

    # -- logging ----------------------------------------------------------------------
    def _log_init(self) -> None:
        p = self.ds.packing
        if self.rank == 0:
            for name, sp in self.ds.splits.items():
                log.info("[PackedLoader] init dataset=%s split=%s rows=%d row_len=%d strategy=%s block_size=%d "
                         "batch_size=%d world_size=%d", self.ds.root, name, sp.num_episodes, self.row_len,
                         p.get("strategy"), self.cfg.block_size, self.cfg.batch_size, self.world_size)
        if self.audit is not None:
            self.audit.event("dataset_load", dataset=str(self.ds.root), dataset_mode=self.mode,
                             batch_sampling_mode=self.sampling, epoch_seed=self.cfg.epoch_seed,
                             epoch_shuffle=self.cfg.epoch_shuffle, epoch_drop_last=self.cfg.epoch_drop_last,
                             batch_size=self.cfg.batch_size, world_size=self.world_size,
                             block_size=self.cfg.block_size, packing_strategy=p.get("strategy"),
                             **{f"num_{s}_rows": sp.num_episodes for s, sp in self.ds.splits.items()})

    def _emit_events(self, split: str, step: int) -> None:
        """The epoch 0 start/complete events (there is no second epoch)."""
        if self.rank != 0:
            return
        o = self.order(split)
        for ev in o.step_events(step):
            if ev.epoch != 0:
                continue
            if ev.kind == "epoch_start":
                log.info("[PackedLoader] split=%s epoch=0 rows=%d batches=%d shuffle=%s drop_last=%s "
                         "rows_not_trained=%d", split, o.n, num_steps(o), str(o.shuffle).lower(),
                         str(o.drop_last).lower(), o.n % o.global_batch if o.drop_last else 0)
                if self.audit is not None:
                    self.audit.event("epoch_start", split=split, epoch=0, seed=o.seed, num_episodes=o.n,
                                     first_episode_ids=o.epoch_order(0)[:FIRST_IDS].tolist(), step=step)
            elif self.audit is not None:
                self.audit.event("epoch_complete", split=split, epoch=0, seed_used=o.seed, episodes_seen=ev.items_seen,
                                 episodes_dropped=o.n - ev.items_seen, step=step)


def make_packed_loader(cfg: LoaderConfig, ds: Dataset, **kwargs) -> PackedDataLoader:
    """What ``sftdata.loader.make_loader`` calls for a dataset of kind "packed"."""
    return PackedDataLoader(cfg, ds, **kwargs)


# ------------------------------------------------------------------------- replay
PACKED_STEP_COLUMNS = ("step", "rank", "slot", "row", "segment", "episode", "episode_start", "length", "prefix",
                       "record")
PACKED_EPOCH_COLUMNS = ("position", "step", "rank", "slot", "row", "segment", "episode", "episode_start", "length",
                        "prefix", "record")


def packed_replay(ds: Dataset, cfg: LoaderConfig, *, split: str = "train", epoch: int | None = None,
                  step: int | None = None, rank: int | None = None, world_size: int = 1, head: int | None = None):
    """``replay-order`` on a packed dataset: one line per segment of every row of global
    batch ``step`` (or of the whole pass), with the source episode and input record."""
    from .replay import Replay

    if epoch not in (None, 0):
        raise UsageError(f"a packed dataset is read in one pass (epoch 0); there is no epoch {epoch}")
    sp = ds.split(split)
    o = packed_order(sp, cfg, world_size, what=f"split {split!r} of {ds.root}")
    g, bs = o.global_batch, o.batch_size
    if step is not None:
        rows = step_rows(o, step, rank)
        slot = o._slots(rank)
        position = np.where(rows >= 0, step * g + slot, -1)
        stp = np.full(rows.shape, step, dtype=np.int64)
    else:
        rows = np.asarray(o.epoch_order(0), dtype=np.int64)
        position = np.arange(rows.size, dtype=np.int64)
        trained = position < num_steps(o) * g
        stp = np.where(trained, position // g, -1)
        slot = np.where(trained, position % g, -1)
    seg, where = segments_of_rows(split_segments(sp), rows)
    first = np.searchsorted(where, where, side="left")
    cols = {"step": stp[where], "rank": np.where(slot[where] >= 0, slot[where] // bs, -1),
            "slot": np.where(slot[where] >= 0, slot[where] % bs, -1), "position": position[where],
            "row": rows[where], "segment": np.arange(where.size) - first, "episode": seg.episode,
            "episode_start": seg.episode_start, "length": seg.length, "prefix": seg.prefix, "record": seg.source}
    total = where.size
    k = total if head is None else min(int(head), total)
    names = PACKED_STEP_COLUMNS if step is not None else PACKED_EPOCH_COLUMNS
    cols = {c: np.asarray(cols[c][:k], dtype=np.int64) for c in names}
    return Replay(str(ds.root), split, "epoch", o.seed, o.shuffle, o.drop_last, bs, world_size,
                  cfg.episode_min_tokens, sp.num_episodes, o.n, 0, step, rank, total, cols, [])
