"""Token-budget batches (``batch_tokens``): episode batches of up to a token budget instead
of a fixed row count, the same number on every rank. Pure and I/O-free, like ``order``.

Epoch ``e`` visits the eligible episodes in the documented order (``order.epoch_order``:
``RandomState(epoch_seed + e).permutation``). That order is cut, front to back, into
*rank batches*: each takes the most consecutive episodes whose padded size stays within
the budget, ``rows x width <= batch_tokens`` where ``width`` is the batch's longest row
(``min(length, block_size)``: rows are padded to the longest one, never to block_size).
Every ``world_size`` consecutive rank batches form one global step, rank ``r`` taking
the ``r``-th, so every rank gets exactly one micro-batch per step and none waits::

    batch_tokens 12, world_size 2, row widths in epoch order:  5 3 4 6 6 2 2 2 2 2 8 3
    rank batches:   [5 3] (2x5=10)  [4 6] (2x6=12)  [6 2] (12)  [2 2 2 2] (8)  [8] (8)  [3] (3)
    steps:          step 0: rank 0 [5 3], rank 1 [4 6]
                    step 1: rank 0 [6 2], rank 1 [2 2 2 2]
                    step 2: rank 0 [8],   rank 1 [3]

The last rank batches of an epoch that do not fill a global step are not trained in that
epoch (as ``epoch_drop_last=true``; the next epoch's shuffle trains them). Steps per epoch
vary with the shuffle: the step of an epoch's first batch is the sum of the steps of the
epochs before it, so the plans of those epochs are computed (and kept) on the way.
Deterministic from the seed; ``replay-order`` and the loader call the same function
(``episode_batch_order``).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, UsageError
from .batches import BatchOrder, OrderSettings, StepEvent, eligible_ids, episode_order, epoch_permutation


def budget_bounds(widths: np.ndarray, budget: int, rows_per_item: int = 1) -> np.ndarray:
    """Start positions of the rank batches of ``widths`` (one row width per item, in visiting
    order), and ``len(widths)`` last: each batch holds the most consecutive items with
    ``rows x max(width) <= budget`` (at least one), an item being ``rows_per_item`` rows
    (a preference pair: 2, its chosen and rejected sequences). One vectorised search per batch::

        >>> budget_bounds(np.array([5, 3, 4, 6, 6, 2, 2, 2, 2, 2, 8, 3]), 12).tolist()
        [0, 2, 4, 6, 10, 11, 12]
    """
    w = np.asarray(widths, dtype=np.int64)
    n = w.shape[0]
    r = int(rows_per_item)
    most = max(1, int(budget) // (r * max(1, int(w.min()) if n else 1)))  # no batch holds more items than this
    window = 16
    out = [0]
    i = 0
    while i < n:
        while True:
            seg = w[i:i + window]
            cost = np.maximum.accumulate(seg) * np.arange(r, r * seg.shape[0] + 1, r, dtype=np.int64)  # nondecreasing
            k = int(np.searchsorted(cost, int(budget), side="right"))
            if k < seg.shape[0] or i + window >= n or window >= most:
                break
            window *= 2  # the batch may go on past the window: look further
        k = max(1, k)
        i += k
        out.append(i)
        window = max(16, 2 * k)  # the next batch is likely about as long
    return np.asarray(out, dtype=np.int64)


class TokenBudgetOrder:
    """The order of an episode split under ``batch_tokens`` (module docstring). Answers
    what the loader, the audit log and ``replay-order`` ask of ``BatchOrder``."""

    sampling = "epoch"
    one_pass = False
    steps_total = None
    drop_last = True

    def __init__(self, ids: np.ndarray, widths: np.ndarray, *, budget: int, world_size: int = 1, seed: int = 1337,
                 shuffle: bool = True, what: str = "split", items: str = "episodes", rows_per_item: int = 1):
        self._ids = np.asarray(ids, dtype=np.int64)
        self._widths = np.asarray(widths, dtype=np.int64)  # by position in ``ids``
        self.budget = int(budget)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.what = what
        self.items = items
        self.batch_size = None  # rows vary per batch
        self.rows_per_item = int(rows_per_item)  # a pair is two rows (chosen, rejected) of its width
        if self.n == 0:
            raise ConfigError(f"{what} has no eligible item to train on (every one is shorter than the minimum "
                              f"length, or the split is empty); lower episode_min_tokens or check the dataset")
        self._base = BatchOrder(self._ids, batch_size=1, world_size=1, seed=seed, shuffle=shuffle, drop_last=True,
                                what=what, items=items)  # the documented epoch orders
        self._plans: dict[int, np.ndarray] = {}  # epoch -> rank-batch bounds
        self._first = [0]  # first step of epochs 0, 1, ... (as far as planned)
        if self.batches_in_epoch(0) == 0:
            raise ConfigError(f"{what}: batch_tokens {budget} gives {len(self._bounds(0)) - 1} rank batch(es) per "
                              f"epoch, fewer than one per rank (world_size {world_size}), so an epoch has no step; "
                              f"lower batch_tokens")

    @property
    def n(self) -> int:
        return int(self._ids.shape[0])

    @property
    def ids(self) -> np.ndarray:
        return self._ids

    def epoch_size(self, epoch: int) -> int:
        """Items of ``epoch``: every eligible episode, each epoch."""
        return self.n

    @property
    def global_batch(self) -> int | None:
        return None

    def epoch_order(self, epoch: int) -> np.ndarray:
        return self._base.epoch_order(epoch)

    def _bounds(self, epoch: int) -> np.ndarray:
        b = self._plans.get(epoch)
        if b is None:
            if epoch < 0:
                raise UsageError(f"epoch must be >= 0, got {epoch}")
            perm = epoch_permutation(self.n, self.seed, epoch) if self.shuffle else np.arange(self.n)
            b = budget_bounds(self._widths[perm], self.budget, self.rows_per_item)
            if len(self._plans) >= 64:  # keep the plans of the epochs in use, and the step table
                self._plans.pop(min(self._plans))
            self._plans[epoch] = b
        return b

    def batches_in_epoch(self, epoch: int) -> int:
        """Global steps of ``epoch``."""
        return (len(self._bounds(epoch)) - 1) // self.world_size

    def first_step_of_epoch(self, epoch: int) -> int:
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, got {epoch}")
        while len(self._first) <= epoch:
            e = len(self._first) - 1
            self._first.append(self._first[-1] + self.batches_in_epoch(e))
        return self._first[epoch]

    def epoch_of_step(self, step: int) -> int:
        if int(step) < 0:
            raise UsageError(f"step must be >= 0 (0 = the first batch of training), got {step}")
        e = 0
        while self.first_step_of_epoch(e + 1) <= step:
            e += 1
        return e

    def slots(self, rank: int | None) -> None:
        if rank is not None and not 0 <= rank < self.world_size:
            raise UsageError(f"rank {rank} is outside 0..{self.world_size - 1} (world_size {self.world_size})")

    def step_table(self, step: int, rank: int | None = None) -> tuple[np.ndarray, ...]:
        """(ids, rank, slot, epoch, position in the epoch order) of every row of ``step``
        for ``rank`` (None: every rank, in rank order)."""
        self.slots(rank)
        e = self.epoch_of_step(step)
        b = self._bounds(e)
        k = (int(step) - self.first_step_of_epoch(e)) * self.world_size
        ranks = range(self.world_size) if rank is None else [rank]
        parts = [(r, np.arange(b[k + r], b[k + r + 1], dtype=np.int64)) for r in ranks]
        pos = np.concatenate([p for _, p in parts])
        rk = np.concatenate([np.full(p.size, r, np.int64) for r, p in parts])
        slot = np.concatenate([np.arange(p.size, dtype=np.int64) for _, p in parts])
        return self.epoch_order(e)[pos], rk, slot, np.full(pos.size, e, np.int64), pos

    def step_ids(self, step: int, rank: int | None = None) -> np.ndarray:
        return self.step_table(step, rank)[0]

    def epoch_table(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(step, rank, slot) of every position of the epoch order; -1 for the tail that
        fills no global step."""
        b = self._bounds(epoch)
        used = self.batches_in_epoch(epoch) * self.world_size
        batch = np.repeat(np.arange(len(b) - 1, dtype=np.int64), np.diff(b))
        slot = np.arange(self.n, dtype=np.int64) - b[batch]
        trained = batch < used
        step = np.where(trained, self.first_step_of_epoch(epoch) + batch // self.world_size, -1)
        return step, np.where(trained, batch % self.world_size, -1), np.where(trained, slot, -1)

    def step_events(self, step: int) -> list[StepEvent]:
        e = self.epoch_of_step(step)
        first, count = self.first_step_of_epoch(e), self.batches_in_epoch(e)
        events = []
        if step == first:
            events.append(StepEvent("epoch_start", e))
        if step == first + count - 1:
            b = self._bounds(e)
            events.append(StepEvent("epoch_complete", e, int(b[count * self.world_size])))
        return events


def _check_budget_settings(cfg: OrderSettings) -> None:
    if (cfg.batch_sampling_mode or "epoch") != "epoch":
        raise ConfigError("batch_tokens needs batch_sampling_mode=epoch (random sampling draws a fixed number of rows)")
    if not cfg.epoch_drop_last:
        raise ConfigError("batch_tokens needs epoch_drop_last=true: the rank batches that do not fill a last global "
                          "step are trained by the next epoch's shuffle instead of stretching a step across epochs")


def episode_batch_order(cfg: OrderSettings, lengths: np.ndarray, world_size: int = 1, what: str = "split"):
    """The order of an episode split as the loader follows it: ``order.episode_order``,
    or with ``batch_tokens`` set, a ``TokenBudgetOrder`` (rows up to ``block_size`` wide)."""
    budget = getattr(cfg, "batch_tokens", None)
    if budget is None:
        return episode_order(cfg, lengths, world_size, what)
    block = int(cfg.block_size)
    if budget < block:
        raise ConfigError(f"batch_tokens {budget} is smaller than one row of block_size {block}; set batch_tokens "
                          f">= {block}")
    _check_budget_settings(cfg)
    ids = eligible_ids(lengths, cfg.episode_min_tokens)
    widths = np.minimum(np.asarray(lengths, dtype=np.int64)[ids], block)
    return TokenBudgetOrder(ids, widths, budget=budget, world_size=world_size, seed=cfg.epoch_seed,
                            shuffle=cfg.epoch_shuffle, what=what, items="episodes")


def row_batch_order(cfg: OrderSettings, lengths: np.ndarray, world_size: int = 1, what: str = "split",
                    items: str = "pairs"):
    """The order of a split of rows of several sequences (docs/LOADER.md, "Pairs, KTO rows
    and RL prompts"): ``lengths`` is ``(rows, sides)``, the tokens of each sequence a row
    trains (a pair: ``prompt + chosen``, ``prompt + rejected``). The same orders as
    episodes (``episode_order``: seed, shuffle, epochs, ranks, resume), over row ids: a
    row is eligible when its shortest sequence has ``episode_min_tokens``; with
    ``batch_tokens`` a row costs ``sides`` rows of its longest sequence's width (up to
    ``block_size``), so a budget counts both sides of every pair."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(len(lengths), -1)
    sides = lengths.shape[1]
    shortest = lengths.min(axis=1) if lengths.size else np.zeros(0, np.int64)
    budget = getattr(cfg, "batch_tokens", None)
    if budget is None:
        return episode_order(cfg, shortest, world_size, what, items)
    block = int(cfg.block_size)
    if budget < sides * block:
        raise ConfigError(f"batch_tokens {budget} is smaller than one {items[:-1]} ({sides} rows of block_size "
                          f"{block}); set batch_tokens >= {sides * block}")
    _check_budget_settings(cfg)
    ids = eligible_ids(shortest, cfg.episode_min_tokens)
    widths = np.minimum(lengths.max(axis=1)[ids], block)
    return TokenBudgetOrder(ids, widths, budget=budget, world_size=world_size, seed=cfg.epoch_seed,
                            shuffle=cfg.epoch_shuffle, what=what, items=items, rows_per_item=sides)
