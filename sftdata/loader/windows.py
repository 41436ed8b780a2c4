"""Token windows (mode ``token_stream``), for datasets without episodes or when asked for.

- ``WindowSource``: nanoGPT-style random windows over the tokens of a split
  (``x = d[i:i+T]``, ``y = d[i+1:i+1+T]``). A window never crosses a shard file. Window
  ``w`` of a split is start ``w - c[k]`` of shard ``k``, where ``c`` counts the windows
  of the shards before it; step ``N`` draws its windows with ``sftdata.order``'s random
  sampling (``default_rng([seed, N])``): reproducible, resumable, rank-partitioned.
- ``split_corpus(tokens, val_ratio, seed)``: contiguous train / val portions.
- ``WindowDataset(tokens, context_length)``: non-overlapping windows, stride = context.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, DatasetError, UsageError
from ..order.batches import BatchOrder
from ..order.config import LoaderConfig
from .batch import Batch


def split_corpus(tokens: np.ndarray, val_ratio: float = 0.05, seed: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)``: the first ``n - k`` and the last ``k = round(n * val_ratio)``
    tokens, as views (no copy).

    Both portions are contiguous, so no window of one ever contains tokens of the other.
    A contiguous split has no randomness: ``seed`` is accepted for callers written
    against the spec and does not move the boundary (same corpus -> same boundary).

    >>> tr, va = split_corpus(np.arange(100), 0.1)
    >>> len(tr), len(va), int(va[0])
    (90, 10, 90)
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise UsageError(f"split_corpus needs a 1-D token array, got shape {tokens.shape}")
    if not isinstance(val_ratio, (int, float)) or not 0.0 <= float(val_ratio) < 1.0:
        raise UsageError(f"val_ratio must be a fraction in [0, 1), got {val_ratio!r}")
    n = tokens.shape[0]
    k = int(np.floor(n * float(val_ratio) + 0.5))
    return tokens[:n - k], tokens[n - k:]


class WindowDataset:
    """Non-overlapping ``(x, y)`` windows of a token array: window ``i`` is
    ``x = tokens[i*C : i*C + C]`` and ``y = tokens[i*C + 1 : i*C + C + 1]``.

    A window needs ``C + 1`` tokens (its targets look one ahead), so there are
    ``(len(tokens) - 1) // C`` windows; the incomplete tail is dropped and a corpus
    shorter than ``C + 1`` tokens gives an empty dataset. Each token is in the ``x`` of
    exactly one window, except the dropped tail. Items are int64 numpy arrays; works
    as a map-style dataset for ``torch.utils.data.DataLoader``.
    """

    def __init__(self, tokens: np.ndarray, context_length: int = 256):
        if not isinstance(context_length, int) or isinstance(context_length, bool) or context_length < 1:
            raise UsageError(f"context_length must be an integer >= 1, got {context_length!r}")
        self.tokens = np.asarray(tokens)
        if self.tokens.ndim != 1:
            raise UsageError(f"WindowDataset needs a 1-D token array, got shape {self.tokens.shape}")
        self.context_length = context_length

    def __len__(self) -> int:
        return max(0, (self.tokens.shape[0] - 1) // self.context_length)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"window {i} out of range (the dataset has {n} windows)")
        s, c = i * self.context_length, self.context_length
        return (self.tokens[s:s + c].astype(np.int64), self.tokens[s + 1:s + c + 1].astype(np.int64))

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(len(self)):
            yield self[i]


class WindowSource:
    """Which windows are in step N of a split (uniform, with replacement), and their
    ``(x, y)`` batch. ``splits`` maps a split name to its token arrays (one per shard)."""

    mode = "token_stream"
    tag = "TokenStreamLoader"  # the log lines' prefix
    items = "windows"
    sampling = "random"
    pad_id = None  # windows are never padded
    end_id = None

    def __init__(self, cfg: LoaderConfig, splits: Mapping[str, Sequence[np.ndarray]], world_size: int = 1,
                 root=None, tokenizer_state: dict | None = None):
        if cfg.batch_tokens is not None or cfg.pad_to_multiple_of not in (None, 1):
            name = "batch_tokens" if cfg.batch_tokens is not None else "pad_to_multiple_of"
            raise ConfigError(f"{name} does not apply to token windows (every window is block_size tokens); "
                              f"leave it null")
        self.cfg = cfg
        self.world_size = world_size
        self.root = root
        self.tokenizer_state = tokenizer_state
        self.arrays = {k: [a if isinstance(a, np.ndarray) else np.asarray(a) for a in v] for k, v in splits.items()}
        self.splits = tuple(self.arrays)
        T = cfg.block_size
        self._windows: dict[str, np.ndarray] = {}  # split -> cumulative window counts per shard
        for name, arrs in self.arrays.items():
            counts = np.array([max(0, a.shape[0] - T) for a in arrs], dtype=np.int64)
            self._windows[name] = np.concatenate([[0], np.cumsum(counts)])
        self._orders: dict[str, BatchOrder] = {}

    def _where(self) -> str:
        return f" of {self.root}" if self.root else ""

    def size(self, split: str) -> int:
        if split not in self._windows:
            raise DatasetError(f"no split {split!r}{f' in {self.root}' if self.root else ''} "
                               f"(splits: {', '.join(self._windows) or 'none'})")
        return int(self._windows[split][-1])

    def order(self, split: str) -> BatchOrder:
        o = self._orders.get(split)
        if o is None:
            n = self.size(split)
            if n == 0:
                raise DatasetError(f"split {split!r}{self._where()} has no run of block_size + 1 = "
                                   f"{self.cfg.block_size + 1} tokens; lower block_size")
            o = self._orders[split] = BatchOrder(n, batch_size=self.cfg.batch_size, world_size=self.world_size,
                                                 seed=self.cfg.epoch_seed, sampling="random",
                                                 what=f"split {split!r}{self._where()}", items="windows")
        return o

    def locate(self, split: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, start offset) of the windows ``ids`` of ``split``."""
        cum = self._windows[split]
        shard = np.searchsorted(cum, ids, side="right") - 1
        return shard, ids - cum[shard]

    def trained_per_item(self, split: str) -> int:
        """Every window trains its ``block_size`` targets."""
        return self.cfg.block_size

    def batch(self, split: str, ids: np.ndarray) -> Batch:
        shard, start = self.locate(split, ids)
        T = self.cfg.block_size
        x = np.empty((len(start), T), dtype=np.int64)
        y = np.empty((len(start), T), dtype=np.int64)
        arrs = self.arrays[split]
        for i, (si, s) in enumerate(zip(shard.tolist(), start.tolist())):
            x[i] = arrs[si][s:s + T]
            y[i] = arrs[si][s + 1:s + 1 + T]
        return Batch(x, y)

    # -- what the loader logs, audits and fingerprints --------------------------------
    def describe(self, split: str) -> str:
        arrs = self.arrays[split]
        return (f"tokens={sum(a.shape[0] for a in arrs)} shards={len(arrs)} "
                f"windows={int(self._windows[split][-1])}")

    def epoch_note(self, split: str) -> str:
        return ""  # random sampling has no epochs

    def audit_fields(self) -> dict:
        return {f"num_{s}_windows": int(c[-1]) for s, c in self._windows.items()}

    def fingerprint(self) -> dict:
        return {"block_size": self.cfg.block_size,
                "num_tokens": {s: int(sum(a.shape[0] for a in v)) for s, v in sorted(self.arrays.items())}}

    def notes(self) -> list[tuple[int, str]]:
        """Settings that have no effect on token windows (logged once, by rank 0)."""
        out = []
        if self.cfg.use_loss_mask:
            out.append((logging.WARNING, f"[{self.tag}] use_loss_mask=true has no effect in token_stream mode (no "
                                         f"episodes, no mask); batches are (x, y)"))
        if self.cfg.batch_sampling_mode == "epoch":
            out.append((logging.INFO, f"[{self.tag}] batch_sampling_mode=epoch applies to sft_episode datasets; "
                                      f"token_stream samples random windows"))
        return out
