"""The mixture source: several datasets trained together at the weights of a mixture file.

Each member is read by its own ``EpisodeSource`` or ``PackedSource`` (same config, same
rows); the order is ``sftdata.order.mixture.MixtureOrder`` (what ``replay-order`` replays
on the mixture file), whose ids say the member and its item. A batch is built member by
member and its rows put back in the order's slots.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import ConfigError
from ..order.config import LoaderConfig
from ..order.mixture import MixtureOrder
from ..packing.layout import PAD_SEQ_ID
from ..packing.varlen import varlen_layout
from ..store.mixture import OpenedMixture, mixture_order
from ..store.rows import ROW_ITEMS
from ..util.ranges import range_index
from .batch import FIELDS, Batch
from .guards import check_trains_something, check_value_ranges
from .indexed import EpisodeSource, PackedSource
from .pairs import PairBatch, PairSource

log = logging.getLogger("sftdata.loader")


def mixture_config(cfg: LoaderConfig, om: OpenedMixture) -> LoaderConfig:
    """``cfg`` with the mixture's seed as ``epoch_seed``: the mixture file fixes the order
    (a config's other seed is named in a warning, never used silently)."""
    seed = om.mixture.seed
    if cfg.epoch_seed != seed:
        log.warning("[MixtureLoader] epoch_seed %d of the config is not used: the mixture %s orders its epochs with "
                    "its own seed %d (make the mixture with `sftdata mix --seed N` to train with another)",
                    cfg.epoch_seed, om.path, seed)
        cfg = cfg.replace(epoch_seed=seed)
    return cfg


class MixtureSource:
    """Which (member, item) pairs are in step N of a split, and their batch."""

    tag = "MixtureLoader"  # the log lines' prefix
    sampling = "epoch"

    def __init__(self, cfg: LoaderConfig, om: OpenedMixture, world_size: int = 1):
        self.cfg = cfg
        self.om = om
        self.world_size = world_size
        self.root = om.path
        packed = om.kind == "packed"
        self.mode = "packed" if packed else "sft_episode"
        self.items = "rows" if packed else "episodes"
        if packed and (getattr(cfg, "pad_to_multiple_of", None) or 1) > 1:
            raise ConfigError(f"the mixture {om.path}: pad_to_multiple_of is not supported for a mixture of packed "
                              f"datasets (its rows keep block_size); remove it from the config")
        for ds in om.datasets:  # refused now, not after hours of loss 0
            check_trains_something(ds, cfg)
            check_value_ranges(ds.root, ds.metadata, ds.tokenizer_state)
        self.members = [(PackedSource if packed else EpisodeSource)(cfg, ds, world_size) for ds in om.datasets]
        self.splits = om.splits
        self.tokenizer_state = om.datasets[0].tokenizer_state
        self.pad_id = self.members[0].pad_id
        self.end_id = self.members[0].end_id
        self._orders: dict[str, MixtureOrder] = {}

    def order(self, split: str) -> MixtureOrder:
        o = self._orders.get(split)
        if o is None:
            o = self._orders[split] = mixture_order(self.cfg, self.om, split, self.world_size)
        return o

    def size(self, split: str) -> int:
        """Items of the first epoch (0 when a member has nothing eligible in ``split``)."""
        items = self.om.items(split, self.cfg.episode_min_tokens)
        return 0 if any(m.ids.shape[0] == 0 for m in items) else self.order(split).epoch_size(0)

    def batch(self, split: str, ids: np.ndarray) -> Batch:
        member, local = self.order(split).locate(ids)
        parts = {}
        for i in np.unique(member[member >= 0]).tolist():
            sel = np.flatnonzero(member == i)
            parts[i] = (sel, self.members[i].batch(split, local[sel]))
        first = next(iter(parts.values()))[1]
        out = {}
        for f in FIELDS:
            v = getattr(first, f)
            if v is None:
                continue
            a = np.empty((ids.shape[0],) + v.shape[1:], dtype=v.dtype)
            for sel, b in parts.values():
                a[sel] = getattr(b, f)
            out[f] = a
        if self.mode == "packed":  # the varlen inputs of the rows as they now lie in the batch
            lay = varlen_layout(*_segments_of(out["seq_ids"]), out["x"].shape[1])
            out.update(cu_seqlens=lay.cu_seqlens, cu_seqlens_padded=lay.cu_seqlens_padded, max_seqlen=lay.max_seqlen)
        return Batch(**out)

    # -- what the loader logs, audits and fingerprints --------------------------------
    def trained_per_item(self, split: str) -> None:
        """None: the loader counts a mixture's batches as it builds them."""
        return None

    def describe(self, split: str) -> str:
        sizes = " ".join(f"{n}={m.size(split)}" for n, m in zip(self.om.names, self.members))
        return f"mixture={self.om.path} by={self.om.mixture.by} seed={self.om.mixture.seed} {self.items}: {sizes}"

    def epoch_note(self, split: str) -> str:
        return f"mixture_sha256={self.om.sha256}"

    def audit_fields(self) -> dict:
        return {"mixture": str(self.om.path), "mixture_sha256": self.om.sha256, "mixture_by": self.om.mixture.by,
                "mixture_seed": self.om.mixture.seed,
                "mixture_members": ",".join(f"{m.name}:{m.weight}" for m in self.om.mixture.members)}

    def fingerprint(self) -> dict:
        return {"batch_sampling_mode": self.sampling, "epoch_shuffle": self.cfg.epoch_shuffle,
                "epoch_drop_last": self.cfg.epoch_drop_last, "episode_min_tokens": self.cfg.episode_min_tokens,
                "mixture_sha256": self.om.sha256}

    def notes(self) -> list[tuple[int, str]]:
        return []


class PairMixtureSource(MixtureSource):
    """A mixture of pairs (KTO rows, RL prompts) datasets: each member read by its own
    ``PairSource``, the order the mixture's (``mixture_order``), each batch's rows put back
    in the order's slots with ``members`` saying whose they are: padded rows (every
    member's are ``block_size`` wide), or with ``padding_free`` one row of every sequence
    in slot order, each pair's sides together (``merge_packed``)."""

    tag = "PairMixtureLoader"

    def __init__(self, cfg: LoaderConfig, om: OpenedMixture, world_size: int = 1, *, padding_free: bool = False):
        self.cfg = cfg
        self.padding_free = bool(padding_free)
        self.om = om
        self.world_size = world_size
        self.root = om.path
        self.mode = om.kind
        self.items = ROW_ITEMS[om.kind]
        self.members = [PairSource(cfg, ds, world_size, padding_free=padding_free) for ds in om.datasets]
        self.splits = om.splits
        self.tokenizer_state = om.datasets[0].tokenizer_state
        self.pad_id = self.members[0].pad_id
        self.end_id = None
        self._orders = {}

    def batch(self, split: str, ids: np.ndarray) -> PairBatch:
        member, local = self.order(split).locate(ids)
        n = ids.shape[0]
        parts = [(np.flatnonzero(member == i), i) for i in np.unique(member[member >= 0]).tolist()]
        built = [(sel, self.members[i].batch(split, local[sel])) for sel, i in parts]
        first = built[0][1]

        def merged(get):
            v = get(first)
            if v is None:
                return None
            a = np.empty((n,) + v.shape[1:], dtype=v.dtype)
            for sel, b in built:
                a[sel] = get(b)
            return a

        def side(name):
            if getattr(first, name) is None:
                return None
            return Batch(*(merged(lambda b, f=f: getattr(getattr(b, name), f)) for f in ("x", "y", "mask")))

        packed = merge_packed([(sel, b.packed) for sel, b in built], n, self.members[0].sides) \
            if self.padding_free else None
        columns = None
        if first.columns is not None:
            columns = [None] * n
            for sel, b in built:
                for j, c in zip(sel.tolist(), b.columns):
                    columns[j] = c
        return PairBatch(kind=first.kind, ids=np.asarray(local, dtype=np.int64), records=merged(lambda b: b.records),
                         prompt_lengths=merged(lambda b: b.prompt_lengths), chosen=side("chosen"),
                         rejected=side("rejected"), packed=packed, labels=merged(lambda b: b.labels),
                         columns=columns, members=np.asarray(member, dtype=np.int64))


def merge_packed(built: list[tuple[np.ndarray, Batch]], n: int, sides: int) -> Batch:
    """The padding-free ``Batch`` of a mixture's ``n`` slots from each member's own
    (``(slots, packed batch)``: its rows in those slots' order, ``sides`` sequences a row):
    every row's sequences moved to its slot, so the row is the one a padding-free batch of
    one dataset would hold in that order (a pair's sides together, never split)."""
    streams = [b for _, b in built]
    base = np.cumsum([0] + [int(b.x.shape[1]) for b in streams])
    starts = np.zeros(n, np.int64)
    lens = np.zeros((n, sides), np.int64)
    for (sel, b), at in zip(built, base[:-1].tolist()):
        cu = np.asarray(b.cu_seqlens, dtype=np.int64)
        seq = np.diff(cu).reshape(-1, sides)
        starts[sel] = at + cu[:-1:sides]
        lens[sel] = seq
    take = range_index(starts, lens.sum(axis=1))
    joined = {f: np.concatenate([getattr(b, f)[0] for b in streams]) for f in ("x", "y", "mask", "position_ids")}
    n_seq = lens.reshape(-1)
    cu = np.concatenate([[0], np.cumsum(n_seq)]).astype(np.int32)
    return Batch(joined["x"][take][None, :], joined["y"][take][None, :], joined["mask"][take][None, :],
                 joined["position_ids"][take][None, :], np.repeat(np.arange(n_seq.size, dtype=np.int64), n_seq)[None, :],
                 cu_seqlens=cu, cu_seqlens_padded=cu.copy(), max_seqlen=int(n_seq.max()) if n_seq.size else 0)


def _segments_of(seq_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(batch row, offset, length) of every run of one seq_id in the rows of ``seq_ids``
    (padding, -1, is no segment), sorted by row then offset; and the number of rows."""
    q = np.asarray(seq_ids)
    b, T = q.shape
    change = np.ones((b, T), dtype=bool)
    change[:, 1:] = q[:, 1:] != q[:, :-1]
    real = change & (q != PAD_SEQ_ID)
    bounds = np.union1d(np.flatnonzero(change.ravel()), np.arange(b + 1, dtype=np.int64) * T)
    starts = np.flatnonzero(real.ravel())
    ends = bounds[np.searchsorted(bounds, starts, side="right")]
    return starts // T, starts % T, ends - starts, b
