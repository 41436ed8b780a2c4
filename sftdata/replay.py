"""What ``sftdata replay-order`` computes: the episodes of an epoch or of a training step.

The order comes from :class:`sftdata.order.BatchOrder`, the function the loader calls,
built from the same config fields, so a replay is what the loader did. Vectorised: an
epoch of 10 million episodes takes about a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .audit import AuditCheck, check_audit
from .config import LoaderConfig
from .errors import DatasetError, UsageError
from .episode_loader import episode_order
from .store import Split, has_episode_index, open_dataset

STEP_COLUMNS = ("step", "rank", "slot", "epoch", "position", "episode", "shard", "length", "record")
EPOCH_COLUMNS = ("epoch", "position", "episode", "shard", "length", "record", "step", "rank", "slot")


@dataclass
class Replay:
    dataset: str
    split: str
    sampling: str
    seed: int
    shuffle: bool
    drop_last: bool
    batch_size: int
    world_size: int
    episode_min_tokens: int
    num_episodes: int  # in the split
    num_eligible: int
    epoch: int | None  # the epoch listed (epoch listing), or the epoch of the step's first item
    step: int | None
    rank: int | None
    total_rows: int  # rows before --head
    columns: dict = field(default_factory=dict)  # name -> int64 array (-1 = none), shard -> names

    def rows(self) -> list[dict]:
        names = list(self.columns)
        cols = [self.columns[k].tolist() for k in names]
        return [{k: (None if (v == -1 and k != "shard") else v) for k, v in zip(names, r)} for r in zip(*cols)]

    def as_dict(self) -> dict:
        meta = {k: getattr(self, k) for k in ("dataset", "split", "sampling", "seed", "shuffle", "drop_last",
                                              "batch_size", "world_size", "episode_min_tokens", "num_episodes",
                                              "num_eligible", "epoch", "step", "rank", "total_rows")}
        return {**meta, "rows": self.rows()}


def _open(dataset_dir, cfg: LoaderConfig, split: str) -> Split:
    root = Path(dataset_dir)
    if root.is_dir() and not has_episode_index(root, "train"):
        raise DatasetError(f"{root} has no episode index (train/shard_*/episodes.idx or train/episodes.idx): "
                           f"a token-stream dataset has no episode order to replay")
    return open_dataset(root, token_dtype=cfg.token_dtype).split(split)


def replay_order(dataset_dir: str | Path, cfg: LoaderConfig, *, split: str = "train", epoch: int | None = None,
                 step: int | None = None, rank: int | None = None, world_size: int = 1,
                 head: int | None = None) -> Replay:
    """The episodes of global batch ``step`` (all ranks, or ``rank``), or else the full
    order of ``epoch`` (default 0) with the step and rank that train each position.
    With both, ``epoch`` must be an epoch the step's batch reaches."""
    if head is not None and head < 0:
        raise UsageError(f"--head must be >= 0, got {head}")
    if world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {world_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise UsageError(f"--rank {rank} is outside 0..{world_size - 1} (--world-size {world_size})")
    sp = _open(dataset_dir, cfg, split)
    o = episode_order(sp, cfg, world_size, what=f"split {split!r} of {dataset_dir}")
    if o.sampling == "random" and step is None:
        raise UsageError("batch_sampling_mode=random has no epochs: give --step N to see the episodes of step N")
    if o.sampling == "random" and epoch is not None:
        raise UsageError("batch_sampling_mode=random has no epochs; drop --epoch (give --step only)")
    g, bs = o.global_batch, o.batch_size
    cols: dict[str, np.ndarray] = {}
    if step is not None:
        if step < 0:
            raise UsageError(f"--step must be >= 0 (0 = the first batch of training), got {step}")
        ids = o.step_ids(step, rank)
        slots = o._slots(rank)
        if o.sampling == "epoch":
            ep, pos = o.step_positions(step, rank)
            if epoch is not None and epoch not in set(ep.tolist()):
                first, count = o.epoch_of_step(step), o.batches_in_epoch(epoch)
                raise UsageError(f"step {step} is in epoch {first}, not epoch {epoch} (epoch {epoch} is steps "
                                 f"{o.first_step_of_epoch(epoch)}..{o.first_step_of_epoch(epoch) + count - 1}); "
                                 f"--step counts batches from the start of training; drop --epoch")
            epoch = o.epoch_of_step(step)
        else:
            ep = pos = np.full(ids.shape, -1, dtype=np.int64)
        total = ids.shape[0]
        k = total if head is None else min(head, total)
        cols = {"step": np.full(k, step, dtype=np.int64), "rank": slots[:k] // bs, "slot": slots[:k] % bs,
                "epoch": ep[:k], "position": pos[:k], "episode": ids[:k]}
    else:
        epoch = 0 if epoch is None else epoch
        if epoch < 0:
            raise UsageError(f"--epoch must be >= 0, got {epoch}")
        order = o.epoch_order(epoch)
        total = order.shape[0]
        k = total if head is None else min(head, total)
        p = np.arange(k, dtype=np.int64)
        if o.drop_last:
            per = o.n // g
            trained = p < per * g
            stp = np.where(trained, epoch * per + p // g, -1)
            slot = np.where(trained, p % g, -1)
        else:
            gp = epoch * o.n + p
            stp, slot = gp // g, gp % g
        cols = {"epoch": np.full(k, epoch, dtype=np.int64), "position": p, "step": stp,
                "rank": np.where(slot >= 0, slot // bs, -1), "slot": np.where(slot >= 0, slot % bs, -1),
                "episode": np.asarray(order[:k], dtype=np.int64)}
    ids = cols["episode"]
    shard = sp.shard_of(ids)
    names = np.array([s.name for s in sp.shards] or [""], dtype=object)
    cols["shard"] = names[shard] if len(ids) else np.empty(0, dtype=object)
    cols["length"] = sp.lengths[ids]
    cols["record"] = _records(sp, ids, shard)
    cols = {c: cols[c] for c in (STEP_COLUMNS if step is not None else EPOCH_COLUMNS)}
    return Replay(str(dataset_dir), split, o.sampling, o.seed, o.shuffle, o.drop_last, bs, world_size,
                  cfg.episode_min_tokens, sp.num_episodes, o.n, epoch, step, rank, total, cols)


def _records(sp: Split, ids: np.ndarray, shard: np.ndarray) -> np.ndarray:
    """Input record number of each episode (sources.idx), -1 where not stored."""
    out = np.full(ids.shape, -1, dtype=np.int64)
    for si in np.unique(shard):
        s = sp.shards[int(si)]
        if s.sources is None:
            continue
        sel = shard == si
        out[sel] = np.asarray(s.sources, dtype=np.int64)[ids[sel] - sp.episode_offsets[si]]
    return out


def check_audit_log(dataset_dir: str | Path, cfg: LoaderConfig, log_path: str | Path, *, split: str = "train",
                    world_size: int = 1) -> AuditCheck:
    """Compare an audit log's ``epoch_start`` lines with the replayed order."""
    sp = _open(dataset_dir, cfg, split)
    return check_audit(log_path, episode_order(sp, cfg, world_size, what=f"split {split!r} of {dataset_dir}"), split)
