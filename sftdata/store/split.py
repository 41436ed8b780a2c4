"""The shards of one split seen as one sequence of items with global ids: the episodes
of an episodes dataset, the rows of a packed one (``episodes.idx`` indexes either), and
the segments of a packed split's rows."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from ..errors import DatasetError
from ..packing import Segments
from .format import SEGMENTS_FILE, decode_segments
from .shard import Shard


class Split:
    """The shards of one split seen as one sequence of items with global ids.

    An item is an episode, or a row of a packed split (``packed``). Code that works on
    either kind says ``num_items`` / ``item(i)`` / ``item_offsets``; code for one kind
    says ``num_episodes`` / ``episode(i)`` or ``num_rows`` / ``row(i)``. The episode
    names on a packed split are the older spelling: they still work, with a
    ``DeprecationWarning``; the row names on an episodes split raise ``DatasetError``.
    """

    def __init__(self, name: str, shards: list[Shard], packed: bool = False):
        self.name = name
        self.shards = shards
        self.packed = packed
        counts = [s.num_items for s in shards]
        self.item_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_items = int(self.item_offsets[-1])
        if shards:
            self.starts = np.concatenate([s.index[:, 0] for s in shards]).astype(np.int64)
            self.lengths = np.concatenate([s.index[:, 1] for s in shards]).astype(np.int64)
        else:
            self.starts = np.empty(0, np.int64)
            self.lengths = np.empty(0, np.int64)
        self.has_mask = bool(shards) and all(s.mask is not None for s in shards)
        self.num_tokens = sum(s.num_tokens for s in shards)

    @property
    def what(self) -> str:
        """What one item is: "row" or "episode"."""
        return "row" if self.packed else "episode"

    @property
    def sources(self) -> np.ndarray | None:
        """Input record number of every episode (global order), or None when not stored."""
        if not self.shards or any(s.sources is None for s in self.shards):
            return None
        return np.concatenate([np.asarray(s.sources, dtype=np.int64) for s in self.shards])

    def shard_of(self, global_ids) -> np.ndarray:
        """Index of the shard holding each global item id."""
        return np.searchsorted(self.item_offsets, np.asarray(global_ids), side="right") - 1

    def locate(self, global_id: int) -> tuple[Shard, int]:
        gid = int(global_id)
        if not 0 <= gid < self.num_items:
            raise DatasetError(f"{self.what} {gid} does not exist in split {self.name!r}, which has "
                               f"{self.num_items} {self.what}s (ids 0..{self.num_items - 1})")
        si = int(self.shard_of(gid))
        return self.shards[si], gid - int(self.item_offsets[si])

    def item(self, global_id: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one item, at most ``limit`` tokens; views, no copy."""
        shard, local = self.locate(global_id)
        start, length = (int(v) for v in shard.index[local])
        n = length if limit is None else min(length, limit)
        toks = shard.tokens[start:start + n]
        mask = shard.mask[start:start + n] if shard.mask is not None else None
        return toks, mask

    # -- one kind's names
    @property
    def num_rows(self) -> int:
        """Rows of a packed split."""
        self._must_be_packed("num_rows")
        return self.num_items

    def row(self, global_id: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one row of a packed split; views, no copy."""
        self._must_be_packed("row(i)")
        return self.item(global_id)

    @property
    def num_episodes(self) -> int:
        """Episodes of an episodes split."""
        self._rows_named_episodes("num_episodes", "num_rows")
        return self.num_items

    def episode(self, global_id: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one episode, at most ``limit`` tokens; views, no copy."""
        self._rows_named_episodes("episode(i)", "row(i)")
        return self.item(global_id, limit)

    @property
    def episode_offsets(self) -> np.ndarray:
        """Older name of ``item_offsets``."""
        self._rows_named_episodes("episode_offsets", "item_offsets")
        return self.item_offsets

    def _must_be_packed(self, name: str) -> None:
        if not self.packed:
            raise DatasetError(f"split {self.name!r} holds episodes, not packed rows: use Split.num_episodes / "
                               f"Split.episode(i) (or num_items / item(i)) instead of Split.{name}")

    def _rows_named_episodes(self, old: str, new: str) -> None:
        if self.packed:
            warnings.warn(f"split {self.name!r} is packed: its items are rows; Split.{old} is the older name, "
                          f"use Split.{new}", DeprecationWarning, stacklevel=3)


def split_segments(split: Split) -> Segments:
    """All segments of a packed split, with global row ids."""
    parts = []
    for si, sh in enumerate(split.shards):
        if sh.segments is None:
            raise DatasetError(f"{sh.path / SEGMENTS_FILE} is missing; the packed dataset is incomplete. "
                               f"Re-create it with `sftdata pack`")
        seg = decode_segments(sh.segments)
        parts.append(replace(seg, row=seg.row + int(split.item_offsets[si])))
    return Segments.concat(parts)
