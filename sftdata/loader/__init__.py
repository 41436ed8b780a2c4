"""The training loader: ``make_loader(cfg, dataset_dir)`` and what a training script imports.

::

    from sftdata.loader import LoaderConfig, make_loader
    cfg = LoaderConfig.from_file("configs/sft/tiny.json")       # or an XML <training> file
    loader = make_loader(cfg, dataset_dir="data/chat_sft")      # episodes, packed rows or token windows
    batch = loader.get_batch("train")                           # a Batch, (batch_size, block_size) fields
    x, y, mask = batch                                          # episodes with use_loss_mask

    pairs = make_pair_loader(cfg, "data/pref")                  # preference pairs, KTO rows, RL prompts
    pb = pairs.get_batch("train")                               # a PairBatch: pb.chosen, pb.rejected (Batch)

One ``Loader`` (loader.py) over a small source that says which ids are in step N and
builds their batch: ``EpisodeSource`` (indexed.py, one episode per row),
``PackedSource`` (indexed.py, packed rows), ``WindowSource`` (windows.py, token windows).
Every batch is a ``Batch`` (batch.py, with its way to numpy or torch). The order is ``sftdata.order`` (shared with
``replay-order``). Imports numpy only; torch is imported when a torch backend is used.
"""

from __future__ import annotations

from ..order.config import LoaderConfig
from .batch import (
    IGNORE_INDEX,
    Batch,
    BatchIterable,
    apply_ignore_index,
    as_numpy,
    resolve_backend,
    resolve_rank,
    to_backend,
    torch_iterable,
)
from .indexed import EpisodeSource, PackedSource, episode_batch, packed_batch, resolve_pad_id
from .loader import STATE_FORMAT, STATE_VERSION, Loader, dataset_identity, open_source
from .make import check_tokenizer, detect_mode, make_loader, make_pair_loader
from .windows import WindowDataset, WindowSource, split_corpus

# The names the specification's training scripts use: every loader is a Loader, every
# batch a Batch (a packed batch has all five fields).
GPTEpisodeDataLoader = Loader
GPTDataLoader = Loader
PackedDataLoader = Loader
PackedBatch = Batch

__all__ = [
    "LoaderConfig", "make_loader", "Loader", "Batch", "GPTEpisodeDataLoader", "GPTDataLoader", "split_corpus",
    "WindowDataset", "IGNORE_INDEX", "detect_mode", "apply_ignore_index", "episode_batch", "as_numpy",
    "packed_batch", "PackedDataLoader", "PackedBatch", "EpisodeSource", "PackedSource", "WindowSource",
    "open_source", "resolve_pad_id", "dataset_identity", "BatchIterable", "torch_iterable", "to_backend",
    "resolve_backend", "resolve_rank", "STATE_FORMAT", "STATE_VERSION", "check_tokenizer",
    "make_pair_loader", "PairBatch", "PairSource",
]


def __getattr__(name: str):
    """``PairBatch`` and ``PairSource`` (pairs.py), loaded when first named: an SFT
    training process never loads the pair code."""
    if name in ("PairBatch", "PairSource"):
        from . import pairs  # lazy: loaded for pairs, KTO rows and RL prompts only

        return getattr(pairs, name)
    raise AttributeError(f"module 'sftdata.loader' has no attribute {name!r}")
