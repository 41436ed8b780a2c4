"""The shards of one split seen as one sequence of episodes (packed: rows) with global ids."""

from __future__ import annotations

import numpy as np

from ..errors import DatasetError
from .shard import Shard


class Split:
    """The shards of one split seen as one sequence of episodes with global ids."""

    def __init__(self, name: str, shards: list[Shard]):
        self.name = name
        self.shards = shards
        counts = [s.num_episodes for s in shards]
        self.episode_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_episodes = int(self.episode_offsets[-1])
        if shards:
            self.starts = np.concatenate([s.episodes[:, 0] for s in shards]).astype(np.int64)
            self.lengths = np.concatenate([s.episodes[:, 1] for s in shards]).astype(np.int64)
        else:
            self.starts = np.empty(0, np.int64)
            self.lengths = np.empty(0, np.int64)
        self.has_mask = bool(shards) and all(s.mask is not None for s in shards)
        self.num_tokens = sum(s.num_tokens for s in shards)

    @property
    def sources(self) -> np.ndarray | None:
        """Input record number of every episode (global order), or None when not stored."""
        if not self.shards or any(s.sources is None for s in self.shards):
            return None
        return np.concatenate([np.asarray(s.sources, dtype=np.int64) for s in self.shards])

    def shard_of(self, global_ids) -> np.ndarray:
        """Index of the shard holding each global episode id."""
        return np.searchsorted(self.episode_offsets, np.asarray(global_ids), side="right") - 1

    def locate(self, global_id: int) -> tuple[Shard, int]:
        gid = int(global_id)
        if not 0 <= gid < self.num_episodes:
            raise DatasetError(f"episode {gid} does not exist in split {self.name!r}, which has "
                               f"{self.num_episodes} episodes (ids 0..{self.num_episodes - 1})")
        si = int(self.shard_of(gid))
        return self.shards[si], gid - int(self.episode_offsets[si])

    def episode(self, global_id: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (and mask, or None) of one episode, at most ``limit`` tokens; views, no copy."""
        shard, local = self.locate(global_id)
        start, length = (int(v) for v in shard.episodes[local])
        n = length if limit is None else min(length, limit)
        toks = shard.tokens[start:start + n]
        mask = shard.mask[start:start + n] if shard.mask is not None else None
        return toks, mask
