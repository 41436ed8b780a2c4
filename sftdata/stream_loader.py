"""Token-stream loading (mode ``token_stream``, seeds 000 and 004).

- ``GPTDataLoader``: nanoGPT-style random windows over the concatenated tokens of a
  split (``x = d[i:i+T]``, ``y = d[i+1:i+1+T]``), for datasets without episodes or
  when asked for. A window never crosses a shard file. Step ``N`` draws its window
  starts with ``sftdata.order.random_draws(seed, N, ...)``: reproducible, resumable.
- ``split_corpus(tokens, val_ratio, seed)``: contiguous train / val portions.
- ``WindowDataset(tokens, context_length)``: non-overlapping windows, stride = context.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np

from .backend import BatchIterable, to_backend, torch_iterable
from .config import LoaderConfig
from .episode_loader import ResumableSteps
from .errors import DatasetError, UsageError
from .order import random_draws

log = logging.getLogger("sftdata.loader")


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


class GPTDataLoader(ResumableSteps):
    """Random windows of ``block_size`` tokens over each split's token arrays.

    ``splits`` maps a split name to its arrays (one per shard); build it from a dataset
    folder with ``make_loader`` or directly from arrays: ``GPTDataLoader(cfg, {"train": [arr]})``.
    """

    mode = "token_stream"

    def __init__(self, cfg: LoaderConfig, splits: dict[str, Sequence[np.ndarray]], *, backend: str = "numpy",
                 device: str = "cpu", rank: int = 0, world_size: int = 1, root: str | None = None):
        self.cfg = cfg
        self.backend = backend
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.root = root
        self.arrays = {k: [a if isinstance(a, np.ndarray) else np.asarray(a) for a in v] for k, v in splits.items()}
        T = cfg.block_size
        self._windows: dict[str, np.ndarray] = {}  # split -> cumulative window counts per shard
        for name, arrs in self.arrays.items():
            counts = np.array([max(0, a.shape[0] - T) for a in arrs], dtype=np.int64)
            self._windows[name] = np.concatenate([[0], np.cumsum(counts)])
        if "train" in self._windows and self._windows["train"][-1] == 0:
            raise DatasetError(f"train split{f' of {root}' if root else ''} has no run of block_size + 1 = "
                               f"{T + 1} tokens; lower block_size")
        self._steps = {name: 0 for name in self.arrays}
        from .episode_loader import dataset_identity

        self.identity = dataset_identity(root)
        if cfg.use_loss_mask and rank == 0:
            log.warning("[TokenStreamLoader] use_loss_mask=true has no effect in token_stream mode (no "
                        "episodes, no mask); batches are (x, y)")
        if cfg.batch_sampling_mode == "epoch" and rank == 0:
            log.info("[TokenStreamLoader] batch_sampling_mode=epoch applies to sft_episode datasets; "
                     "token_stream samples random windows")
        if rank == 0:
            for name, arrs in self.arrays.items():
                log.info("[TokenStreamLoader] init dataset=%s split=%s tokens=%d shards=%d windows=%d "
                         "block_size=%d batch_size=%d world_size=%d", root, name, sum(a.shape[0] for a in arrs),
                         len(arrs), int(self._windows[name][-1]), T, cfg.batch_size, world_size)

    def step(self, split: str = "train") -> int:
        return self._steps.get(split, 0)

    def window_starts(self, split: str, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, start offset) of this rank's windows at ``step``."""
        if split not in self._windows:
            raise DatasetError(f"no split {split!r}{f' in {self.root}' if self.root else ''} "
                               f"(splits: {', '.join(self._windows) or 'none'})")
        cum = self._windows[split]
        if cum[-1] == 0:
            raise DatasetError(f"split {split!r} has no run of block_size + 1 = {self.cfg.block_size + 1} tokens")
        g = self.cfg.batch_size * self.world_size
        draws = random_draws(self.cfg.epoch_seed, step, int(cum[-1]), g)
        mine = draws[self.rank * self.cfg.batch_size:(self.rank + 1) * self.cfg.batch_size]
        shard = np.searchsorted(cum, mine, side="right") - 1
        return shard, mine - cum[shard]

    def batch_at(self, split: str, step: int) -> tuple[np.ndarray, np.ndarray]:
        shard, start = self.window_starts(split, step)
        T = self.cfg.block_size
        x = np.empty((len(start), T), dtype=np.int64)
        y = np.empty((len(start), T), dtype=np.int64)
        arrs = self.arrays[split]
        for i, (si, s) in enumerate(zip(shard.tolist(), start.tolist())):
            x[i] = arrs[si][s:s + T]
            y[i] = arrs[si][s + 1:s + 1 + T]
        return x, y

    def _emit_events(self, split: str, step: int) -> None:  # no epochs in random sampling
        return None

    def get_batch(self, split: str = "train"):
        step = self._steps.get(split, 0)
        batch = self.batch_at(split, step)
        self._steps[split] = step + 1
        return to_backend(batch, self.backend, self.device)

    def iterable(self, split: str = "train", start_step: int | None = None, num_steps: int | None = None,
                 torch: bool = False):
        start = self.step(split) if start_step is None else start_step
        return (torch_iterable if torch else BatchIterable)(self, split, start, num_steps)

    def _fingerprint(self) -> dict:
        return {"dataset_mode": self.mode, "epoch_seed": self.cfg.epoch_seed, "batch_size": self.cfg.batch_size,
                "block_size": self.cfg.block_size, "world_size": self.world_size,
                "num_tokens": {s: int(sum(a.shape[0] for a in v)) for s, v in sorted(self.arrays.items())},
                "dataset_content_sha256": self.identity}


