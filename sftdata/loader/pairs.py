"""The loader of preference pairs, KTO rows and RL prompts (``make_pair_loader``).

A row of these datasets (``sftdata.store.rows``) is read as the sequences a trainer
scores: a pair as ``prompt + chosen`` and ``prompt + rejected``, a KTO row as
``prompt + completion`` with its label, an RL prompt as the prompt alone with its other
columns. Each sequence becomes a row shifted like an episode row (``indexed``)::

    prompt p0 p1 p2, chosen c0 c1 E, rejected r0 E (E: end of turn), block_size 6, pad P
    chosen.x      p0 p1 p2 c0 c1 E           chosen.y     p1 p2 c0 c1 E  P
    chosen.mask    0  0  1  1  1  0  (= mask[1:] of prompt + chosen: the completion's targets)
    rejected.x    p0 p1 p2 r0 E  P           rejected.y   p1 p2 r0 E  P  P
    rejected.mask  0  0  1  1  0  0

Both sides of a batch have the same width (``block_size``; with ``batch_tokens`` the
longest sequence of the batch), so a trainer can stack them into one forward pass. The
mask is always given: it is the completion's, as prepared.

``padding_free=True``: one row per batch holding every sequence back to back, pair by pair
(pair 0 chosen, pair 0 rejected, pair 1 chosen, ...), with ``position_ids`` restarting at
each sequence, ``seq_ids``, and ``cu_seqlens`` / ``max_seqlen`` for varlen attention; a
pair is never split between micro-batches. ``x`` is each whole sequence, ``y`` its next
token within the sequence (padding after its last token, mask 0).

The order is the episodes' order over row ids (``sftdata.order.budget.row_batch_order``):
the same seed, shuffle, epochs, ranks, resume and ``replay-order``; a token budget counts
both sides of a pair.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from ..errors import ConfigError, DatasetError
from ..order.audit import format_value
from ..order.batches import Order
from ..order.budget import row_batch_order
from ..order.config import LoaderConfig
from ..store.format import KIND_KTO, KIND_PAIRS, KIND_PROMPTS
from ..store.reader import Dataset, require_row_kind
from ..store.rows import ROW_ITEMS, RowSplit
from ..util.ranges import trained_per_episode
from .batch import Batch
from .indexed import resolve_pad_id

SIDES = {KIND_PAIRS: ("chosen", "rejected"), KIND_KTO: ("completion",), KIND_PROMPTS: ("prompt",)}
ROW_ARRAYS = ("ids", "records", "prompt_lengths", "labels", "members")


@dataclass(frozen=True, eq=False)
class PairBatch:
    """One batch of rows of a pairs, KTO or prompts dataset (numpy arrays, or torch
    tensors with the torch backend)::

        kind     chosen               rejected          labels  columns
        pairs    prompt + chosen      prompt + rejected None    None
        kto      prompt + completion  None              (B,)    None
        prompts  prompt               None              None    B dicts

    ``chosen`` / ``rejected`` are ``Batch`` es of ``(B, T)`` x, y, mask (padded rows);
    with ``padding_free`` both are None and ``packed`` is one ``Batch`` of ``(1, N)``
    holding every sequence, pair by pair, with position_ids, seq_ids and cu_seqlens.
    ``ids`` are the row ids (what ``replay-order`` names), ``records`` their input record
    numbers (-1 when unknown), ``prompt_lengths`` the prompt's tokens in each row."""

    kind: str
    ids: object
    records: object
    prompt_lengths: object
    chosen: Batch | None = None
    rejected: Batch | None = None
    packed: Batch | None = None
    labels: object = None
    columns: list | None = None
    trained_tokens: int | None = None
    members: object = None  # a mixture: each row's member (its index in the mixture file), ``ids`` its own

    @property
    def completion(self) -> Batch | None:
        """KTO: ``prompt + completion`` (the same Batch as ``chosen``)."""
        return self.chosen

    @property
    def sides(self) -> list[Batch]:
        """The padded Batches that are set: chosen (and rejected)."""
        return [b for b in (self.chosen, self.rejected) if b is not None]

    def counted(self) -> PairBatch:
        """This batch with ``trained_tokens``: the mask's sum over every sequence."""
        parts = [self.packed] if self.packed is not None else self.sides
        return replace(self, trained_tokens=sum(int(np.count_nonzero(np.asarray(b.mask))) for b in parts))

    def map(self, fn) -> PairBatch:
        """A batch with ``fn`` applied to every array (the counts, kind and columns stay)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, Batch):
                out[f.name] = v.map(fn)
            elif f.name in ROW_ARRAYS:
                out[f.name] = fn(v)
        return replace(self, **out)

    def pin_memory(self) -> PairBatch:
        return self.map(lambda t: t.pin_memory())


def gather_sequences(rs: RowSplit, rows: np.ndarray, side: int, width: int, pad_id: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens and mask ``(len(rows), width)`` of ``prompt + completion side`` of each row
    (a prompts row: the prompt), padded with ``pad_id`` / 0, and each sequence's length.
    One gather per shard, no per-token loop."""
    sp, k = rs.split, rs.entries
    rows = np.asarray(rows, dtype=np.int64)
    b = rows.shape[0]
    p_ent = rows * k
    c_ent = p_ent + 1 + side if k > 1 else None
    ps, pl = sp.starts[p_ent], sp.lengths[p_ent]
    cs = sp.starts[c_ent] if c_ent is not None else np.zeros(b, np.int64)
    cl = sp.lengths[c_ent] if c_ent is not None else np.zeros(b, np.int64)
    n = pl + cl
    j = np.arange(width, dtype=np.int64)[None, :]
    src = np.where(j < pl[:, None], ps[:, None] + j, cs[:, None] + j - pl[:, None])
    valid = j < n[:, None]
    toks = np.full((b, width), pad_id, dtype=np.int64)
    mask = np.zeros((b, width), dtype=np.float32)
    shard = sp.shard_of(p_ent)
    for si in np.unique(shard).tolist():
        sel = np.flatnonzero(shard == si)
        sh = sp.shards[si]
        v = valid[sel]
        at = src[sel][v]
        t = toks[sel]
        t[v] = np.asarray(sh.tokens[at], dtype=np.int64) if at.size else t[v]
        toks[sel] = t
        if sh.mask is not None and at.size:
            m = mask[sel]
            m[v] = sh.mask[at]
            mask[sel] = m
    return toks, mask, n


def padded_side(rs: RowSplit, rows: np.ndarray, side: int, block_size: int, pad_id: int) -> Batch:
    """The ``Batch`` of one side: x, y ``(B, block_size)`` int64 and the float32 mask aligned with y."""
    toks, mask, _ = gather_sequences(rs, rows, side, block_size + 1, pad_id)
    return Batch(toks[:, :-1], toks[:, 1:].copy(), np.ascontiguousarray(mask[:, 1:]))


def padding_free(rs: RowSplit, rows: np.ndarray, sides: int, pad_id: int) -> Batch:
    """One ``(1, N)`` row of every sequence of ``rows``, row by row and side by side
    (module docstring), with position_ids, seq_ids, cu_seqlens (int32) and max_seqlen."""
    rows = np.asarray(rows, dtype=np.int64)
    lens = rs.sequence_lengths[rows] if rows.size else np.zeros((0, sides), np.int64)
    width = int(lens.max()) if lens.size else 1
    per_side = [gather_sequences(rs, rows, s, width, pad_id) for s in range(sides)]
    toks = np.stack([t for t, _, _ in per_side], axis=1).reshape(-1, width)  # (B * sides, width), pair by pair
    mask = np.stack([m for _, m, _ in per_side], axis=1).reshape(-1, width)
    n = lens.reshape(-1)
    keep = np.arange(width)[None, :] < n[:, None]
    x = toks[keep]
    y_rows = np.concatenate([toks[:, 1:], np.full((toks.shape[0], 1), pad_id, np.int64)], axis=1)
    y_rows[np.arange(width)[None, :] >= n[:, None] - 1] = pad_id
    m_rows = np.concatenate([mask[:, 1:], np.zeros((mask.shape[0], 1), np.float32)], axis=1)
    m_rows[np.arange(width)[None, :] >= n[:, None] - 1] = 0
    seq = np.repeat(np.arange(n.size, dtype=np.int64), n)
    cu = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    pos = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), n)
    return Batch(x[None, :], y_rows[keep][None, :], m_rows[keep][None, :], pos[None, :], seq[None, :],
                 cu_seqlens=cu, cu_seqlens_padded=cu.copy(), max_seqlen=int(n.max()) if n.size else 0)


class PairSource:
    """Which rows are in step N of a split of a pairs, KTO or prompts dataset, and their
    ``PairBatch`` (a source of ``Loader``, like ``EpisodeSource``)."""

    tag = "PairLoader"  # the log lines' prefix

    def __init__(self, cfg: LoaderConfig, ds: Dataset, world_size: int = 1, *, padding_free: bool = False):
        require_row_kind(ds, "make_pair_loader")
        if "train" not in ds.splits:
            raise DatasetError(f"{ds.root} has no train split")
        if cfg.pad_to_multiple_of not in (None, 1):
            raise ConfigError(f"pad_to_multiple_of is for packed SFT rows; {ds.root} holds {ds.kind}: leave it null")
        self.cfg = cfg
        self.ds = ds
        self.kind = ds.kind
        self.mode = ds.kind  # dataset_mode in logs, audit lines and the state
        self.items = ROW_ITEMS[ds.kind]
        self.sides = len(SIDES[ds.kind])
        self.world_size = world_size
        self.root = ds.root
        self.splits = tuple(ds.splits)
        self.tokenizer_state = ds.tokenizer_state
        self.sampling = cfg.batch_sampling_mode or "epoch"
        self.padding_free = bool(padding_free)
        self.pad_id = resolve_pad_id(cfg, ds)
        self.end_id = None  # every row carries a mask
        self._rows = {name: RowSplit(ds.kind, sp) for name, sp in ds.splits.items()}
        self._orders: dict[str, Order] = {}
        for name in self.splits:
            self._check_fits(name)

    def rows(self, split: str) -> RowSplit:
        self.ds.split(split)  # the error naming the splits there are
        return self._rows[split]

    def _check_fits(self, split: str) -> None:
        """A sequence longer than ``block_size + 1`` would be cut here, one side of a pair
        differently from the other: refused (the pair's truncation is prepare's)."""
        rs = self._rows[split]
        lens = rs.sequence_lengths
        over = np.flatnonzero((lens > self.cfg.block_size + 1).any(axis=1)) if lens.size else np.zeros(0, np.int64)
        if over.size and not self.padding_free:
            r = int(over[0])
            rec = rs.records[r] if rs.records is not None else None
            raise ConfigError(f"{self.root}: {over.size:,} {self.items} of split {split!r} have a sequence longer than "
                              f"block_size + 1 = {self.cfg.block_size + 1} tokens (the first: row {r}"
                              + (f", input record {int(rec)}" if rec is not None else "")
                              + f", {int(lens[r].max())} tokens); the loader never cuts a pair. Set block_size >= "
                              f"{int(lens.max()) - 1}, or prepare with `sftdata prepare-pref --max-length "
                              f"{self.cfg.block_size + 1}`")

    def order(self, split: str) -> Order:
        o = self._orders.get(split)
        if o is None:
            o = self._orders[split] = row_batch_order(self.cfg, self.rows(split).sequence_lengths, self.world_size,
                                                      what=f"split {split!r} of {self.root}", items=self.items)
        return o

    def size(self, split: str) -> int:
        lens = self.rows(split).sequence_lengths
        return int(np.count_nonzero(lens.min(axis=1) >= self.cfg.episode_min_tokens)) if lens.size else 0

    def trained_per_item(self, split: str) -> np.ndarray:
        """Trained targets of each row (every side), by row id, before any batch is built:
        each sequence's mask past its first token."""
        rs = self.rows(split)
        sp, k = rs.split, rs.entries
        per_entry = np.zeros(sp.num_items, np.int64)
        first = np.zeros(sp.num_items, np.int64)
        for si, sh in enumerate(sp.shards):
            a, b = int(sp.item_offsets[si]), int(sp.item_offsets[si + 1])
            if b == a or sh.mask is None:
                continue
            starts = sh.index[:, 0].astype(np.int64)
            lens = sh.index[:, 1].astype(np.int64)
            ok = np.flatnonzero(lens > 0)
            per_entry[a + ok], _ = trained_per_episode(sh.mask, starts[ok], starts[ok] + lens[ok])
            first[a + ok] = np.asarray(sh.mask[starts[ok]], dtype=np.int64)
        e = per_entry[:rs.num_rows * k].reshape(-1, k)
        prompt = e[:, 0] - first[:rs.num_rows * k].reshape(-1, k)[:, 0]
        return prompt * self.sides + e[:, 1:].sum(axis=1) if k > 1 else prompt

    def batch(self, split: str, ids: np.ndarray) -> PairBatch:
        rs = self.rows(split)
        ids = np.asarray(ids, dtype=np.int64)
        records = (rs.records[ids] if rs.records is not None else np.full(ids.shape, -1, np.int64)).astype(np.int64)
        common = dict(kind=self.kind, ids=ids, records=records,
                      prompt_lengths=rs.part_lengths[ids, 0].astype(np.int64),
                      labels=rs.labels[ids] if self.kind == KIND_KTO else None,
                      columns=rs.columns(ids) if self.kind == KIND_PROMPTS else None)
        if self.padding_free:
            return PairBatch(**common, packed=padding_free(rs, ids, self.sides, self.pad_id))
        width = self.cfg.block_size
        if self.cfg.batch_tokens is not None and ids.size:
            width = int(min(int(rs.sequence_lengths[ids].max()) - 1, width))
        sides = [padded_side(rs, ids, s, width, self.pad_id) for s in range(self.sides)]
        return PairBatch(**common, chosen=sides[0], rejected=sides[1] if self.sides > 1 else None)

    # -- what the loader logs, audits and fingerprints --------------------------------
    def describe(self, split: str) -> str:
        rs = self.rows(split)
        return (f"{self.items}={rs.num_rows} eligible={self.size(split)} tokens={rs.split.num_tokens} "
                f"shards={len(rs.split.shards)} padding_free={format_value(self.padding_free)} sampling={self.sampling}")

    def epoch_note(self, split: str) -> str:
        return f"pad_id={self.pad_id} kind={self.kind}"

    def audit_fields(self) -> dict:
        return {"episode_min_tokens": self.cfg.episode_min_tokens,
                **{f"num_{s}_{self.items}": self.size(s) for s in self.splits}}

    def fingerprint(self) -> dict:
        budget = {} if self.cfg.batch_tokens is None else {"batch_tokens": self.cfg.batch_tokens,
                                                           "block_size": self.cfg.block_size}
        return {"batch_sampling_mode": self.sampling, "epoch_shuffle": self.cfg.epoch_shuffle,
                "epoch_drop_last": self.cfg.epoch_drop_last, "episode_min_tokens": self.cfg.episode_min_tokens,
                f"num_{self.items}": {s: self._rows[s].num_rows for s in sorted(self.splits)}, **budget}

    def notes(self) -> list[tuple[int, str]]:
        return []
