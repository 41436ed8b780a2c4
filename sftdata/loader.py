"""The training loader: ``make_loader(cfg, dataset_dir)`` and what a training script imports.

::

    from sftdata.loader import LoaderConfig, make_loader
    cfg = LoaderConfig.from_file("configs/sft1/my_experiment.json")   # or an XML <training> file
    loader = make_loader(cfg, dataset_dir="data/chat_sft")            # mode auto-detected
    x, y, mask = loader.get_batch("train")                            # (batch_size, block_size)

Imports numpy only; torch is imported when a torch backend is used.

- ``sft_episode`` (``GPTEpisodeDataLoader``, episode_loader.py): one episode per row.
- ``token_stream`` (``GPTDataLoader``, stream_loader.py): random windows over tokens.
- packed datasets (``kind: "packed"``): ``sftdata.packed_loader`` (the pack issue).

The order of episodes is ``sftdata.order.BatchOrder`` (shared with ``replay-order``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .audit import AuditLog
from .backend import as_numpy, resolve_backend, resolve_rank
from .config import LoaderConfig
from .episode_loader import GPTEpisodeDataLoader, episode_batch
from .errors import ConfigError, DatasetError
from .store import has_episode_index, open_dataset, open_token_stream
from .stream_loader import GPTDataLoader, WindowDataset, split_corpus

__all__ = ["LoaderConfig", "make_loader", "GPTEpisodeDataLoader", "GPTDataLoader", "split_corpus",
           "WindowDataset", "IGNORE_INDEX", "detect_mode", "apply_ignore_index", "episode_batch", "as_numpy"]

IGNORE_INDEX = -100
log = logging.getLogger("sftdata.loader")


def detect_mode(dataset_dir: str | Path) -> str:
    """``sft_episode`` when ``train/shard_*/episodes.idx`` or ``train/episodes.idx``
    exists, else ``token_stream`` (seed 001's auto-detection)."""
    return "sft_episode" if has_episode_index(dataset_dir, "train") else "token_stream"


def apply_ignore_index(y, mask):
    """``y`` with every target whose mask is 0 replaced by ``IGNORE_INDEX`` (-100), as
    ``F.cross_entropy(..., ignore_index=-100)`` expects. Works on numpy arrays and
    torch tensors; returns a new array."""
    if hasattr(y, "masked_fill"):
        return y.masked_fill(mask == 0, IGNORE_INDEX)
    return np.where(np.asarray(mask) == 0, IGNORE_INDEX, y)


def make_loader(cfg: LoaderConfig | dict, dataset_dir: str | Path, *, backend: str = "auto", device: str = "cpu",
                rank: int | None = None, world_size: int | None = None, audit_dir: str | Path | None = None):
    """A loader for ``dataset_dir``: ``dataset_mode`` from ``cfg``, else auto-detected.

    ``backend``: ``auto`` (torch tensors on ``device`` if torch is installed, else numpy),
    ``numpy`` or ``torch``. ``rank`` / ``world_size`` default from torch.distributed (when
    initialised) or RANK / WORLD_SIZE. ``audit_dir`` (or ``cfg.audit_dir``): where rank 0
    writes ``audit_*.log``.
    """
    if isinstance(cfg, dict):
        cfg = LoaderConfig.from_dict(cfg)
    if not isinstance(cfg, LoaderConfig):
        raise ConfigError(f"make_loader needs a LoaderConfig (or a dict), got {type(cfg).__name__}")
    root = Path(dataset_dir)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist; create it with "
                           f"`sftdata prepare-chat ... --output-dir {root}`")
    backend = resolve_backend(backend)
    rank, world_size = resolve_rank(rank, world_size)
    mode = cfg.dataset_mode or detect_mode(root)
    common = dict(backend=backend, device=device, rank=rank, world_size=world_size)
    if mode == "token_stream":
        splits = {}
        for split in ("train", "val"):
            try:
                splits[split] = open_token_stream(root, split, token_dtype=cfg.token_dtype)
            except DatasetError:
                if split == "train":
                    raise
        return GPTDataLoader(cfg, splits, root=str(root), **common)
    if not has_episode_index(root, "train"):
        raise DatasetError(f"dataset_mode=sft_episode needs an episode index, but {root} has neither "
                           f"train/shard_*/episodes.idx nor train/episodes.idx; prepare the dataset with "
                           f"`sftdata prepare-chat`, or set dataset_mode=token_stream")
    ds = open_dataset(root, token_dtype=cfg.token_dtype)  # refuses a structurally broken dataset
    adir = audit_dir if audit_dir is not None else cfg.audit_dir
    audit = AuditLog(adir) if adir is not None and rank == 0 else None
    if ds.kind == "packed":
        from .packed_loader import make_packed_loader

        return make_packed_loader(cfg, ds, audit=audit, **common)
    return GPTEpisodeDataLoader(cfg, ds, audit=audit, **common)
