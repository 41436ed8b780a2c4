"""The training order of a mixture: which (member, item) pairs are in step N on rank R.

Pure and I/O-free, a function of the members' eligible items, the weights, ``by``, the
seed, the batch size and the world size (docs/MIXTURES.md). The loader and
``replay-order`` both build it with ``MixtureOrder``; it answers the questions
``BatchOrder`` (``batches``) answers, for epochs whose sizes may differ by rounding.

Member streams
--------------
Member ``i`` has ``n_i`` eligible items (episodes of at least ``episode_min_tokens``
tokens, or packed rows). Its *stream* is the endless concatenation of its passes; pass
``k`` is ``ids_i[RandomState([seed, i, k]).permutation(n_i)]`` (``ids_i`` as is without
shuffle). Epoch ``e`` takes the stream positions ``[S_i(e - 1), S_i(e))``, so a source
whose share is larger than itself is repeated (every item once per pass before any item
twice) and a larger one is subsampled, a different part each epoch, every item before
any twice.

Exact weights
-------------
``S_i(e)`` is the stream length through epoch ``e``, rounded to the nearest item:

- ``by="rows"``: ``S_i(e) = round((e + 1) * N * w_i)`` with ``N = sum(n_i)`` (an epoch
  holds as many items as the members together) and ``w_i`` the normalised weight, an
  exact fraction. Each member's count in every epoch is within one item of ``N * w_i``,
  and its count through any epoch is within half an item of the exact share.
- ``by="tokens"``: ``S_i(e)`` is the stream length whose tokens are nearest to
  ``(e + 1) * T * w_i`` with ``T`` the members' eligible tokens together: each member's
  tokens through any epoch are within half an item of its share.

Since ``S_i(e)`` depends on ``e`` alone, every epoch (and every step) is computed
directly, without replaying the epochs before it.

Interleaving and batches
------------------------
Epoch ``e`` lists member 0's items, then member 1's..., permuted by
``RandomState(seed + e).permutation(N_e)`` (no permutation without shuffle). A mixture
id is ``offset_i + local id`` (``offset_i``: the items of the members before ``i``), so
one int64 array carries both. Batches are consecutive slices of the epoch orders as in
``BatchOrder``: with ``drop_last`` the last ``N_e % G`` items of an epoch are not
trained; without, the orders are concatenated and a batch may span two epochs. Rank
``r`` takes slots ``[r * batch_size, (r + 1) * batch_size)`` of each global batch.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import ConfigError, UsageError
from .batches import MAX_SEED, StepEvent, check_step, epoch_permutation, rank_slots

PASS_CACHE = 8  # member passes kept (a batch spans at most two epochs of each member)


@dataclass(frozen=True)
class MemberItems:
    """What the order needs of one member's split: its eligible item ids (ascending),
    the tokens of each, and the number of items in the split (the id space)."""

    ids: np.ndarray
    tokens: np.ndarray
    size: int


class MixtureOrder:
    """The order of one split of a mixture (module docstring). Ids are mixture ids;
    ``locate`` splits them into (member, local id)."""

    sampling = "epoch"
    one_pass = False
    steps_total = None

    def __init__(self, members: list[MemberItems], shares: list[Fraction], *, by: str = "rows", batch_size: int,
                 world_size: int = 1, seed: int = 1337, shuffle: bool = True, drop_last: bool = True,
                 names: list[str] | None = None, what: str = "mixture", items: str = "episodes"):
        self.members = members
        self.shares = [Fraction(s) for s in shares]
        self.by = by
        self.batch_size, self.world_size = int(batch_size), int(world_size)
        self.seed, self.shuffle, self.drop_last = int(seed), bool(shuffle), bool(drop_last)
        self.names = list(names) if names is not None else [f"member {i}" for i in range(len(members))]
        self.what, self.items = what, items
        if self.batch_size < 1 or self.world_size < 1:
            raise ConfigError(f"batch_size ({batch_size}) and world_size ({world_size}) must be >= 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed {seed} is outside 0..{MAX_SEED}")
        if len(self.shares) != len(members) or not members:
            raise ConfigError(f"{what}: {len(members)} member(s) but {len(self.shares)} weight(s)")
        self.n_items = [int(m.ids.shape[0]) for m in members]
        for name, n in zip(self.names, self.n_items):
            if n == 0:
                raise ConfigError(f"{what}: member {name!r} has no eligible item to train on (every one is shorter "
                                  f"than the minimum length, or the split is empty); lower episode_min_tokens, or "
                                  f"leave that dataset out of the mixture")
        self.member_tokens = [int(np.asarray(m.tokens, dtype=np.int64).sum()) for m in members]
        if by == "tokens":
            for name, t in zip(self.names, self.member_tokens):
                if t == 0:
                    raise ConfigError(f"{what}: member {name!r} holds 0 tokens, so a share of tokens cannot be "
                                      f"drawn from it; mix by rows")
        elif by != "rows":
            raise ConfigError(f"{what}: by is {by!r}; it must be rows or tokens")
        self.offsets = np.concatenate([[0], np.cumsum([m.size for m in members])]).astype(np.int64)
        self.total_items, self.total_tokens = sum(self.n_items), sum(self.member_tokens)
        if self.drop_last and self.total_items < self.global_batch:
            raise ConfigError(
                f"{what} has {self.total_items} items per epoch, fewer than one global batch of {self.global_batch} "
                f"(batch_size {self.batch_size} x world_size {self.world_size}), so with epoch_drop_last=true an "
                f"epoch has no batch; set epoch_drop_last=false or lower batch_size")
        self._ends: dict[tuple[int, int], int] = {}
        self._passes: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._starts = [0]  # position of each epoch's first item in the concatenation of the epochs
        self._first_steps = [0]  # drop_last: the first step of each epoch
        self._cache: dict[int, np.ndarray] = {}

    # -- sizes ------------------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def n(self) -> int:
        """Items of epoch 0 (later epochs differ by rounding: ``epoch_size``)."""
        return self.epoch_size(0)

    def _pass(self, i: int, k: int) -> np.ndarray:
        """Local ids of pass ``k`` of member ``i``'s stream."""
        key = (i, k)
        got = self._passes.get(key)
        if got is None:
            ids = np.asarray(self.members[i].ids, dtype=np.int64)
            got = ids[np.random.RandomState([self.seed, i, k]).permutation(ids.shape[0])] if self.shuffle else ids
            self._passes[key] = got
            if len(self._passes) > PASS_CACHE:
                self._passes.popitem(last=False)
        else:
            self._passes.move_to_end(key)
        return got

    def stream_end(self, i: int, epoch: int) -> int:
        """``S_i(epoch)``: member ``i``'s stream positions used through ``epoch`` (0 before epoch 0)."""
        if epoch < 0:
            return 0
        key = (i, epoch)
        got = self._ends.get(key)
        if got is None:
            got = self._ends[key] = self._rows_end(i, epoch) if self.by == "rows" else self._tokens_end(i, epoch)
        return got

    def _rows_end(self, i: int, epoch: int) -> int:
        return math.floor((epoch + 1) * self.total_items * self.shares[i] + Fraction(1, 2))

    def _tokens_end(self, i: int, epoch: int) -> int:
        target = (epoch + 1) * self.total_tokens * self.shares[i]
        tot, n = self.member_tokens[i], self.n_items[i]
        k = math.floor(target / tot)
        rest = target - k * tot
        if rest == 0:
            return k * n
        ids = self._pass(i, k)
        prefix = np.cumsum(np.asarray(self.members[i].tokens, dtype=np.int64)[self._local_index(i, ids)])
        j = int(np.searchsorted(prefix, math.ceil(rest), side="left"))
        hi, lo = int(prefix[j]), int(prefix[j - 1]) if j else 0
        return k * n + j + (0 if hi - rest > rest - lo else 1)

    def _local_index(self, i: int, local_ids: np.ndarray) -> np.ndarray:
        """Index into member ``i``'s ``ids`` / ``tokens`` of the given local ids."""
        return np.searchsorted(np.asarray(self.members[i].ids, dtype=np.int64), local_ids)

    def member_counts(self, epoch: int) -> list[int]:
        """Items each member contributes to ``epoch``."""
        return [self.stream_end(i, epoch) - self.stream_end(i, epoch - 1) for i in range(len(self.members))]

    def epoch_start(self, epoch: int) -> int:
        """Position of the first item of ``epoch`` in the concatenation of the epoch orders."""
        return sum(self.stream_end(i, epoch - 1) for i in range(len(self.members)))

    def epoch_size(self, epoch: int) -> int:
        return sum(self.member_counts(epoch))

    def batches_in_epoch(self, epoch: int) -> int:
        """Global batches that start in ``epoch``."""
        if self.drop_last:
            return self.epoch_size(epoch) // self.global_batch
        return self.first_step_of_epoch(epoch + 1) - self.first_step_of_epoch(epoch)

    def first_step_of_epoch(self, epoch: int) -> int:
        g = self.global_batch
        if not self.drop_last:
            return -(-self.epoch_start(epoch) // g)
        while len(self._first_steps) <= epoch:
            e = len(self._first_steps) - 1
            self._first_steps.append(self._first_steps[-1] + self.epoch_size(e) // g)
        return self._first_steps[epoch]

    def epoch_of_step(self, step: int) -> int:
        """Epoch of the first item of global batch ``step``."""
        check_step(step)
        if self.drop_last:
            e = 0
            while self.first_step_of_epoch(e + 1) <= step:
                e += 1
            return e
        return self._epoch_of_position(step * self.global_batch)

    def _epoch_of_position(self, p: int) -> int:
        e = max(0, p // max(1, self.epoch_size(0)) - 1)  # epochs differ from epoch 0 by rounding: start near
        while e > 0 and self.epoch_start(e) > p:
            e -= 1
        while self.epoch_start(e + 1) <= p:
            e += 1
        return e

    # -- the order --------------------------------------------------------------------
    def member_items(self, i: int, epoch: int) -> np.ndarray:
        """Local ids member ``i`` contributes to ``epoch``, in stream order."""
        a, b = self.stream_end(i, epoch - 1), self.stream_end(i, epoch)
        n = self.n_items[i]
        parts = []
        for k in range(a // n, (b - 1) // n + 1 if b > a else a // n):
            lo, hi = max(a, k * n) - k * n, min(b, (k + 1) * n) - k * n
            parts.append(self._pass(i, k)[lo:hi])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Mixture ids of ``epoch`` in visiting order (read-only array)."""
        epoch = int(epoch)
        if epoch < 0:
            raise UsageError(f"epoch must be >= 0, got {epoch}")
        got = self._cache.get(epoch)
        if got is None:
            got = np.concatenate([self.offsets[i] + self.member_items(i, epoch) for i in range(len(self.members))])
            if self.shuffle:
                got = got[epoch_permutation(got.shape[0], self.seed, epoch)]
            got.flags.writeable = False
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = got
        return got

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(member index, local id) of mixture ids (-1, -1 for -1)."""
        ids = np.asarray(ids, dtype=np.int64)
        member = np.searchsorted(self.offsets, ids, side="right") - 1
        member = np.where(ids >= 0, member, -1)
        return member, np.where(ids >= 0, ids - self.offsets[np.maximum(member, 0)], -1)

    def slots(self, rank: int | None) -> np.ndarray:
        return rank_slots(rank, self.batch_size, self.world_size)

    def step_positions(self, step: int, rank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, position within that epoch's order) of every slot of ``step``."""
        check_step(step)
        slots = self.slots(rank)
        if self.drop_last:
            e = self.epoch_of_step(step)
            return np.full(slots.shape, e, dtype=np.int64), (step - self.first_step_of_epoch(e)) * self.global_batch + slots
        p = step * self.global_batch + slots
        first, last = self._epoch_of_position(int(p[0])), self._epoch_of_position(int(p[-1]))
        starts = np.array([self.epoch_start(e) for e in range(first, last + 2)], dtype=np.int64)
        k = np.searchsorted(starts, p, side="right") - 1
        return first + k, p - starts[k]

    def step_ids(self, step: int, rank: int | None = None) -> np.ndarray:
        epochs, pos = self.step_positions(step, rank)
        out = np.empty(pos.shape, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.epoch_order(int(e))[pos[sel]]
        return out

    def step_events(self, step: int) -> list[StepEvent]:
        """Epoch boundaries reached by global batch ``step``, in order."""
        check_step(step)
        g = self.global_batch
        if self.drop_last:
            e = self.epoch_of_step(step)
            k, per = step - self.first_step_of_epoch(e), self.batches_in_epoch(e)
            events = [StepEvent("epoch_start", e)] if k == 0 else []
            if k == per - 1:
                events.append(StepEvent("epoch_complete", e, per * g))
            return events
        lo, hi = step * g, (step + 1) * g
        events = []
        for e in range(self._epoch_of_position(lo), self._epoch_of_position(hi - 1) + 1):
            start, end = self.epoch_start(e), self.epoch_start(e + 1)
            if lo <= start < hi:
                events.append(StepEvent("epoch_start", e))
            if lo < end <= hi:
                events.append(StepEvent("epoch_complete", e, end - start))
        return events

    def realized(self, epoch: int) -> list[tuple[int, int]]:
        """(items, tokens) each member contributes to ``epoch``."""
        out = []
        for i, m in enumerate(self.members):
            local = self.member_items(i, epoch)
            tokens = int(np.asarray(m.tokens, dtype=np.int64)[self._local_index(i, local)].sum())
            out.append((int(local.shape[0]), tokens))
        return out
