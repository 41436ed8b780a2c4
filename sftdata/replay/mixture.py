"""``sftdata replay-order MIX``: the (member, episode) pairs of a mixture's epoch or step.

The order is ``sftdata.store.mixture.mixture_order``, the call the loader makes, so a
replay is what the loader did. Each line gains a ``dataset`` column, the member's name;
``episode``, ``shard`` and ``record`` are the member's own (as ``replay-order`` on that
member folder prints them). Members that are packed list the segments of each row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..order.audit import AuditCheck, check_audit
from ..order.config import LoaderConfig
from ..order.mixture import MixtureOrder
from ..store.format import ROW_KINDS
from ..store.mixture import OpenedMixture, mixture_order, open_mixture
from ..store.rows import ROW_ID_COLUMN, ROW_ITEMS, RowSplit
from ..store.shard import split_segments
from .dataset import Replay, epoch_head, not_in_epoch

STEP_COLUMNS = ("step", "rank", "slot", "epoch", "position", "dataset", "episode", "shard", "length", "record")
EPOCH_COLUMNS = ("epoch", "position", "dataset", "episode", "shard", "length", "record", "step", "rank", "slot")
PACKED_STEP_COLUMNS = ("step", "rank", "slot", "epoch", "position", "dataset", "row", "segment", "episode",
                       "episode_start", "length", "prefix", "record")
PACKED_EPOCH_COLUMNS = ("epoch", "position", "dataset", "row", "segment", "episode", "episode_start", "length",
                        "prefix", "record", "step", "rank", "slot")


def replay_mixture(path: str | Path, cfg: LoaderConfig, *, split: str = "train", epoch: int | None = None,
                   step: int | None = None, rank: int | None = None, world_size: int = 1,
                   head: int | None = None) -> Replay:
    """The items of global batch ``step`` (all ranks, or ``rank``) of a mixture, or else
    the full order of ``epoch`` (default 0) with the step and rank that train each."""
    if head is not None and head < 0:
        raise UsageError(f"--head must be >= 0, got {head}")
    if world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {world_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise UsageError(f"--rank {rank} is outside 0..{world_size - 1} (--world-size {world_size})")
    om = open_mixture(path, token_dtype=cfg.token_dtype)
    cfg = cfg.replace(epoch_seed=om.mixture.seed)
    o = mixture_order(cfg, om, split, world_size)
    g, bs = o.global_batch, o.batch_size
    if step is not None:
        if step < 0:
            raise UsageError(f"--step must be >= 0 (0 = the first batch of training), got {step}")
        ids = o.step_ids(step, rank)
        slots = o.slots(rank)
        ep, pos = o.step_positions(step, rank)
        if epoch is not None and epoch not in set(ep.tolist()):
            raise not_in_epoch(o, step, epoch)
        epoch = o.epoch_of_step(step)
        cols = {"step": np.full(ids.shape, step, dtype=np.int64), "rank": slots // bs, "slot": slots % bs,
                "epoch": ep, "position": pos}
    else:
        epoch, order, _, _ = epoch_head(o, epoch, None)
        ids = np.asarray(order, dtype=np.int64)
        p = np.arange(ids.shape[0], dtype=np.int64)
        if o.drop_last:
            trained = p < o.batches_in_epoch(epoch) * g
            stp = np.where(trained, o.first_step_of_epoch(epoch) + p // g, -1)
            slot = np.where(trained, p % g, -1)
        else:
            gp = o.epoch_start(epoch) + p
            stp, slot = gp // g, gp % g
        cols = {"epoch": np.full(p.shape, epoch, dtype=np.int64), "position": p, "step": stp,
                "rank": np.where(slot >= 0, slot // bs, -1), "slot": np.where(slot >= 0, slot % bs, -1)}
    member, local = o.locate(ids)
    cols["dataset"] = member
    items = "episodes"
    if om.kind == "packed":
        cols, shard_names = _packed_columns(om, split, cols, member, local), []
        names = PACKED_STEP_COLUMNS if step is not None else PACKED_EPOCH_COLUMNS
    elif om.kind in ROW_KINDS:  # pairs, KTO rows, RL prompts: each row's id, shard, tokens and record
        shard_names = _row_columns(om, split, cols, member, local)
        name = ROW_ID_COLUMN[om.kind]
        names = tuple(name if c == "episode" else c for c in (STEP_COLUMNS if step is not None else EPOCH_COLUMNS))
        items = ROW_ITEMS[om.kind]
    else:
        shard_names = _episode_columns(om, split, cols, member, local)
        names = STEP_COLUMNS if step is not None else EPOCH_COLUMNS
    total = cols["dataset"].shape[0]
    k = total if head is None else min(int(head), total)
    cols = {c: np.asarray(cols[c][:k], dtype=np.int64) for c in names}
    num_items = sum(ds.split(split).num_items // ds.entries for ds in om.datasets)
    return Replay(str(path), split, "epoch", o.seed, o.shuffle, o.drop_last, bs, world_size, cfg.episode_min_tokens,
                  num_items, o.epoch_size(epoch), epoch, step, rank, total, cols, shard_names,
                  dataset_names=om.names, items=items)


def _episode_columns(om: OpenedMixture, split: str, cols: dict, member: np.ndarray, local: np.ndarray) -> list[str]:
    """Add episode, shard (an index into the returned names), length and record."""
    n = member.shape[0]
    shard, length, record = (np.full(n, -1, dtype=np.int64) for _ in range(3))
    shard_names: list[str] = []
    for i, ds in enumerate(om.datasets):
        sel = member == i
        sp = ds.split(split)
        ids = local[sel]
        sh = sp.shard_of(ids)
        shard[sel] = len(shard_names) + sh
        length[sel] = sp.lengths[ids]
        rec = np.full(ids.shape, -1, dtype=np.int64)
        for si, s in enumerate(sp.shards):
            if s.sources is not None:
                here = sh == si
                rec[here] = np.asarray(s.sources, dtype=np.int64)[ids[here] - sp.item_offsets[si]]
        record[sel] = rec
        shard_names += [s.name for s in sp.shards]
    cols.update(episode=local, shard=shard, length=length, record=record)
    return shard_names


def _row_columns(om: OpenedMixture, split: str, cols: dict, member: np.ndarray, local: np.ndarray) -> list[str]:
    """Add the row's id (pair, row, prompt), shard, length (every part) and record."""
    n = member.shape[0]
    shard, length, record = (np.full(n, -1, dtype=np.int64) for _ in range(3))
    shard_names: list[str] = []
    for i, ds in enumerate(om.datasets):
        sel = member == i
        rs = RowSplit(ds.kind, ds.split(split))
        ids = local[sel]
        shard[sel] = len(shard_names) + rs.split.shard_of(ids * rs.entries)
        length[sel] = rs.part_lengths[ids].sum(axis=1) if ids.size else 0
        if rs.records is not None:
            record[sel] = rs.records[ids]
        shard_names += [s.name for s in rs.split.shards]
    cols.update({ROW_ID_COLUMN[om.kind]: local, "shard": shard, "length": length, "record": record})
    return shard_names


def _packed_columns(om: OpenedMixture, split: str, cols: dict, member: np.ndarray, local: np.ndarray) -> dict:
    """One line per segment of every row, with the member's source episode and record."""
    per_row = np.zeros(member.shape[0], dtype=np.int64)
    segs = [split_segments(ds.split(split)) for ds in om.datasets]
    for i, seg in enumerate(segs):
        sel = member == i
        rows = local[sel]
        per_row[sel] = np.searchsorted(seg.row, rows, "right") - np.searchsorted(seg.row, rows, "left")
    where = np.repeat(np.arange(member.shape[0]), per_row)  # the index of each segment's row
    out = {k: v[where] for k, v in cols.items()}
    out["row"] = local[where]
    out["segment"] = np.arange(where.size) - np.searchsorted(where, where, side="left")
    fields = ("episode", "episode_start", "length", "prefix", "source")
    got = {f: np.empty(where.size, dtype=np.int64) for f in fields}
    for i, seg in enumerate(segs):
        sel = np.flatnonzero(member[where] == i)
        if sel.size == 0:
            continue
        rows = local[where[sel]]
        first = np.flatnonzero(np.r_[True, where[sel][1:] != where[sel][:-1]])  # the first segment of each row
        s = seg.of_rows(rows[first])  # the segments of those rows, in that order
        for f in fields:
            got[f][sel] = getattr(s, f)
    out.update(episode=got["episode"], episode_start=got["episode_start"], length=got["length"],
               prefix=got["prefix"], record=got["source"])
    return out


def check_mixture_audit(path: str | Path, cfg: LoaderConfig, log_path: str | Path, *, split: str = "train",
                        world_size: int = 1) -> AuditCheck:
    """Compare an audit log's ``epoch_start`` lines with the mixture's replayed order."""
    om = open_mixture(path, token_dtype=cfg.token_dtype)
    o: MixtureOrder = mixture_order(cfg, om, split, world_size)
    return check_audit(log_path, o, split)
