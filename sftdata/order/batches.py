"""The training order: which item ids are in step N on rank R (docs/ARCHITECTURE.md §4).

Pure and I/O-free. The loader and ``sftdata replay-order`` both call ``BatchOrder``;
nothing else decides the order. It is generic over *items* (episodes of an episode
dataset, rows of a packed dataset, windows of a token stream): it takes their ids and
lengths and never looks at tokens. ``episode_order`` and ``row_order`` build the order
of a split from the loader's settings: the one constructor call the loader and
``replay-order`` share.

Epoch mode (``sampling="epoch"``)
---------------------------------
Eligible items are the ids whose length is >= ``min_length``. Epoch ``e`` visits them in
the order ``ids[RandomState(seed + e).permutation(n)]`` (``ids`` as is without shuffle),
so with nothing filtered the order is the documented
``RandomState(seed + epoch).permutation(num_episodes)``.

``step`` is the 0-based global count of batches since the start of training (what a
training loop calls its iteration). A *global batch* holds ``batch_size * world_size``
items; rank ``r`` takes slots ``[r * batch_size, (r + 1) * batch_size)`` of it, so the
ranks together see exactly the single-process batch.

- ``drop_last=True``: epoch ``e`` has ``n // G`` batches (G = global batch); the last
  ``n % G`` items of each epoch order are not trained in that epoch.
- ``drop_last=False``: batches are consecutive slices of the endless concatenation of
  the epoch orders. Every item appears exactly once per epoch, every batch is full,
  and a batch that reaches the end of epoch ``e`` is completed by the first items of
  epoch ``e + 1`` (which then continues after them)::

      n = 5, G = 2     epoch 0: a b c d e      epoch 1: C A E B D
      step:            0:[a b] 1:[c d] 2:[e C] 3:[A E] 4:[B D] ...

  The epoch *of a step* is the epoch of its first item.

One pass (``one_pass=True``, packed rows)
-----------------------------------------
Only epoch 0 is trained: ``steps_total`` is ``batches_in_epoch(0)``, a step past it is
an error, and with ``drop_last=False`` the slots of the last batch beyond the epoch
hold ``-1`` (a padding row) instead of the first items of epoch 1.

Resume on another layout (``origin``)
-------------------------------------
A run resumed with another ``world_size`` or ``batch_size`` continues from the position
its saved step had reached: ``BatchOrder(..., origin=old.origin_at(step))`` makes global
batch ``step`` start at that (epoch, position) and later batches consecutive slices of
the same epoch orders, ``G_new`` items each, so no item is repeated or skipped. With
the same global batch ``G`` this is exactly the uninterrupted order. With drop_last the
epoch of the origin keeps ``(n - position) // G_new`` batches (its tail shorter than one
batch is dropped as always)::

    n = 10, G = 4 for steps 0..1, then G = 3 from step 2 (drop_last=false)
    epoch 0: a b c d e f g h i j    step 0:[a b c d] 1:[e f g h] | 2:[i j A] 3:[B C D] ...

Steps before the origin belong to the earlier layout: this order refuses them.

Random mode (``sampling="random"``)
-----------------------------------
Uniform with replacement: step ``N`` draws ``G`` indices with
``np.random.default_rng([seed, N]).integers(0, n, G)``. Every step is computable on its
own, so a run is reproducible, resumable and replayable without replaying earlier steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError, UsageError

SAMPLING_MODES = ("epoch", "random")
MAX_SEED = 2**32 - 1  # RandomState accepts 0 .. 2**32 - 1
DEFAULT_SEED = 1337  # of the train/val split, bfd packing and the epoch order, unless a seed is given


def eligible_ids(lengths: np.ndarray, min_length: int) -> np.ndarray:
    """Ids (ascending int64) of the items whose length is >= ``min_length``."""
    return np.flatnonzero(np.asarray(lengths) >= int(min_length)).astype(np.int64, copy=False)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """``RandomState(seed + epoch).permutation(n)``, the documented epoch shuffle."""
    s = int(seed) + int(epoch)
    if not 0 <= s <= MAX_SEED:
        raise ConfigError(f"epoch seed {seed} + epoch {epoch} = {s} is outside 0..{MAX_SEED} "
                          f"(numpy RandomState); choose a smaller epoch_seed")
    return np.random.RandomState(s).permutation(n)


def random_draws(seed: int, step: int, n: int, count: int) -> np.ndarray:
    """``count`` uniform indices in ``[0, n)`` for ``step``: ``default_rng([seed, step])``."""
    return np.random.default_rng([int(seed), int(step)]).integers(0, n, size=count, dtype=np.int64)


class OrderSettings(Protocol):
    """The settings an order is built from (``sftdata.order.config.LoaderConfig`` has them)."""

    batch_size: int
    epoch_seed: int
    epoch_shuffle: bool
    epoch_drop_last: bool
    batch_sampling_mode: str | None
    episode_min_tokens: int


@dataclass(frozen=True)
class Origin:
    """Where an order taken over after a resize starts: global batch ``step`` begins at
    ``position`` of epoch ``epoch``'s order (random mode: ``epoch`` = ``position`` = 0)."""

    step: int
    epoch: int
    position: int

    def as_list(self) -> list[int]:
        return [self.step, self.epoch, self.position]

    @classmethod
    def from_value(cls, value, what: str) -> Origin:
        """From the ``[step, epoch, position]`` a loader state holds."""
        if (not isinstance(value, (list, tuple)) or len(value) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
            raise ConfigError(f"{what}: a resume origin is [step, epoch, position], integers >= 0, got {value!r}")
        return cls(*value)


@dataclass(frozen=True)
class StepEvent:
    """An epoch boundary reached by a global batch: ``kind`` is "epoch_start" or
    "epoch_complete"; ``items_seen`` counts the items of that epoch that were trained."""

    kind: str
    epoch: int
    items_seen: int = 0


@runtime_checkable
class Order(Protocol):
    """What every training order answers, whatever decides its batches: ``BatchOrder``
    (``batch_size`` items a step), ``budget.TokenBudgetOrder`` (items up to a token budget
    a step) and ``mixture.MixtureOrder`` (several datasets at weights). The loader, the
    samplers, ``replay-order`` and the audit log ask only these, so one order cannot
    answer differently for them."""

    sampling: str  # "epoch" | "random"
    one_pass: bool  # a one-pass order ends after its first epoch (packed rows)
    drop_last: bool  # the last partial batch of an epoch is not trained

    @property
    def n(self) -> int: ...  # eligible items of an epoch (of the first epoch, where epochs differ)
    @property
    def steps_total(self) -> int | None: ...  # the steps of a one-pass order, None for an endless one
    def epoch_size(self, epoch: int) -> int: ...
    def epoch_order(self, epoch: int) -> np.ndarray: ...
    def batches_in_epoch(self, epoch: int) -> int: ...
    def first_step_of_epoch(self, epoch: int) -> int: ...
    def epoch_of_step(self, step: int) -> int: ...
    def step_ids(self, step: int, rank: int | None = None) -> np.ndarray: ...
    def step_events(self, step: int) -> list[StepEvent]: ...


class BatchOrder:
    """The order of one split. Memoises the last two epoch orders (a batch spans at most
    the end of one and the start of the next when the batch is smaller than the epoch).

    ``ids`` are the eligible item ids, or a count ``n`` for the ids ``0 .. n-1`` (never
    materialised in random mode, so a token stream of billions of windows costs nothing).

    >>> o = BatchOrder(np.arange(5), batch_size=2, seed=0, drop_last=False)
    >>> o.step_ids(2).tolist() == [o.epoch_order(0)[4], o.epoch_order(1)[0]]
    True
    """

    def __init__(self, ids: np.ndarray | int, *, batch_size: int, world_size: int = 1, seed: int = DEFAULT_SEED,
                 shuffle: bool = True, drop_last: bool = True, sampling: str = "epoch", one_pass: bool = False,
                 what: str = "split", items: str = "items", origin: Origin | None = None):
        self._args = dict(ids=ids, batch_size=batch_size, world_size=world_size, seed=seed, shuffle=shuffle,
                          drop_last=drop_last, sampling=sampling, one_pass=one_pass, what=what, items=items)
        if isinstance(ids, (int, np.integer)):
            self._ids, self._n = None, int(ids)
        else:
            self._ids = np.asarray(ids, dtype=np.int64)
            self._n = int(self._ids.shape[0])
        self.batch_size = int(batch_size)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.sampling = sampling
        self.one_pass = bool(one_pass)
        self.what = what
        self.items = items
        if sampling not in SAMPLING_MODES:
            raise ConfigError(f"batch_sampling_mode {sampling!r} is not valid; choose one of: "
                              f"{', '.join(SAMPLING_MODES)}")
        if self.one_pass and sampling != "epoch":
            raise ConfigError(f"{what}: a one-pass order needs batch_sampling_mode=epoch, not {sampling!r}")
        if self.batch_size < 1 or self.world_size < 1:
            raise ConfigError(f"batch_size ({batch_size}) and world_size ({world_size}) must be >= 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed {seed} is outside 0..{MAX_SEED}")
        if self.n == 0:
            raise ConfigError(f"{what} has no eligible item to train on (every one is shorter than the "
                              f"minimum length, or the split is empty); lower episode_min_tokens or "
                              f"check the dataset")
        if sampling == "epoch" and self.drop_last and self.n < self.global_batch:
            raise ConfigError(
                f"{what} has {self.n} eligible items, fewer than one global batch of {self.global_batch} "
                f"(batch_size {self.batch_size} x world_size {self.world_size}), so with epoch_drop_last=true "
                f"an epoch has no batch; set epoch_drop_last=false (a batch then continues into the next "
                f"epoch) or lower batch_size")
        self._cache: dict[int, np.ndarray] = {}
        self.origin = self._check_origin(origin)
        s0, e0, p0 = (self.origin.step, self.origin.epoch, self.origin.position) if self.origin else (0, 0, 0)
        if sampling == "epoch" and self.drop_last and self.n - p0 < self.global_batch:
            e0, p0 = e0 + 1, 0  # the rest of that epoch is shorter than one batch: dropped
        self._s0, self._e0, self._p0 = s0, e0, p0

    def _check_origin(self, origin: Origin | None) -> Origin | None:
        if origin is None:
            return None
        if not isinstance(origin, Origin) or min(origin.step, origin.epoch, origin.position) < 0:
            raise ConfigError(f"{self.what}: a resume origin needs step, epoch and position >= 0, got {origin!r}")
        if origin.position >= self.n:
            raise ConfigError(f"{self.what}: resume position {origin.position} is outside the {self.n} "
                              f"eligible {self.items} of an epoch; the state belongs to another dataset")
        return origin

    def relayout(self, *, batch_size: int | None = None, world_size: int | None = None,
                 origin: Origin | None = None) -> BatchOrder:
        """The same order of the same items with another layout and origin."""
        args = dict(self._args)
        if batch_size is not None:
            args["batch_size"] = batch_size
        if world_size is not None:
            args["world_size"] = world_size
        return BatchOrder(**args, origin=origin)

    def origin_at(self, step: int) -> Origin:
        """Where global batch ``step`` of this order starts: the origin of an order that
        takes over at ``step`` with another layout (``step`` may be the end of a pass)."""
        check_step(step)
        self._check_started(step)
        if self.sampling != "epoch":
            return Origin(int(step), 0, 0)
        total = self.steps_total
        if total is not None and step >= total:
            return Origin(int(step), 1, 0)  # the one pass is over: nothing is left for any layout
        epochs, pos = self.step_positions(step, 0)
        return Origin(int(step), int(epochs[0]), int(pos[0]))

    # -- sizes ------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._n

    @property
    def ids(self) -> np.ndarray:
        """The eligible item ids, ascending (int64)."""
        return np.arange(self._n, dtype=np.int64) if self._ids is None else self._ids

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def epoch_size(self, epoch: int) -> int:
        """Items of ``epoch`` (every epoch holds all of them; a mixture's epochs may differ)."""
        return self.n

    @property
    def steps_total(self) -> int | None:
        """Global batches of a one-pass order; None for an endless one."""
        if not self.one_pass:
            return None
        return self.first_step_of_epoch(1) if self._e0 == 0 else self._s0

    def _check_epoch_mode(self, what: str) -> None:
        if self.sampling != "epoch":
            raise UsageError(f"{what} needs batch_sampling_mode=epoch; random sampling has no epochs")

    def batches_in_epoch(self, epoch: int) -> int:
        """Global batches of this order that start in ``epoch`` (constant with drop_last;
        with drop_last=false ``ceil(n/G)`` or one less, depending on the epoch). After a
        resume the epoch of the origin counts only the batches from the origin on."""
        self._check_epoch_mode("batches_in_epoch")
        return self.first_step_of_epoch(epoch + 1) - self.first_step_of_epoch(epoch)

    def first_step_of_epoch(self, epoch: int) -> int:
        """The first step of this order whose first item is in ``epoch``."""
        self._check_epoch_mode("first_step_of_epoch")
        g, n, s0, e0, p0 = self.global_batch, self.n, self._s0, self._e0, self._p0
        if epoch < e0:
            raise UsageError(f"epoch {epoch} was trained before the resume at step {s0} (with another layout)")
        if self.drop_last:
            if epoch == e0:
                return s0
            return s0 + (n - p0) // g + (epoch - e0 - 1) * (n // g)
        return s0 + max(0, -(-(epoch * n - (e0 * n + p0)) // g))

    def epoch_of_step(self, step: int) -> int:
        """Epoch of the first item of global batch ``step``."""
        self._check_epoch_mode("epoch_of_step")
        check_step(step)
        self._check_started(step)
        g, n, k = self.global_batch, self.n, step - self._s0
        if self.drop_last:
            first = (n - self._p0) // g
            return self._e0 if k < first else self._e0 + 1 + (k - first) // (n // g)
        return (self._e0 * n + self._p0 + k * g) // n

    # -- the order --------------------------------------------------------------------
    def epoch_order(self, epoch: int) -> np.ndarray:
        """Item ids of epoch ``epoch`` in visiting order (read-only array)."""
        self._check_epoch_mode("epoch_order")
        epoch = int(epoch)
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, got {epoch}")
        got = self._cache.get(epoch)
        if got is None:
            if self.shuffle:
                perm = epoch_permutation(self.n, self.seed, epoch)
                got = perm if self._ids is None else self._ids[perm]
            else:
                got = self.ids
            got = got.view()
            got.flags.writeable = False
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = got
        return got

    def slots(self, rank: int | None) -> np.ndarray:
        """Slots of the global batch that ``rank`` trains (None = all, in rank order)."""
        return rank_slots(rank, self.batch_size, self.world_size)

    def step_positions(self, step: int, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, position within that epoch's order) of every slot of ``step`` for
        ``rank`` (None = the whole global batch, all ranks in rank order)."""
        self._check_epoch_mode("step_positions")
        self._check_pass(step)
        g, n = self.global_batch, self.n
        slots = self.slots(rank)
        k = step - self._s0
        if self.drop_last:
            first = (n - self._p0) // g
            if k < first:
                return np.full(slots.shape, self._e0, dtype=np.int64), self._p0 + k * g + slots
            e, j = divmod(k - first, n // g)
            return np.full(slots.shape, self._e0 + 1 + e, dtype=np.int64), j * g + slots
        p = self._e0 * n + self._p0 + k * g + slots
        return p // n, p % n

    def locate(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step, slot of the global batch) that trains each position of ``epoch``'s
        order; -1 where this order does not train it (a tail dropped by drop_last, or a
        position before the origin of a resumed order)."""
        self._check_epoch_mode("locate")
        g, n, s0, e0, p0 = self.global_batch, self.n, self._s0, self._e0, self._p0
        p = np.asarray(positions, dtype=np.int64)
        if self.drop_last:
            if epoch < e0:
                rel = np.full(p.shape, -1, dtype=np.int64)
            elif epoch == e0:
                rel = np.where((p >= p0) & (p - p0 < (n - p0) // g * g), p - p0, -1)
            else:
                rel = np.where(p < n // g * g, p, -1)
            first = self.first_step_of_epoch(epoch) if epoch >= e0 else 0
            ok = rel >= 0
            return np.where(ok, first + rel // g, -1), np.where(ok, rel % g, -1)
        rel = epoch * n + p - (e0 * n + p0)
        ok = rel >= 0
        if self.one_pass:
            ok &= epoch == 0
        return np.where(ok, s0 + rel // g, -1), np.where(ok, rel % g, -1)

    def step_ids(self, step: int, rank: int | None = None) -> np.ndarray:
        """The item ids of global batch ``step`` for ``rank`` (None = all ranks); in a
        one-pass order, -1 for a slot past the end of the pass."""
        if self.sampling == "random":
            check_step(step)
            self._check_started(step)
            draws = random_draws(self.seed, step, self.n, self.global_batch)[self.slots(rank)]
            return draws if self._ids is None else self._ids[draws]
        epochs, pos = self.step_positions(step, rank)
        out = np.empty(pos.shape, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = -1 if self.one_pass and e > 0 else self.epoch_order(int(e))[pos[sel]]
        return out

    def step_events(self, step: int) -> list[StepEvent]:
        """Epoch boundaries reached by global batch ``step``, in order (empty in random
        mode). An epoch starts with the batch holding its first item and completes with
        the batch holding its last trained item."""
        if self.sampling != "epoch":
            return []
        self._check_pass(step)
        g, n = self.global_batch, self.n
        events: list[StepEvent] = []
        if self.drop_last:
            e = self.epoch_of_step(step)
            first = self.first_step_of_epoch(e)
            count = self.first_step_of_epoch(e + 1) - first
            if step == first and (e > self._e0 or self._p0 == 0):
                events.append(StepEvent("epoch_start", e))
            if step == first + count - 1:
                events.append(StepEvent("epoch_complete", e, (self._p0 if e == self._e0 else 0) + count * g))
            return events
        lo = self._e0 * n + self._p0 + (step - self._s0) * g
        hi = lo + g  # global positions [lo, hi)
        for e in range(lo // n, (hi - 1) // n + 1):
            start, end = e * n, (e + 1) * n
            if lo <= start < hi:
                events.append(StepEvent("epoch_start", e))
            if lo < end <= hi:
                events.append(StepEvent("epoch_complete", e, n))
        return [ev for ev in events if ev.epoch == 0] if self.one_pass else events

    def _check_started(self, step: int) -> None:
        if step < self._s0:
            raise UsageError(f"step {step} was trained before the resume at step {self._s0} (with another layout); "
                             f"this order starts there")

    def _check_pass(self, step: int) -> None:
        check_step(step)
        self._check_started(step)
        total = self.steps_total
        if total is not None and step >= total:
            raise UsageError(f"step {step} is outside the one pass over the {self.items} (steps 0..{total - 1})")


def episode_order(cfg: OrderSettings, lengths: np.ndarray, world_size: int = 1, what: str = "split",
                  items: str = "episodes") -> BatchOrder:
    """The order of an episode split: episodes of at least ``episode_min_tokens`` tokens,
    ``batch_sampling_mode`` (default epoch), endless epochs."""
    return BatchOrder(eligible_ids(lengths, cfg.episode_min_tokens), batch_size=cfg.batch_size,
                      world_size=world_size, seed=cfg.epoch_seed, shuffle=cfg.epoch_shuffle,
                      drop_last=cfg.epoch_drop_last, sampling=cfg.batch_sampling_mode or "epoch", what=what,
                      items=items)


def row_order(cfg: OrderSettings, num_rows: int, world_size: int = 1, what: str = "split") -> BatchOrder:
    """The order of a packed split: every row, seeded epoch order, one pass (training
    ends when the loader ends)."""
    sampling = cfg.batch_sampling_mode or "epoch"
    if sampling != "epoch":
        raise ConfigError(f"a packed dataset is read once in epoch order (training ends when the loader ends); "
                          f"batch_sampling_mode={sampling!r} is not supported, leave it null or set it to epoch")
    return BatchOrder(int(num_rows), batch_size=cfg.batch_size, world_size=world_size, seed=cfg.epoch_seed,
                      shuffle=cfg.epoch_shuffle, drop_last=cfg.epoch_drop_last, one_pass=True, what=what,
                      items="rows")


def check_step(step: int) -> None:
    if int(step) < 0:
        raise UsageError(f"step must be >= 0 (0 = the first batch of training), got {step}")


def rank_slots(rank: int | None, batch_size: int, world_size: int) -> np.ndarray:
    """Slots of a global batch of ``batch_size x world_size`` that ``rank`` trains (None =
    all, in rank order): rank r holds slots ``r*batch_size .. (r+1)*batch_size - 1``."""
    if rank is None:
        return np.arange(batch_size * world_size, dtype=np.int64)
    if not 0 <= rank < world_size:
        raise UsageError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    return rank * batch_size + np.arange(batch_size, dtype=np.int64)
