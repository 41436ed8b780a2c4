"""``SFTDataset``: a map-style dataset of one split, items as ``transformers`` models take them.

An item holds numpy arrays (no torch needed to read one). ``labels`` align with
``input_ids``: a ``transformers`` model shifts them itself (it scores ``logits[t]``
against ``labels[t + 1]``), so a token is its own label where the mask trains it,
-100 elsewhere. That is the loader's ``y = t[1:]``, ``mask_y = m[1:]`` before the shift::

    episode t (n = 5):      t0    t1    t2    t3    t4
    mask m:                 0     0     1     1     0
    input_ids               t0    t1    t2    t3    t4
    labels                  -100  -100  t2    t3    -100
    the model scores        logits[1] vs t2, logits[2] vs t3 (= the loader's x[1] -> y[1], x[2] -> y[2])

A packed row (``block_size + 1`` tokens, as stored) adds ``position_ids`` restarting at 0
in every segment (0 on padding) and ``seq_lengths``, the length of each segment::

    row (L = 9):     S  u  E  A  a  E  EOS | U  v
    labels           -  -  -  A  a  E  -   | -  -     (- = -100; a segment's first token never)
    position_ids     0  1  2  3  4  5  6   | 0  1
    seq_lengths      [7, 2]

The whole row is the model's input: ``block_size + 1`` tokens give ``block_size`` scored
targets, exactly the loader's batch of that row.

Pickling keeps the path and options only; a worker process reopens the memory-mapped
files (nothing of the data is copied).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError, DatasetError
from ..loader import IGNORE_INDEX, check_tokenizer
from ..loader.indexed import recorded_pad_id
from ..packing.layout import PAD_SEQ_ID, Segments, row_layout
from ..store.reader import Dataset, open_dataset, refuse_row_kind
from ..store.shard import split_segments


class TokenLimits:
    """What a model's embedding must hold, for a dataset class opened as ``self.dataset``
    (``SFTDataset``, ``PairDataset``): ``vocab_size``, ``max_token_id``, ``check_model``."""

    dataset: Dataset

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary size of the dataset's tokenizer (a model's embedding must hold it)."""
        v = (self.dataset.tokenizer_state or {}).get("vocab_size")
        return int(v) if v is not None else None

    @property
    def max_token_id(self) -> int | None:
        """The largest token id the dataset holds (every split), from the ranges its metadata
        records per shard; else its tokenizer's largest id; None when it records neither."""
        return largest_token_id(self.dataset.metadata, self.dataset.tokenizer_state)

    def check_model(self, model) -> None:
        """Refuse a model whose embedding cannot hold this dataset's ids (``check_model``)."""
        check_model(model, self)


class SFTDataset(TokenLimits):
    """The items of ``split`` of the dataset at ``path`` (episodes or packed rows).

    ``ds[i]`` is item ``i`` (global episode id, or row id of a packed dataset): a dict
    of int64 arrays ``input_ids`` and ``labels`` (+ ``position_ids`` and ``seq_lengths``
    for a packed row; + ``media``, its ``MediaSpan``s, in a dataset with images).
    ``block_size``: an episode keeps its first ``block_size + 1`` tokens, as in the loader
    (None: whole episodes); a packed dataset has its own, and another value is refused.
    ``use_loss_mask=False`` trains every target (for a packed row, every one inside a
    segment). ``tokenizer``: the model's tokenizer (a folder, a tokenizer.json, a tiktoken
    name or a Hub id); a dataset made with another is refused, naming both tokenizers'
    sha256 (``sftdata.loader.check_tokenizer``).
    """

    def __init__(self, path: str | Path, split: str = "train", *, block_size: int | None = None,
                 use_loss_mask: bool = True, token_dtype: str | None = None, tokenizer: str | Path | None = None):
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                       or block_size < 1):
            raise ConfigError(f"block_size must be None or an integer >= 1, got {block_size!r}")
        self.path = Path(path)
        self.split_name = split
        self.use_loss_mask = bool(use_loss_mask)
        self.token_dtype = token_dtype
        self._block_size = block_size
        self._open()
        if tokenizer is not None:  # once, here: a worker process reopening the dataset does not check again
            check_tokenizer(self.dataset.root, self.dataset.metadata, self.dataset.tokenizer_state, tokenizer)

    def _open(self) -> None:
        ds = open_dataset(self.path, token_dtype=self.token_dtype)
        refuse_row_kind(ds, "SFTDataset")
        self.dataset = ds
        self.split = ds.split(self.split_name)
        self.has_media = bool(getattr(ds, "has_media", False))  # the store reader's (a media table per shard)
        self.kind = ds.kind
        self._segments: Segments | None = None
        if self.kind == "packed":
            packing = ds.packing
            self.row_len = int(packing["row_len"])
            if self._block_size is not None and self._block_size != self.row_len - 1:
                raise ConfigError(f"{self.path} was packed with block_size {self.row_len - 1}, not {self._block_size}; "
                                  f"leave block_size unset or re-pack with `sftdata pack --block-size "
                                  f"{self._block_size}`")
            self.block_size = self.row_len - 1
            self.pad_id = int(packing["pad_token_id"])
        else:
            self.row_len = None
            self.block_size = self._block_size
            self.pad_id = recorded_pad_id(ds.tokenizer_state)  # a model tokenizer's pad token, else EOS
        if self.use_loss_mask and self.split.num_items and not self.split.has_mask:
            raise DatasetError(f"split {self.split_name!r} of {self.path} has no mask.bin, so the labels cannot say which "
                               f"tokens are trained; re-create the dataset with `sftdata prepare-chat`, or pass "
                               f"use_loss_mask=False to train every token")

    # -- pickling: by path ------------------------------------------------------------
    def __getstate__(self) -> dict:
        return {"path": str(self.path), "split": self.split_name, "block_size": self._block_size,
                "use_loss_mask": self.use_loss_mask, "token_dtype": self.token_dtype}

    def __setstate__(self, state: dict) -> None:
        self.path = Path(state["path"])
        self.split_name = state["split"]
        self._block_size = state["block_size"]
        self.use_loss_mask = state["use_loss_mask"]
        self.token_dtype = state["token_dtype"]
        self._open()

    # -- sizes ------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.split.num_items

    @property
    def lengths(self) -> np.ndarray:
        """Stored length of every item (an episode's whole length; ``row_len`` for a row):
        what the order's ``episode_min_tokens`` is checked against."""
        return self.split.lengths

    @property
    def segments(self) -> Segments:
        """The segments of every row of a packed split (global row ids)."""
        if self.kind != "packed":
            raise DatasetError(f"{self.path} holds episodes, not packed rows: it has no segments")
        if self._segments is None:
            self._segments = split_segments(self.split)
        return self._segments

    def records(self, i: int) -> list[int]:
        """Input record numbers of item ``i``: its episode's, or each segment's of a row
        (-1 where unknown)."""
        i = self._index(i)
        if self.kind == "packed":
            return self.segments.of_rows([i]).source.tolist()
        src = self.split.sources
        return [int(src[i]) if src is not None else -1]

    # -- items ------------------------------------------------------------------------
    def _index(self, i) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"an SFTDataset item id is an integer, got {type(i).__name__}")
        n = len(self)
        if not 0 <= int(i) < n:
            raise IndexError(f"item {int(i)} is outside split {self.split_name!r} of {self.path} (ids 0..{n - 1})")
        return int(i)

    def __getitem__(self, i) -> dict[str, np.ndarray]:
        i = self._index(i)
        if self.kind == "packed":
            return self._row(i)
        limit = None if self.block_size is None else self.block_size + 1
        toks, mask = self.split.episode(i, limit)
        ids = np.asarray(toks, dtype=np.int64)
        labels = np.where(np.asarray(mask) == 1, ids, IGNORE_INDEX) if self.use_loss_mask else ids.copy()
        return self._with_media({"input_ids": ids, "labels": labels}, i)

    def _with_media(self, item: dict, i: int) -> dict:
        """``item`` with its ``media`` spans (offsets from its first token) when the dataset
        holds media: what ``vision_collate`` turns into pixels and mRoPE positions."""
        if self.has_media:
            item["media"] = self.dataset.media_spans(self.split_name, i)
        return item

    def __getitems__(self, ids) -> list[dict[str, np.ndarray]]:
        """``[self[i] for i in ids]``; packed rows in one vectorised pass (a ``DataLoader``
        fetches a batch through this)."""
        ids = [self._index(i) for i in ids]
        return self._rows(ids) if self.kind == "packed" and ids else [self[i] for i in ids]

    def _row(self, i: int) -> dict[str, np.ndarray]:
        return self._rows([i])[0]

    def _rows(self, ids: list[int]) -> list[dict[str, np.ndarray]]:
        rows = np.asarray(ids, dtype=np.int64)
        b, L = rows.size, self.row_len
        toks = np.empty((b, L), dtype=np.int64)
        mask = np.empty((b, L), dtype=np.uint8)
        shard = self.split.shard_of(rows)
        for si in np.unique(shard).tolist():  # one gather per shard
            sel = np.flatnonzero(shard == si)
            sh = self.split.shards[si]
            local = rows[sel] - int(self.split.item_offsets[si])
            toks[sel] = np.asarray(sh.tokens).reshape(-1, L)[local]
            mask[sel] = np.asarray(sh.mask).reshape(-1, L)[local]
        seg = self.segments
        first, last = np.searchsorted(seg.row, rows, "left"), np.searchsorted(seg.row, rows, "right")
        s = seg.of_rows(rows)
        counts = last - first
        seq, pos = row_layout(np.repeat(np.arange(b), counts), s.offset, s.length, b, L)
        if self.use_loss_mask:
            trained = mask == 1
        else:  # every target inside a segment: not a segment's first token, not padding
            trained = np.zeros((b, L), dtype=bool)
            trained[:, 1:] = (seq[:, 1:] == seq[:, :-1]) & (seq[:, 1:] != PAD_SEQ_ID)
        labels = np.where(trained, toks, IGNORE_INDEX)
        lengths = np.split(s.length, np.cumsum(counts)[:-1])
        return [self._with_media({"input_ids": toks[k], "labels": labels[k], "position_ids": pos[k],
                                  "seq_lengths": lengths[k]}, ids[k]) for k in range(b)]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"SFTDataset({str(self.path)!r}, split={self.split_name!r}, kind={self.kind!r}, items={len(self)})"


def largest_token_id(meta: dict | None, state: dict | None) -> int | None:
    """The largest ``token_id_range`` the metadata records over every shard of every split;
    else the tokenizer's largest id (``vocab_size - 1``); None when neither is recorded."""
    tops = [sh["token_id_range"][1] for split in ((meta or {}).get("splits") or {}).values()
            for sh in (split or {}).get("shards") or []
            if isinstance(sh, dict) and isinstance(sh.get("token_id_range"), list) and len(sh["token_id_range"]) == 2]
    if tops:
        return int(max(tops))
    vocab = (state or {}).get("vocab_size")
    return int(vocab) - 1 if isinstance(vocab, int) and vocab > 0 else None


def _rows(layer) -> int | None:
    weight = getattr(layer, "weight", None)
    return int(weight.shape[0]) if weight is not None and getattr(weight, "ndim", 0) == 2 else None


def check_model(model, *datasets: TokenLimits) -> None:
    """Refuse ``model`` when its input embedding (or its output layer) has fewer rows than a
    dataset's largest token id + 1: such an id would index past the table (an error on a
    GPU, or silently the wrong row). Call it once, after loading the model and before
    training (``transformers`` models, or any module with ``get_input_embeddings``).
    ``datasets``: ``SFTDataset`` and ``PairDataset`` objects (any split: the check covers
    the whole dataset)."""
    for ds in datasets:
        if not isinstance(ds, TokenLimits):
            raise ConfigError(f"check_model takes SFTDataset or PairDataset objects (sftdata.torch), got "
                              f"{type(ds).__name__}; open the dataset with one of them first")
    layers = {"input embedding": getattr(model, "get_input_embeddings", lambda: None)(),
              "output layer": getattr(model, "get_output_embeddings", lambda: None)()}
    sizes = {name: _rows(layer) for name, layer in layers.items() if layer is not None}
    if not any(v is not None for v in sizes.values()):
        raise ConfigError(f"{type(model).__name__} has no input embedding to check (no get_input_embeddings() with "
                          f"a 2-D weight); check its vocabulary size against the dataset's tokenizer yourself")
    for ds in datasets:
        top = ds.max_token_id
        if top is None:
            continue
        for name, rows in sizes.items():
            if rows is not None and top >= rows:
                need = ds.vocab_size or top + 1
                raise ConfigError(
                    f"the model's {name} has {rows:,} rows, but {ds.path} holds token id {top:,}: that id would "
                    f"index past it. Resize it first, model.resize_token_embeddings({need}) (the dataset's tokenizer "
                    f"has {need:,} ids), or train on a dataset made with this model's tokenizer")
