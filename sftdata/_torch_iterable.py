"""The torch ``IterableDataset`` form of a loader (imported only when asked for)."""

from __future__ import annotations

import torch

from .backend import BatchIterable


class TorchBatchIterable(BatchIterable, torch.utils.data.IterableDataset):
    pass
