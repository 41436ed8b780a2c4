"""The two sources of a dataset with an episode index: ``EpisodeSource`` (one episode
per row) and ``PackedSource`` (packed rows).

The episode source (mode ``sft_episode``): one episode per row, never crossing.

Every row is one episode, cut or padded to ``L = block_size + 1`` tokens, then shifted::

    episode t (n = 5 < L = 8), pad P:   t0 t1 t2 t3 t4  P  P  P
    x = row[:-1]                        t0 t1 t2 t3 t4  P  P
    y = row[1:]                         t1 t2 t3 t4  P  P  P
    mask episode m:                     m0 m1 m2 m3 m4
    mask (aligned with y) = m[1:L]      m1 m2 m3 m4  0  0  0

An episode longer than ``L`` keeps its first ``L`` tokens. With ``batch_tokens`` a batch's
rows are as wide as its longest (``min(length, block_size)``), not ``block_size``. Which
episodes fill step ``N`` is decided by ``sftdata.order.budget.episode_batch_order``
(``order.episode_order``, or token-budget batches; the order ``sftdata replay-order``
replays).

A dataset made with a model's chat template has no EOS that ends every episode (Llama 3's
end-of-turn token also closes each turn), so without ``use_loss_mask`` its rows carry a
mask of 1 on every real target and 0 on padding, as packed rows do (``end_id`` is None).

The packed-row source (datasets of ``kind: "packed"``): fixed rows of several segments.

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

Rows are visited once, in the epoch order of docs/ARCHITECTURE.md §4
(``sftdata.order.row_order``, the order ``replay-order`` replays): training ends when
the loader ends, with no second epoch. With ``epoch_drop_last=false`` the last batch is
completed with padding rows (all padding, mask 0, seq_ids -1) rather than rows of a
second pass.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import ConfigError, DatasetError
from ..order.audit import format_value
from ..order.batches import BatchOrder, Order, row_order
from ..order.budget import episode_batch_order
from ..order.config import LoaderConfig
from ..packing import Segments
from ..packing.layout import PAD_SEQ_ID, row_layout
from ..packing.varlen import varlen_layout, varlen_width
from ..store.reader import Dataset, refuse_row_kind
from ..store.shard import Split, split_segments
from ..tokenize import is_hf_state
from ..util.ranges import trained_per_episode
from .batch import Batch

log = logging.getLogger("sftdata.loader")


def episode_batch(split: Split, ids: np.ndarray, block_size: int, pad_id: int, with_mask: bool,
                  real_mask: bool = False, fit: bool = False) -> Batch:
    """The numpy ``Batch`` of the global episode ``ids`` of ``split``: x, y int64 and,
    ``with_mask``, a float32 mask, each ``(len(ids), block_size)`` (layout in the module
    docstring); ``real_mask`` (and not ``with_mask``): a mask of 1 on every real target.
    ``fit`` (token-budget batches): as wide as the longest row, ``max(min(length,
    block_size))``, instead of ``block_size``."""
    ids = np.asarray(ids, dtype=np.int64)
    b, T = ids.shape[0], int(block_size)
    L = T + 1
    if fit and b:
        T = int(np.minimum(split.lengths[ids], T).max())  # rows are cut at block_size + 1 tokens as always
    x = np.empty((b, T), dtype=np.int64)
    y = np.empty((b, T), dtype=np.int64)
    m = np.zeros((b, T), dtype=np.float32) if with_mask or real_mask else None
    shard_idx = split.shard_of(ids)
    starts = split.starts[ids]
    keep = np.minimum(split.lengths[ids], L)  # a row of ``fit`` width T: keep - 1 <= T targets still fit
    for i in range(b):
        sh = split.shards[shard_idx[i]]
        s, k = int(starts[i]), int(keep[i])
        kx = min(k, T)
        x[i, :kx] = sh.tokens[s:s + kx]
        x[i, kx:] = pad_id
        if k > 1:
            y[i, :k - 1] = sh.tokens[s + 1:s + k]
        y[i, max(k - 1, 0):] = pad_id
        if m is not None and k > 1:
            m[i, :k - 1] = sh.mask[s + 1:s + k] if with_mask else 1
    return Batch(x, y, m)


def resolve_pad_id(cfg: LoaderConfig, ds: Dataset) -> int:
    """``cfg.pad_token_id``, else the pad id ``tokenizer_state.json`` records (a model's
    own tokenizer: its pad token), else its EOS id."""
    state = ds.tokenizer_state or {}
    vocab = state.get("vocab_size")
    pad = cfg.pad_token_id
    if pad is None:
        pad = recorded_pad_id(state)
        if pad is None:
            raise ConfigError(f"pad_token_id is not set and {ds.root} records no tokenizer EOS to pad with "
                              f"(no tokenizer_state.json); set pad_token_id in the config")
    if isinstance(vocab, int) and not 0 <= pad < vocab:
        raise ConfigError(f"pad_token_id {pad} is outside the tokenizer's vocabulary (0..{vocab - 1}) "
                          f"recorded in {ds.root}; use the pad id {recorded_pad_id(state)} or leave it null")
    max_id = np.iinfo(ds.token_dtype).max
    if pad > max_id:
        raise ConfigError(f"pad_token_id {pad} does not fit the dataset's {ds.token_dtype.name} tokens")
    return int(pad)


def recorded_pad_id(tokenizer_state: dict | None) -> int | None:
    """The pad id a tokenizer state records (a model's own tokenizer), else its EOS id, or None."""
    pad = (tokenizer_state or {}).get("pad_id")
    return int(pad) if isinstance(pad, int) and not isinstance(pad, bool) else eos_id(tokenizer_state)


def is_template_dataset(tokenizer_state: dict | None) -> bool:
    """Made with a model's own tokenizer and chat template: no EOS ends every episode."""
    return is_hf_state(tokenizer_state)


def eos_id(tokenizer_state: dict | None) -> int | None:
    """The EOS id a tokenizer state records, or None."""
    state = tokenizer_state or {}
    eos = state.get("eos_id", (state.get("special_tokens") or {}).get("<|EOS|>"))
    return None if eos is None else int(eos)


class _IndexedSource:
    """What the two sources over an episode index share: the config, the dataset and its
    splits, and each split's order, made once (``_new_order``)."""

    def __init__(self, cfg: LoaderConfig, ds: Dataset, world_size: int):
        self.cfg = cfg
        self.ds = ds
        self.world_size = world_size
        self.root = ds.root
        self.splits = tuple(ds.splits)
        self.tokenizer_state = ds.tokenizer_state
        self._orders: dict[str, Order] = {}

    def order(self, split: str) -> Order:
        o = self._orders.get(split)
        if o is None:
            o = self._orders[split] = self._new_order(split, f"split {split!r} of {self.ds.root}")
        return o

    def _new_order(self, split: str, what: str) -> Order:
        raise NotImplementedError


class EpisodeSource(_IndexedSource):
    """Which episodes are in step N of a split, and the padded rows of those episodes.

    ``pad_id`` pads the rows; ``end_id`` (the tokenizer's EOS, else the pad id) ends an
    episode, so in a row without a mask every target after it is padding.
    """

    mode = "sft_episode"
    tag = "EpisodeLoader"  # the log lines' prefix
    items = "episodes"

    def __init__(self, cfg: LoaderConfig, ds: Dataset, world_size: int = 1):
        refuse_row_kind(ds, "the SFT loader (make_loader)")
        if "train" not in ds.splits:
            raise DatasetError(f"{ds.root} has no train split with an episode index")
        if cfg.pad_to_multiple_of not in (None, 1):
            raise ConfigError(f"pad_to_multiple_of is for packed rows (cu_seqlens of several sequences per row); "
                              f"{ds.root} holds one episode per row: leave it null, or pack the dataset")
        super().__init__(cfg, ds, world_size)
        self.sampling = cfg.batch_sampling_mode or "epoch"
        self.pad_id = resolve_pad_id(cfg, ds)
        eos = eos_id(ds.tokenizer_state)
        self.real_mask = is_template_dataset(ds.tokenizer_state)  # rows then carry a mask, always
        self.end_id = None if self.real_mask else self.pad_id if eos is None else eos
        self._warned: set[str] = set()

    def _new_order(self, split: str, what: str) -> Order:
        return episode_batch_order(self.cfg, self.ds.split(split).lengths, self.world_size, what=what)

    def size(self, split: str) -> int:
        """Eligible episodes of ``split``."""
        return self._eligible(self.ds.split(split))

    def mask_enabled(self, split: str) -> bool:
        return self.cfg.use_loss_mask and self.ds.split(split).has_mask

    def trained_per_item(self, split: str) -> np.ndarray:
        """Trained targets of each episode of ``split`` in its row (int64, by episode id):
        what ``Batch.trained_tokens`` counts, before any batch is built."""
        sp = self.ds.split(split)
        keep = np.minimum(sp.lengths.astype(np.int64), self.cfg.block_size + 1)
        if not self.mask_enabled(split):
            return np.maximum(keep - 1, 0)  # row targets 1 .. keep-1: up to and with the episode's EOS
        out = np.zeros(sp.num_episodes, np.int64)
        for si, sh in enumerate(sp.shards):
            a, b = int(sp.item_offsets[si]), int(sp.item_offsets[si + 1])
            starts = sh.index[:, 0].astype(np.int64)
            k = keep[a:b]
            ok = np.flatnonzero(k > 1)
            if ok.size:
                out[a + ok], _ = trained_per_episode(sh.mask, starts[ok] + 1, starts[ok] + k[ok])
        return out

    def batch(self, split: str, ids: np.ndarray) -> Batch:
        sp = self.ds.split(split)
        if self.cfg.use_loss_mask and not sp.has_mask and split not in self._warned:
            self._warned.add(split)
            log.warning("[%s] use_loss_mask=true but split=%s of %s has no mask file; batches are (x, y) and "
                        "every target is trained", self.tag, split, self.ds.root)
        return episode_batch(sp, ids, self.cfg.block_size, self.pad_id, self.mask_enabled(split), self.real_mask,
                             fit=self.cfg.batch_tokens is not None)

    # -- what the loader logs, audits and fingerprints --------------------------------
    def _eligible(self, sp: Split) -> int:
        return int(np.count_nonzero(sp.lengths >= self.cfg.episode_min_tokens))

    def describe(self, split: str) -> str:
        sp = self.ds.split(split)
        n_ok = self._eligible(sp)
        return (f"episodes={sp.num_episodes} eligible={n_ok} skipped_short={sp.num_episodes - n_ok} "
                f"tokens={sp.num_tokens} shards={len(sp.shards)} mask={format_value(sp.has_mask)} sampling={self.sampling}")

    def epoch_note(self, split: str) -> str:
        return f"pad_id={self.pad_id} mask={format_value(self.mask_enabled(split))}"

    def audit_fields(self) -> dict:
        ok = {s: self._eligible(sp) for s, sp in self.ds.splits.items()}
        return {"episode_min_tokens": self.cfg.episode_min_tokens,
                **{f"num_{s}_episodes": n for s, n in ok.items()},
                **{f"num_{s}_skipped_short": self.ds.splits[s].num_episodes - n for s, n in ok.items()}}

    def fingerprint(self) -> dict:
        budget = {} if self.cfg.batch_tokens is None else {"batch_tokens": self.cfg.batch_tokens,
                                                           "block_size": self.cfg.block_size}
        return {"batch_sampling_mode": self.sampling, "epoch_shuffle": self.cfg.epoch_shuffle,
                "epoch_drop_last": self.cfg.epoch_drop_last, "episode_min_tokens": self.cfg.episode_min_tokens,
                "num_episodes": {s: self.ds.splits[s].num_episodes for s in sorted(self.ds.splits)}, **budget}

    def notes(self) -> list[tuple[int, str]]:
        return []


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


class PackedSource(_IndexedSource):
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
        super().__init__(cfg, ds, world_size)
        self.row_len = int(packing["row_len"])
        self.strategy = packing.get("strategy")
        self._segments: dict[str, Segments] = {}

    def _new_order(self, split: str, what: str) -> BatchOrder:
        return row_order(self.cfg, self.ds.split(split).num_rows, self.world_size, what=what)

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
