"""``Loader``: the one training loader, over a small source.

A source answers two questions about a split: which ids are in step N (its
``order(split)``, a ``sftdata.order.BatchOrder``: the function ``replay-order`` calls)
and the batch of those ids (``batch(split, ids)``)::

    source          ids of a step              Batch fields                       order
    EpisodeSource   episode ids                x, y (+ mask)                      epochs, or random
    PackedSource    row ids (-1 = padding)     x, y, mask, position_ids, seq_ids  one pass
    WindowSource    window ids                 x, y                               random
    PairSource      pair / row ids             PairBatch: chosen, rejected ...    epochs, or random

Everything else is here, once: the step counter of each split, ``get_batch``, the end
of a one-pass order, the resumable state and its fingerprint, the torch conversion, the
iterable form for ``DataLoader`` workers, the log lines and the audit events.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import ConfigError
from ..order.audit import FIRST_IDS, AuditLog, format_value
from ..order.batches import BatchOrder, Order, Origin
from ..order.config import LoaderConfig
from ..storage import METADATA_FILE, read_json
from ..store.format import dumps_json
from ..store.reader import Dataset
from .batch import Batch, BatchIterable, to_backend, torch_iterable, trained_count
from .guards import check_batch_fits, check_trains_something, check_value_ranges
from .indexed import EpisodeSource, PackedSource
from .windows import WindowSource

log = logging.getLogger("sftdata.loader")
STATE_FORMAT = "sftdata-loader-state"
STATE_VERSION = 1
# a state that holds resume origins (the run changed world size or batch size) is version 2, so an
# sftdata that cannot honour them refuses it; a state without any stays version 1
STATE_VERSION_ORIGINS = 2
# the layout may change between save and resume: the order continues from the saved position
LAYOUT_KEYS = ("batch_size", "world_size")
# fingerprint keys a state saved by an older sftdata may lack, or a dataset may not have
OPTIONAL_FINGERPRINT = ("dataset_content_sha256",)
SOURCES = (EpisodeSource, PackedSource, WindowSource)  # and MixtureSource (mixture.py), loaded for mixtures only,
# and PairSource (pairs.py), loaded for pairs, KTO rows and RL prompts only


def _loaded_module(name: str):
    """The module ``name`` (``sftdata.store.mixture``, ``sftdata.loader.mixture``,
    ``sftdata.loader.pairs``) when already imported, else None: an object can be an opened
    mixture, a mixture source or a pair source only once one was opened, so a loader of
    one SFT dataset never loads the mixture or pair code."""
    return sys.modules.get(name)


def is_opened_mixture(data) -> bool:
    mod = _loaded_module("sftdata.store.mixture")
    return mod is not None and isinstance(data, mod.OpenedMixture)


def is_mixture_source(source) -> bool:
    mod = _loaded_module("sftdata.loader.mixture")
    return mod is not None and isinstance(source, mod.MixtureSource)  # PairMixtureSource is one too


def is_pair_source(source) -> bool:
    mod = _loaded_module("sftdata.loader.pairs")  # loaded once a pairs dataset was opened
    return mod is not None and isinstance(source, mod.PairSource)


class Source(Protocol):
    """What ``Loader`` needs of a source (``EpisodeSource``, ``PackedSource``, ``WindowSource``)."""

    mode: str  # dataset_mode in logs, audit lines and the state: sft_episode | packed | token_stream
    tag: str  # prefix of its log lines
    items: str  # what its ids name, for log lines: episodes | rows | windows
    sampling: str  # epoch | random
    root: object  # the dataset folder, or None
    splits: tuple[str, ...]
    world_size: int
    pad_id: int | None  # what rows are padded with; None: never padded
    end_id: int | None  # in a row without a mask, every target after this id is padding
    tokenizer_state: dict | None

    def order(self, split: str) -> Order: ...
    def size(self, split: str) -> int: ...
    def trained_per_item(self, split: str) -> np.ndarray | int | None: ...  # by item id; int: every item; None: unknown
    def batch(self, split: str, ids: np.ndarray) -> Batch: ...
    def describe(self, split: str) -> str: ...
    def epoch_note(self, split: str) -> str: ...
    def audit_fields(self) -> dict: ...
    def fingerprint(self) -> dict: ...
    def notes(self) -> list[tuple[int, str]]: ...


def dataset_identity(root) -> str | None:
    """sha256 of what ``dataset_metadata.json`` records of the splits: their shards, and
    the size and sha256 of every file in them. Preparing is deterministic, so the same
    inputs and options give the same identity wherever the files are (paths and options
    recorded elsewhere in the metadata do not count); another dataset with the same
    episode counts does not. None for a layout without metadata."""
    if root is None or not (Path(root) / METADATA_FILE).is_file():
        return None
    splits = read_json(Path(root) / METADATA_FILE).get("splits")
    return hashlib.sha256(dumps_json(splits)).hexdigest()


def open_source(cfg: LoaderConfig, data, world_size: int = 1, root=None) -> Source:
    """The source of ``data``: an opened ``Dataset`` (episodes or packed rows), an
    ``OpenedMixture`` (several datasets at weights), a mapping ``{split: [token arrays]}``
    (token windows), or a source itself."""
    if isinstance(data, SOURCES) or is_mixture_source(data) or is_pair_source(data):
        if data.world_size != world_size:
            raise ConfigError(f"the source was made for world_size {data.world_size}, the loader has {world_size}")
        return data
    if isinstance(data, Dataset):
        return (PackedSource if data.kind == "packed" else EpisodeSource)(cfg, data, world_size)
    if is_opened_mixture(data):
        from .mixture import MixtureSource  # lazy: the mixture code loads only for a mixture

        return MixtureSource(cfg, data, world_size)
    if isinstance(data, Mapping):
        return WindowSource(cfg, data, world_size, root=root)
    raise ConfigError(f"a loader reads an opened Dataset or {{split: [token arrays]}}, got {type(data).__name__}")


class Loader:
    """Fixed-shape batches of one dataset; ``make_loader`` builds it from a folder.

    ``Loader(cfg, data)`` also builds it directly: ``data`` is an opened
    ``sftdata.store.Dataset``, an opened mixture (``sftdata.store.mixture.open_mixture``)
    or ``{"train": [token array, ...], ...}`` (token windows).

    ``get_batch(split)`` returns a ``Batch`` and advances ``step(split)``, the number of
    batches already returned: the ``--step`` of ``sftdata replay-order`` for the next
    one. ``steps_total(split)`` is the number of steps of a one-pass order (packed rows),
    None for an endless one; past it ``get_batch`` raises ``StopIteration``.
    """

    def __init__(self, cfg: LoaderConfig, data, *, backend: str = "numpy", device: str = "cpu", rank: int = 0,
                 world_size: int = 1, audit: AuditLog | None = None, root=None):
        if not isinstance(cfg, LoaderConfig):
            raise ConfigError(f"a loader needs a LoaderConfig, got {type(cfg).__name__}")
        if is_opened_mixture(data):
            from .mixture import mixture_config  # lazy: the mixture code loads only for a mixture

            cfg = mixture_config(cfg, data)  # the mixture file fixes the seed
        self.cfg = cfg
        self.source = open_source(cfg, data, world_size, root)
        check_batch_fits(cfg, self.source.mode, device)
        if isinstance(self.source, (EpisodeSource, PackedSource)):  # refused now, not after hours of loss 0
            ds = self.source.ds
            check_trains_something(ds, cfg)
            check_value_ranges(ds.root, ds.metadata, ds.tokenizer_state)
        self.backend = backend
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.audit = audit if rank == 0 else None
        self.identity = dataset_identity(self.source.root)
        self._steps = {name: 0 for name in self.source.splits}
        self._origins: dict[str, Origin] = {}  # where each split's order continues after a resize
        self._resumed: dict[str, BatchOrder] = {}
        self.last_ids: dict[str, np.ndarray] = {}  # the ids of the batch get_batch returned last, per split
        self._trained: dict[str, np.ndarray | int | None] = {}  # trained targets per item, per split (lazily)
        self._log_init()
        self.order("train")  # fail now, not at the first batch, when train cannot be batched

    # -- what every loader answers ----------------------------------------------------
    @property
    def mode(self) -> str:
        """``sft_episode``, ``packed`` or ``token_stream``."""
        return self.source.mode

    @property
    def sampling(self) -> str:
        return self.source.sampling

    @property
    def splits(self) -> tuple[str, ...]:
        return self.source.splits

    @property
    def pad_id(self) -> int | None:
        """The id rows are padded with; None when rows are never padded (token windows)."""
        return self.source.pad_id

    @property
    def end_id(self) -> int | None:
        """In a batch without a mask, every target after this id is padding (episode rows:
        the tokenizer's EOS); None when every target of such a batch is real."""
        return self.source.end_id

    @property
    def vocab_size(self) -> int | None:
        """The vocabulary size the dataset's tokenizer records, or None (a bare token stream)."""
        v = (self.source.tokenizer_state or {}).get("vocab_size")
        return int(v) if v is not None else None

    def order(self, split: str) -> Order:
        """The order of ``split``; after a resume on another layout, the one that continues
        from the saved position (``BatchOrder.origin``)."""
        origin = self._origins.get(split)
        if origin is None:
            return self.source.order(split)
        o = self._resumed.get(split)
        if o is None:
            o = self._resumed[split] = self.source.order(split).relayout(origin=origin)
        return o

    def num_items(self, split: str) -> int:
        """Items (eligible episodes, rows, windows) the order of ``split`` draws from; 0
        for an empty split, which has no order."""
        return self.source.size(split)

    def step(self, split: str = "train") -> int:
        return self._steps.get(split, 0)

    def steps_total(self, split: str = "train") -> int | None:
        return self.order(split).steps_total

    def batch_ids(self, split: str, step: int) -> np.ndarray:
        """Ids of this rank's rows at ``step`` (-1 = a padding row)."""
        return self.order(split).step_ids(step, self.rank)

    # -- batches ----------------------------------------------------------------------
    def batch_at(self, split: str, step: int, ids: np.ndarray | None = None, *, events: bool = False) -> Batch:
        """The numpy batch of ``step``; no state change, and no log line or audit event
        unless ``events`` (the iterable form logs the epochs it reaches)."""
        if events:
            self._emit_events(split, step)
        return self._counted(self.source.batch(split, self.batch_ids(split, step) if ids is None else ids))

    def _counted(self, batch):
        if not isinstance(batch, Batch):  # a PairBatch counts its sides itself
            return batch.counted()
        return replace(batch, trained_tokens=trained_count(batch.x, batch.mask, self.end_id))

    # -- loss normalisation: every rank sums the per-item counts of every rank's items itself
    def trained_tokens_at(self, split: str, step: int, rank: int | None = None) -> int:
        """Trained targets of global batch ``step`` for ``rank`` (None: every rank's
        micro-batch together): ``get_batch(...).trained_tokens`` before it is built, a pure
        function of the order (no data of other ranks is read when the per-item counts,
        ``source.trained_per_item``, are known; they are computed once per split)."""
        ids = self.order(split).step_ids(step, rank)
        if split not in self._trained:
            self._trained[split] = self.source.trained_per_item(split)
        per_item = self._trained[split]
        if isinstance(per_item, int):
            return int(ids.size) * per_item
        if per_item is not None:
            return int(per_item[ids[ids >= 0]].sum())
        return self._counted(self.source.batch(split, ids)).trained_tokens  # unknown per item: build it

    def step_trained_tokens(self, accum_steps: int = 1, split: str = "train", start: int | None = None) -> int:
        """Trained targets of one optimizer step: the ``accum_steps`` global batches from
        ``start`` (default: the next one ``get_batch`` returns), over every rank. Divide the
        summed token losses of this rank's micro-batches by it (and sum the gradients over
        ranks): the loss is then the mean over the step's trained tokens, however the step
        is split into micro-batches and ranks. Steps past a one-pass order's end count 0."""
        if int(accum_steps) < 1:
            raise ConfigError(f"accum_steps must be at least 1, got {accum_steps}")
        start = self.step(split) if start is None else int(start)
        total = self.steps_total(split)
        end = start + int(accum_steps) if total is None else min(start + int(accum_steps), total)
        return sum(self.trained_tokens_at(split, s) for s in range(start, end))

    def get_batch(self, split: str = "train") -> Batch:
        step = self._steps.get(split, 0)
        total = self.steps_total(split)
        if total is not None and step >= total:
            raise StopIteration(f"split {split!r} of {self.source.root} is done: {total} batches, one pass "
                                f"(training ends when the loader ends)")
        self._emit_events(split, step)
        ids = self.batch_ids(split, step)
        batch = self._counted(self.source.batch(split, ids))
        self.last_ids[split] = ids
        self._steps[split] = step + 1
        if total is not None and step + 1 == total and self.rank == 0:
            log.info("[%s] split=%s end of data after %d batches (one pass)", self.source.tag, split, total)
        return to_backend(batch, self.backend, self.device)

    def __iter__(self):
        """The train batches from the current step to the end of the order (endless
        unless the order is one pass)."""
        while True:
            try:
                yield self.get_batch("train")
            except StopIteration:
                return

    def iterable(self, split: str = "train", start_step: int | None = None, num_steps: int | None = None,
                 torch: bool = False):
        """The numpy batches from ``start_step`` (default: the current step) on, ``num_steps``
        of them or up to the end of a one-pass order (else endless); ``torch=True`` gives a
        ``torch.utils.data.IterableDataset`` for ``DataLoader(..., batch_size=None,
        num_workers=W)`` (same batches, same order, as CPU tensors)."""
        start = self.step(split) if start_step is None else int(start_step)
        total = self.steps_total(split)
        if total is not None:
            left = max(0, total - start)
            num_steps = left if num_steps is None else min(int(num_steps), left)
        return (torch_iterable if torch else BatchIterable)(self, split, start, num_steps)

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The step of each split and the settings that decide the order (JSON-able);
        after a resume on another layout, also where each order continues from."""
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, "steps": dict(self._steps),
                 "order": self._fingerprint()}
        if self._origins:
            state["version"] = STATE_VERSION_ORIGINS
            state["origins"] = {k: o.as_list() for k, o in self._origins.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` was saved; refused when the order would differ.

        Elastic: the world size and batch size may differ from the saved ones. With the
        same global batch (batch_size x world_size) the batches are those of the
        uninterrupted run; otherwise the order continues from the saved position of the
        epoch order, nothing repeated or skipped (``BatchOrder`` with an origin)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("not a loader state (expected the dict returned by loader.state_dict())")
        if state.get("version") not in (STATE_VERSION, STATE_VERSION_ORIGINS):
            raise ConfigError(f"loader state version {state.get('version')!r} is not supported (this sftdata "
                              f"reads {STATE_VERSION} and {STATE_VERSION_ORIGINS})")
        saved = state.get("order") or {}
        diff = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in self._fingerprint().items()
                if saved.get(k) != v and k not in LAYOUT_KEYS
                and not (k in OPTIONAL_FINGERPRINT and (k not in saved or v is None or saved[k] is None))]
        if diff:
            raise ConfigError("cannot resume: the loader state was saved with other order settings or another "
                              "dataset, so the remaining batches would differ (" + "; ".join(diff) + "). Resume "
                              "with the original config and dataset")
        steps = state.get("steps") or {}
        for split, v in steps.items():
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"loader state: step of split {split!r} must be an integer >= 0, got {v!r}")
        origins = self._saved_origins(state, saved, steps)
        resumed = {k: self.source.order(k).relayout(origin=o) for k, o in origins.items()}  # checked before any change
        self._steps.update({k: int(v) for k, v in steps.items()})
        self._origins, self._resumed = origins, resumed
        for split, step in self._steps.items():
            if self.audit is not None and step:
                self.audit.event("loader_resume", split=split, step=step, epoch=self._epoch_of(split, step))

    def _saved_origins(self, state: dict, saved: dict, steps: dict) -> dict[str, Origin]:
        """The origin of each split's order after loading ``state``: the saved ones when the
        layout is the same, else where the saved layout had reached at the saved step."""
        raw = state.get("origins") or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"loader state: origins must be a dict of split -> [step, epoch, position], got {raw!r}")
        origins = {k: Origin.from_value(v, f"loader state, split {k!r}") for k, v in raw.items()}
        layout = {k: saved.get(k) for k in LAYOUT_KEYS}
        if layout == {"batch_size": self.cfg.batch_size, "world_size": self.world_size}:
            return {k: o for k, o in origins.items() if k in self.source.splits and self.source.size(k)}
        for k, v in layout.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"loader state: {k} must be an integer >= 1, got {v!r}")
        out = {}
        for split, step in steps.items():
            if split not in self.source.splits or not self.source.size(split) or (not step and split not in origins):
                continue
            now = self.source.order(split)
            if not isinstance(now, BatchOrder):
                what = "a mixture's batches" if is_mixture_source(self.source) else "batches sized by batch_tokens"
                raise ConfigError(f"cannot resume: the state was saved with batch_size {layout['batch_size']} x "
                                  f"world_size {layout['world_size']}, and {what} cannot change "
                                  f"their layout on resume; resume with world_size {layout['world_size']}")
            out[split] = now.relayout(origin=origins.get(split), **layout).origin_at(int(step))
        return out

    def _fingerprint(self) -> dict:
        return {"dataset_mode": self.mode, "epoch_seed": self.cfg.epoch_seed, "batch_size": self.cfg.batch_size,
                "world_size": self.world_size, **self.source.fingerprint(), "dataset_content_sha256": self.identity}

    def _epoch_of(self, split: str, step: int) -> int | None:
        o = self.order(split)
        if o.sampling != "epoch" or (o.steps_total is not None and step >= o.steps_total):
            return None
        return o.epoch_of_step(step)

    # -- logging ----------------------------------------------------------------------
    def _log_init(self) -> None:
        src, cfg = self.source, self.cfg
        if self.rank == 0:
            for level, note in src.notes():
                log.log(level, note)
            for name in src.splits:
                log.info("[%s] init dataset=%s split=%s %s block_size=%d batch_size=%d world_size=%d", src.tag,
                         src.root, name, src.describe(name), cfg.block_size, cfg.batch_size, self.world_size)
        if self.audit is not None:
            self.audit.event("dataset_load", dataset=str(src.root), dataset_mode=src.mode,
                             batch_sampling_mode=src.sampling, epoch_seed=cfg.epoch_seed,
                             epoch_shuffle=cfg.epoch_shuffle, epoch_drop_last=cfg.epoch_drop_last,
                             batch_size=cfg.batch_size, world_size=self.world_size, block_size=cfg.block_size,
                             **src.audit_fields())

    def _emit_events(self, split: str, step: int) -> None:
        """The epoch boundary log lines and audit events global batch ``step`` reaches.
        The audit keys name episodes (a documented format ``replay-order --check-audit``
        reads); for packed rows they count rows."""
        if self.rank != 0:
            return
        o = self.order(split)
        for ev in o.step_events(step):
            seed = o.seed + ev.epoch
            if ev.kind == "epoch_start":
                log.info("[%s] split=%s epoch=%d %s=%d batches=%d shuffle=%s drop_last=%s %s", self.source.tag, split,
                         ev.epoch, self.source.items, o.epoch_size(ev.epoch), o.batches_in_epoch(ev.epoch), format_value(o.shuffle),
                         format_value(o.drop_last), self.source.epoch_note(split))
                if self.audit is not None:
                    self.audit.event("epoch_start", split=split, epoch=ev.epoch, seed=seed,
                                     num_episodes=o.epoch_size(ev.epoch),
                                     first_episode_ids=o.epoch_order(ev.epoch)[:FIRST_IDS].tolist(), step=step)
            elif self.audit is not None:
                self.audit.event("epoch_complete", split=split, epoch=ev.epoch, seed_used=seed,
                                 episodes_seen=ev.items_seen, episodes_dropped=o.epoch_size(ev.epoch) - ev.items_seen,
                                 step=step)
