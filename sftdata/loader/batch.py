"""``Batch``: what ``get_batch`` returns for every kind of dataset, and the -100 targets.

Every field is ``(batch_size, block_size)``: x, y, position_ids and seq_ids int64, mask
float32 (1 = the target is trained). Fields a dataset has none of are None::

    dataset                      x  y  mask                 position_ids  seq_ids
    episodes (one per row)       ✓  ✓  with use_loss_mask   None          None
    packed rows                  ✓  ✓  ✓ (always)           ✓             ✓
    token windows                ✓  ✓  None                 None          None

Iterating a batch yields its fields that are not None, in the order above, so the
tuple forms keep working: ``x, y, mask = loader.get_batch("train")`` (episodes with a
mask), ``x, y = ...`` (token windows, or episodes without a mask).

Beside them, not in the tuple: ``trained_tokens``, the number of trained targets of the
batch (the mask's sum; without a mask, the targets a loss trains: an episode row's up to
its EOS, every target of a token window), what a loss normalised over an optimizer step
adds up (``Loader.step_trained_tokens``); and for packed rows the varlen-attention inputs
``cu_seqlens``, ``cu_seqlens_padded`` and ``max_seqlen`` (docs/PACKING.md).

And how a batch reaches the trainer: numpy -> torch conversion (torch is imported only
when a torch backend is used), rank discovery, and the iterable form of a loader.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from dataclasses import dataclass, fields, replace

import numpy as np

from ..errors import ConfigError

IGNORE_INDEX = -100
FIELDS = ("x", "y", "mask", "position_ids", "seq_ids")
ARRAYS = FIELDS + ("cu_seqlens", "cu_seqlens_padded")  # converted by ``map`` (to torch, to a device)


@dataclass(frozen=True, eq=False)
class Batch:
    """One batch of rows; numpy arrays, or torch tensors with the torch backend."""

    x: object
    y: object
    mask: object = None
    position_ids: object = None
    seq_ids: object = None
    trained_tokens: int | None = None  # trained targets of this batch (set by the loader)
    cu_seqlens: object = None  # packed rows: int32 segment boundaries of the flattened batch
    cu_seqlens_padded: object = None  # the same with each segment padded to pad_to_multiple_of
    max_seqlen: int | None = None  # the longest segment (padded lengths when padding is asked for)

    def as_dict(self) -> dict:
        """The fields that are not None, by name, in order."""
        return {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}

    def __iter__(self):
        return iter(self.as_dict().values())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __getitem__(self, i):
        return tuple(self)[i]

    def map(self, fn) -> Batch:
        """A batch with ``fn`` applied to every array field that is not None (the counts stay ints)."""
        return replace(self, **{f.name: fn(v) for f in fields(self)
                                if f.name in ARRAYS and (v := getattr(self, f.name)) is not None})

    def pin_memory(self) -> Batch:
        """Called by ``torch.utils.data.DataLoader(..., pin_memory=True)`` (torch tensors)."""
        return self.map(lambda t: t.pin_memory())


def apply_ignore_index(y, mask):
    """``y`` with every target whose mask is 0 replaced by ``IGNORE_INDEX`` (-100), as
    ``F.cross_entropy(..., ignore_index=-100)`` expects. Works on numpy arrays and
    torch tensors; returns a new array."""
    if hasattr(y, "masked_fill"):
        return y.masked_fill(mask == 0, IGNORE_INDEX)
    return np.where(np.asarray(mask) == 0, IGNORE_INDEX, y)


def trained_count(x: np.ndarray, mask, end_id: int | None) -> int:
    """Trained targets of a numpy batch: the mask's sum; without a mask, each row's targets
    up to the first ``end_id`` in ``x`` (``scripts/trainer.episode_end_targets``: the EOS
    that ends a padded episode), or every target when ``end_id`` is None."""
    if mask is not None:
        return int(np.count_nonzero(np.asarray(mask)))
    x = np.asarray(x)
    if end_id is None:
        return int(x.size)
    hit = x == end_id
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), x.shape[1])
    return int(first.sum())


BACKENDS = ("auto", "numpy", "torch")


def resolve_backend(backend: str) -> str:
    """``auto`` = torch when it is installed, else numpy."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not valid; choose one of: {', '.join(BACKENDS)}")
    if backend == "auto":
        return "torch" if importlib.util.find_spec("torch") is not None else "numpy"
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        raise ConfigError("backend='torch' but torch is not installed; pip install torch, or use "
                          "backend='numpy'")
    return backend


def to_backend(batch: Batch, backend: str, device: str = "cpu") -> Batch:
    """The numpy batch as it is, or with torch tensors on ``device`` (pinned and copied
    asynchronously for CUDA)."""
    if backend == "numpy":
        return batch
    import torch

    dev = str(device)

    def convert(a):
        t = torch.from_numpy(a)
        if dev.startswith("cuda"):
            return t.pin_memory().to(device, non_blocking=True)
        return t if dev == "cpu" else t.to(device)

    return batch.map(convert)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed when it is initialised (only if torch is
    already imported), else the RANK / WORLD_SIZE environment variables, else 0 / 1."""
    if rank is None or world_size is None:
        d_rank = d_ws = None
        torch = sys.modules.get("torch")
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            d_rank, d_ws = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            d_rank, d_ws = _env_int("RANK"), _env_int("WORLD_SIZE")
        rank = rank if rank is not None else (d_rank if d_rank is not None else 0)
        world_size = world_size if world_size is not None else (d_ws if d_ws is not None else 1)
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an integer in 0..{world_size - 1} (world_size {world_size}), got {rank!r}")
    return rank, world_size


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"environment variable {name}={v!r} is not an integer") from None


class BatchIterable:
    """``for batch in BatchIterable(loader, "train", start_step=0)``: the batches of
    ``loader`` from ``start_step`` on, as numpy arrays, exactly those ``get_batch``
    would return (``num_steps`` of them, or endless). Under a
    ``torch.utils.data.DataLoader(it, batch_size=None, num_workers=W)``, worker ``w``
    builds steps ``start + w, start + w + W, ...`` and the DataLoader returns them
    round-robin, i.e. in step order.

    Use :func:`torch_iterable` for a ``torch.utils.data.IterableDataset``."""

    def __init__(self, loader, split: str = "train", start_step: int = 0, num_steps: int | None = None):
        self.loader = loader
        self.split = split
        self.start_step = int(start_step)
        self.num_steps = num_steps

    def __iter__(self):
        wid, nw = 0, 1
        torch = sys.modules.get("torch")
        if torch is not None:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                wid, nw = info.id, info.num_workers
        end = None if self.num_steps is None else self.start_step + int(self.num_steps)
        step = self.start_step + wid
        while end is None or step < end:
            yield self.loader.batch_at(self.split, step, events=True)
            step += nw


def torch_iterable(loader, split: str = "train", start_step: int = 0, num_steps: int | None = None):
    """A ``torch.utils.data.IterableDataset`` over ``BatchIterable`` whose batches hold
    CPU tensors, made in the worker. A ``DataLoader`` with ``batch_size=None`` passes a
    ``Batch`` through as it is (it converts only tuples, lists and dicts) and pins it
    with ``pin_memory=True`` (``Batch.pin_memory``)."""
    return _torch_iterable_class()(loader, split, start_step, num_steps)


@functools.cache
def _torch_iterable_class() -> type:
    import torch  # optional dependency: only when a torch iterable is asked for

    class TorchBatchIterable(BatchIterable, torch.utils.data.IterableDataset):
        def __iter__(self):
            for batch in BatchIterable.__iter__(self):
                yield batch.map(torch.from_numpy)

        def __reduce__(self):  # a class made on demand: workers started by spawn rebuild it here
            return torch_iterable, (self.loader, self.split, self.start_step, self.num_steps)

    return TorchBatchIterable


def as_numpy(x) -> np.ndarray:
    """A torch tensor or array as a numpy array (tests, tools)."""
    return x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)
