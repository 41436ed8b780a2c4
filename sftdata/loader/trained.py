"""Trained targets per item (episode row, packed row, token window), so that the count of
a whole optimizer step is a pure function of the order: every rank sums the items of
every rank's micro-batches itself, before consuming them, without communication::

    optimizer step k, grad_accum A, world_size R:
      micro-steps kA .. kA+A-1, each a global batch of batch_size x R items
      N = sum(trained[item] for every item of those global batches)      (the same on every rank)
      loss = sum over this rank's micro-batches of sum(token losses) / N  -> all-reduce(sum) of gradients

The per-item counts equal what ``Batch.trained_tokens`` counts in the rows the loader
builds (the mask's sum; without a mask the targets up to the episode's EOS): a test
checks both agree.
"""

from __future__ import annotations

import numpy as np

from ..ranges import trained_per_episode
from ..store import split_segments
from .episodes import EpisodeSource
from .packed import PackedSource


def item_trained(source, split: str) -> np.ndarray | None:
    """Trained targets of each item id of ``split`` in its rows (int64, by item id), or
    None when every item trains the same ``block_size`` targets (token windows) or the
    source is not one this module knows (the loader then counts built batches)."""
    if isinstance(source, EpisodeSource):
        return _episode_trained(source, split)
    if isinstance(source, PackedSource):
        return _row_trained(source, split)
    return None


def _episode_trained(src: EpisodeSource, split: str) -> np.ndarray:
    sp = src.ds.split(split)
    keep = np.minimum(sp.lengths.astype(np.int64), src.cfg.block_size + 1)
    if not src.mask_enabled(split):
        return np.maximum(keep - 1, 0)  # row targets 1 .. keep-1: up to and with the episode's EOS
    out = np.zeros(sp.num_episodes, np.int64)
    for si, sh in enumerate(sp.shards):
        a, b = int(sp.item_offsets[si]), int(sp.item_offsets[si + 1])
        starts = sh.index[:, 0].astype(np.int64)
        k = keep[a:b]
        ok = np.flatnonzero(k > 1)
        if ok.size:
            counts, _ = trained_per_episode(sh.mask, starts[ok] + 1, starts[ok] + k[ok])
            out[a + ok] = counts
    return out


def _row_trained(src: PackedSource, split: str) -> np.ndarray:
    sp = src.ds.split(split)
    L = src.row_len
    if not src.cfg.use_loss_mask:  # every target inside a segment: a segment of l tokens has l - 1
        seg = split_segments(sp)
        return np.bincount(seg.row, weights=seg.length - 1, minlength=sp.num_rows).astype(np.int64)
    out = np.zeros(sp.num_rows, np.int64)
    for si, sh in enumerate(sp.shards):
        a, b = int(sp.item_offsets[si]), int(sp.item_offsets[si + 1])
        if b > a:
            starts = np.arange(b - a, dtype=np.int64) * L
            out[a:b], _ = trained_per_episode(sh.mask, starts + 1, starts + L)
    return out
