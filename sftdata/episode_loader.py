"""``GPTEpisodeDataLoader`` (mode ``sft_episode``): one episode per row, never crossing.

Every row is one episode, cut or padded to ``L = block_size + 1`` tokens, then shifted::

    episode t (n = 5 < L = 8), pad P:   t0 t1 t2 t3 t4  P  P  P
    x = row[:-1]                        t0 t1 t2 t3 t4  P  P
    y = row[1:]                         t1 t2 t3 t4  P  P  P
    mask episode m:                     m0 m1 m2 m3 m4
    mask (aligned with y) = m[1:L]      m1 m2 m3 m4  0  0  0

An episode longer than ``L`` keeps its first ``L`` tokens. Which episodes fill step
``N`` is decided by :class:`sftdata.order.BatchOrder` (the same function
``sftdata replay-order`` calls).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from .audit import FIRST_IDS, AuditLog
from .backend import BatchIterable, to_backend, torch_iterable
from .config import LoaderConfig
from .errors import ConfigError, DatasetError
from .order import BatchOrder, eligible_ids
from .store import METADATA_FILE, Dataset, Split, dumps_json, read_json

log = logging.getLogger("sftdata.loader")
STATE_FORMAT = "sftdata-loader-state"
STATE_VERSION = 1
# fingerprint keys a state saved by an older sftdata may lack, or a dataset may not have
OPTIONAL_FINGERPRINT = ("dataset_content_sha256",)


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


def episode_batch(split: Split, ids: np.ndarray, block_size: int, pad_id: int,
                  with_mask: bool) -> tuple[np.ndarray, ...]:
    """``(x, y)`` int64 or ``(x, y, mask)`` with float32 mask, shape ``(len(ids), block_size)``,
    for the global episode ``ids`` of ``split`` (layout in the module docstring)."""
    ids = np.asarray(ids, dtype=np.int64)
    b, T = ids.shape[0], int(block_size)
    L = T + 1
    x = np.empty((b, T), dtype=np.int64)
    y = np.empty((b, T), dtype=np.int64)
    m = np.zeros((b, T), dtype=np.float32) if with_mask else None
    shard_idx = split.shard_of(ids)
    starts = split.starts[ids]
    keep = np.minimum(split.lengths[ids], L)
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
            m[i, :k - 1] = sh.mask[s + 1:s + k]
    return (x, y) if m is None else (x, y, m)


def episode_order(split: Split, cfg: LoaderConfig, world_size: int = 1, what: str = "split") -> BatchOrder:
    """The order of ``split`` under ``cfg``: the one constructor call the loader and
    ``replay-order`` share."""
    return BatchOrder(eligible_ids(split.lengths, cfg.episode_min_tokens), batch_size=cfg.batch_size,
                      world_size=world_size, seed=cfg.epoch_seed, shuffle=cfg.epoch_shuffle,
                      drop_last=cfg.epoch_drop_last, sampling=cfg.batch_sampling_mode or "epoch", what=what)


def resolve_pad_id(cfg: LoaderConfig, ds: Dataset) -> int:
    """``cfg.pad_token_id``, else the EOS id recorded in ``tokenizer_state.json``."""
    state = ds.tokenizer_state or {}
    vocab = state.get("vocab_size")
    pad = cfg.pad_token_id
    if pad is None:
        pad = state.get("eos_id", (state.get("special_tokens") or {}).get("<|EOS|>"))
        if pad is None:
            raise ConfigError(f"pad_token_id is not set and {ds.root} records no tokenizer EOS to pad with "
                              f"(no tokenizer_state.json); set pad_token_id in the config")
    if isinstance(vocab, int) and not 0 <= pad < vocab:
        raise ConfigError(f"pad_token_id {pad} is outside the tokenizer's vocabulary (0..{vocab - 1}) "
                          f"recorded in {ds.root}; use the EOS id {state.get('eos_id')} or leave it null")
    max_id = np.iinfo(ds.token_dtype).max
    if pad > max_id:
        raise ConfigError(f"pad_token_id {pad} does not fit the dataset's {ds.token_dtype.name} tokens")
    return int(pad)


class ResumableSteps:
    """``state_dict`` / ``load_state_dict`` shared by the loaders: the per-split step
    counters plus ``_fingerprint()`` (the settings that decide the order). Subclasses
    may override ``_resume_epoch`` to name the epoch in the ``loader_resume`` audit event."""

    audit = None

    def state_dict(self) -> dict:
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "steps": dict(self._steps),
                "order": self._fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        load_steps(self, state, self._fingerprint())
        for split, step in self._steps.items():
            if self.audit is not None and step:
                self.audit.event("loader_resume", split=split, step=step, epoch=self._resume_epoch(split, step))

    def _resume_epoch(self, split: str, step: int):
        return None


class GPTEpisodeDataLoader(ResumableSteps):
    """Fixed-shape batches of whole episodes; see the module docstring.

    ``get_batch(split)`` returns ``(x, y)`` or, with ``use_loss_mask`` and a mask file,
    ``(x, y, mask)``; ``step(split)`` is the number of batches already returned, i.e.
    the ``--step`` of ``sftdata replay-order`` for the next batch.
    """

    mode = "sft_episode"

    def __init__(self, cfg: LoaderConfig, ds: Dataset, *, backend: str = "numpy", device: str = "cpu",
                 rank: int = 0, world_size: int = 1, audit: AuditLog | None = None):
        if "train" not in ds.splits:
            raise DatasetError(f"{ds.root} has no train split with an episode index")
        self.cfg = cfg
        self.ds = ds
        self.backend = backend
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.audit = audit if rank == 0 else None
        self.sampling = cfg.batch_sampling_mode or "epoch"
        self.pad_id = resolve_pad_id(cfg, ds)
        self.identity = dataset_identity(ds.root)
        self._orders: dict[str, BatchOrder] = {}
        self._steps = {name: 0 for name in ds.splits}
        self._warned: set[str] = set()
        self.last_ids: dict[str, np.ndarray] = {}
        self._log_init()
        self.order("train")  # fail now, not at the first batch, when train cannot be batched

    # -- order ------------------------------------------------------------------------
    def order(self, split: str) -> BatchOrder:
        o = self._orders.get(split)
        if o is None:
            o = episode_order(self.ds.split(split), self.cfg, self.world_size,
                              what=f"split {split!r} of {self.ds.root}")
            self._orders[split] = o
        return o

    def step(self, split: str = "train") -> int:
        return self._steps.get(split, 0)

    def batch_ids(self, split: str, step: int) -> np.ndarray:
        """Global episode ids of this rank's rows at ``step``."""
        return self.order(split).step_ids(step, self.rank)

    def mask_enabled(self, split: str) -> bool:
        return self.cfg.use_loss_mask and self.ds.split(split).has_mask

    # -- batches ----------------------------------------------------------------------
    def batch_at(self, split: str, step: int, ids: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """The numpy batch of ``step`` (no state change, no logging)."""
        ids = self.batch_ids(split, step) if ids is None else ids
        return episode_batch(self.ds.split(split), ids, self.cfg.block_size, self.pad_id, self.mask_enabled(split))

    def get_batch(self, split: str = "train"):
        step = self._steps.get(split, 0)
        if self.cfg.use_loss_mask and not self.ds.split(split).has_mask and split not in self._warned:
            self._warned.add(split)
            log.warning("[EpisodeLoader] use_loss_mask=true but split=%s of %s has no mask file; "
                        "batches are (x, y) and every target is trained", split, self.ds.root)
        self._emit_events(split, step)
        ids = self.batch_ids(split, step)
        batch = self.batch_at(split, step, ids)
        self.last_ids[split] = ids
        self._steps[split] = step + 1
        return to_backend(batch, self.backend, self.device)

    def iterable(self, split: str = "train", start_step: int | None = None, num_steps: int | None = None,
                 torch: bool = False):
        """The batches from ``start_step`` (default: the current step) on, as numpy
        tuples; ``torch=True`` gives a ``torch.utils.data.IterableDataset`` for a
        ``DataLoader(..., batch_size=None, num_workers=W)`` (same batches, same order)."""
        start = self.step(split) if start_step is None else start_step
        return (torch_iterable if torch else BatchIterable)(self, split, start, num_steps)

    # -- state ------------------------------------------------------------------------
    def _fingerprint(self) -> dict:
        return {"dataset_mode": self.mode, "batch_sampling_mode": self.sampling, "epoch_seed": self.cfg.epoch_seed,
                "epoch_shuffle": self.cfg.epoch_shuffle, "epoch_drop_last": self.cfg.epoch_drop_last,
                "batch_size": self.cfg.batch_size, "world_size": self.world_size,
                "episode_min_tokens": self.cfg.episode_min_tokens,
                "num_episodes": {s: self.ds.splits[s].num_episodes for s in sorted(self.ds.splits)},
                "dataset_content_sha256": self.identity}

    def _resume_epoch(self, split: str, step: int):
        return self.order(split).epoch_of_step(step) if self.sampling == "epoch" else None

    # -- logging ----------------------------------------------------------------------
    def _log_init(self) -> None:
        counts = {}
        for name, sp in self.ds.splits.items():
            n_ok = int(np.count_nonzero(sp.lengths >= self.cfg.episode_min_tokens))
            counts[name] = (sp.num_episodes, n_ok)
            if self.rank == 0:
                log.info("[EpisodeLoader] init dataset=%s split=%s episodes=%d eligible=%d skipped_short=%d "
                         "tokens=%d shards=%d mask=%s sampling=%s block_size=%d batch_size=%d world_size=%d",
                         self.ds.root, name, sp.num_episodes, n_ok, sp.num_episodes - n_ok, sp.num_tokens,
                         len(sp.shards), _b(sp.has_mask), self.sampling, self.cfg.block_size,
                         self.cfg.batch_size, self.world_size)
        if self.audit is not None:
            self.audit.event("dataset_load", dataset=str(self.ds.root), dataset_mode=self.mode,
                             batch_sampling_mode=self.sampling, epoch_seed=self.cfg.epoch_seed,
                             epoch_shuffle=self.cfg.epoch_shuffle, epoch_drop_last=self.cfg.epoch_drop_last,
                             batch_size=self.cfg.batch_size, world_size=self.world_size,
                             block_size=self.cfg.block_size, episode_min_tokens=self.cfg.episode_min_tokens,
                             **{f"num_{s}_episodes": c[1] for s, c in counts.items()},
                             **{f"num_{s}_skipped_short": c[0] - c[1] for s, c in counts.items()})

    def _emit_events(self, split: str, step: int) -> None:
        """Epoch boundary log lines and audit events reached by global batch ``step``."""
        if self.rank != 0:
            return
        o = self.order(split)
        for ev in o.step_events(step):
            seed = o.seed + ev.epoch
            if ev.kind == "epoch_start":
                log.info("[EpisodeLoader] split=%s epoch=%d episodes=%d batches=%d shuffle=%s drop_last=%s "
                         "pad_id=%d mask=%s", split, ev.epoch, o.n, o.batches_in_epoch(ev.epoch), _b(o.shuffle),
                         _b(o.drop_last), self.pad_id, _b(self.mask_enabled(split)))
                if self.audit is not None:
                    self.audit.event("epoch_start", split=split, epoch=ev.epoch, seed=seed, num_episodes=o.n,
                                     first_episode_ids=o.epoch_order(ev.epoch)[:FIRST_IDS].tolist(), step=step)
            elif self.audit is not None:
                self.audit.event("epoch_complete", split=split, epoch=ev.epoch, seed_used=seed,
                                 episodes_seen=ev.items_seen, episodes_dropped=o.n - ev.items_seen, step=step)


def load_steps(loader, state: dict, fingerprint: dict) -> None:
    """Shared by the loaders: check a state dict was made by the same order settings,
    then restore the per-split step counters."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ConfigError("not a loader state (expected the dict returned by loader.state_dict())")
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"loader state version {state.get('version')!r} is not supported (this sftdata "
                          f"reads {STATE_VERSION})")
    saved = state.get("order") or {}
    diff = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in fingerprint.items() if saved.get(k) != v
            and not (k in OPTIONAL_FINGERPRINT and (k not in saved or v is None or saved[k] is None))]
    if diff:
        raise ConfigError("cannot resume: the loader state was saved with other order settings or another "
                          "dataset, so the remaining batches would differ (" + "; ".join(diff) + "). Resume "
                          "with the original config and dataset")
    steps = state.get("steps") or {}
    for split, v in steps.items():
        if not isinstance(v, int) or v < 0:
            raise ConfigError(f"loader state: step of split {split!r} must be an integer >= 0, got {v!r}")
    loader._steps.update({k: int(v) for k, v in steps.items()})



def _b(v: bool) -> str:
    return "true" if v else "false"
