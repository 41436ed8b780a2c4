"""Numpy -> torch conversion, rank discovery, and the iterable form of a loader.

Kept import-light: torch is imported only when a torch backend is used.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import numpy as np

from ..errors import ConfigError
from .batch import Batch

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
