"""A partitioned run: the coordinator plans and commits, the workers read, render and write
(``--workers`` > 1 on inputs that can be cut, and ``--engine ray``). The same functions
run in local worker processes and as Ray tasks (``tasks.TaskRunner``)::

    coordinator (this process)                      workers / tasks
    ─────────────────────────────────────────       ─────────────────────────────────────────────
    cut the inputs into partitions           ──►    scan_range: the newlines of a byte range
                                                    (Parquet: the hash blocks that start in it)
    the lines before each range (sums)       ◄──    (a few GB/s: the first wave ends at once)
                                             ──►    prepare_partition: read (hashing the blocks
                                                    the bytes it parses lie in), render, mask;
                                                    the episodes staged in _parts/part_N
    in input order: record numbers, rejects, ◄──    a summary: counts, rejects, keys, each
    curating, the exact split (split.py),           episode's length and record (3-8 bytes an
    the final shards planned (plan.py)              episode; no token)
                                             ──►    write_shard: one final shard, from the
                                                    staged parts it covers, renamed into place
    metadata (the shards' records), commit   ◄──    its record: counts, every file's sha256
                                                    (an object-store output: the shard's files
                                                    put straight into the bucket by the worker)

The coordinator reads no record and no token and writes no shard: its bytes grow with
the episodes (their lengths) and the rejects, not with the tokens. Each input's
hashes: the block hash from the reads of its ranges (Parquet: its scans; a whole input:
its reader), the whole-file sha256 by one task beside the others where it is recorded
(``records_sha256``); the reads are held against each other and the file's stat
(``sources.partitions.ReadCheck``), so an input that changed while it was read fails the
run by name instead of being recorded as something the dataset was not made from.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..curate import Deduplicator, Drop, RecordKeys
from ..sources import SourceInfo, record_where
from ..sources.partitions import Partition, file_digest, first_where, records_sha256, scan_range
from ..storage.fsops import folder_identity, make_folder
from ..storage.object_upload import DirectUpload
from ..store.format import (
    ENTRIES_PER_ROW,
    KIND_EPISODES,
    LAST_REPLY_FILE,
    MEDIA_FILE,
    flagged_count,
    media_count,
    shard_files,
    shard_name,
)
from ..tasks import TaskRunner, in_order
from ..util.hashing import combine_blocks
from .curate_tasks import fetch_keys, group_bucket
from .partition_task import PartNumbering, partition_settings, prepare_partition
from .plan import plan_shards
from .results import StagedPart
from .shard_task import write_shard

MAX_KEY_BUCKETS = 256


class _Scans:
    """The scans of the ranged partitions, taken in input order as the run needs them: the
    lines before a range, and an input's hash blocks once all its ranges are scanned."""

    def __init__(self, runner: TaskRunner, infos: list[SourceInfo], parts: list[Partition]):
        self.ranged = [p for p in parts if not p.whole]
        self.results = in_order(runner, scan_range, (
            ((infos[p.source].path, p.start, p.end, infos[p.source].bytes, p.groups is None, p.groups is not None),
             f"{infos[p.source].path} "
             f"(bytes {p.start:,} to {p.end:,}) was being scanned", p) for p in self.ranged))
        self.taken = 0
        self.lines: dict[int, int] = {}
        self.blocks: dict[int, list[bytes]] = {}

    def _take_through(self, index: int) -> None:
        """Take the scans of every ranged partition up to partition ``index`` (included)."""
        while self.taken < len(self.ranged) and self.ranged[self.taken].index <= index:
            scan, p = next(self.results)
            self.taken += 1
            self.lines[p.source] = self.lines.get(p.source, 0) + scan.lines
            self.blocks.setdefault(p.source, []).extend(scan.digests)

    def lines_before(self, p: Partition) -> int:
        if p.groups is not None:  # a Parquet file's row groups: the rows before them are in its footer
            return p.groups[2]
        if p.whole or p.start == 0:
            return 0
        self._take_through(p.index - 1)
        return self.lines[p.source]

    def block_hash(self, last: Partition) -> str:
        """The block hash of the input whose last partition is ``last``."""
        self._take_through(last.index)
        return combine_blocks(self.blocks.get(last.source, []))


def partitioned_results(infos: list[SourceInfo], opts, token_dtype: np.dtype, runner: TaskRunner,
                        stage_dir: Path, output: str) -> Iterator[tuple[object, int]]:
    """The partition tasks' results in input order, numbered globally (their rows staged:
    ``staged``, a ``StagedPart`` per kind), with the input bytes done; fills in ``infos``
    (records, hashes)."""
    parts = runner.partitions(infos)
    make_folder(stage_dir)
    # every task writes only inside the folder of this identity (``fsops.make_owned_folder``)
    settings = {**partition_settings(opts, token_dtype, output, key_buckets(runner)),
                "stage": folder_identity(stage_dir)}
    scans = _Scans(runner, infos, parts)
    numbering = PartNumbering(parts, infos)  # before any range is read: the inputs' state
    whole = {si: runner.submit(file_digest, (infos[si].path,), f"{infos[si].path} was being hashed")
             for si in sorted({p.source for p in scans.ranged})
             if records_sha256(infos[si], getattr(opts, "source_sha256", False))}

    def jobs():
        for p in parts:
            before = scans.lines_before(p)
            yield ((p, before, runner.tokenizer, runner.curate, settings, str(stage_dir)),
                   f"the records from {first_where(p, before)} on were being prepared", p)

    for s, p in in_order(runner, prepare_partition, jobs()):
        yield numbering.place(p, s, None if p.whole else lambda p=p: _hashes(runner, scans, whole, infos, p))


def _hashes(runner: TaskRunner, scans: _Scans, whole: dict, infos: list[SourceInfo], last: Partition
            ) -> tuple[str | None, int, str | None, str | None]:
    """(whole-file sha256 or None, size, the scans' block hash (Parquet's row groups; a JSONL
    range's reader hashes its own bytes) or None, the block hash of the whole-file read or
    None) of the ranged input ending with ``last``."""
    si = last.source
    sha, blocks = runner.result(whole[si], f"{infos[si].path} was being hashed")[::2] if si in whole else (None, None)
    return sha, infos[si].bytes, scans.block_hash(last) if last.groups is not None else None, blocks


def key_buckets(runner: TaskRunner) -> int:
    """The buckets the duplicate keys are cut into: a group task each (any number gives
    the same decision)."""
    return max(1, min(MAX_KEY_BUCKETS, runner.cpus))


def decide_duplicates(runner: TaskRunner, parts: list[StagedPart], dedup: Deduplicator, sources: list[dict]
                      ) -> list[Drop]:
    """The duplicate decision over the staged keys of ``parts`` (``curate_tasks``): one
    group task per bucket, then (``near``) the candidates' keys and signatures fetched
    and decided here in input order. Returns the records to drop (``dedup`` counts them);
    ``sources``: the metadata's inputs, which turn a record number into its place."""
    staged = [(p.keys_dir, p.record_offset) for p in parts if p.keys_dir is not None]
    found = [g for g, _ in in_order(runner, group_bucket, (
        ((staged, b, dedup.mode), f"bucket {b} of the duplicate keys was being grouped", b)
        for b in range(key_buckets(runner))))]
    dedup.exact_duplicates += sum(g.duplicates for g in found) if dedup.mode != "near" else 0
    if dedup.mode == "off":
        return []
    if dedup.mode == "exact":
        repeats = np.concatenate([g.repeats for g in found])
        firsts = np.concatenate([g.firsts for g in found])
        order = np.argsort(repeats, kind="stable")
        return [Drop(r, record_where(sources, r), "exact", f, record_where(sources, f), 1.0)
                for r, f in zip(repeats[order].tolist(), firsts[order].tolist())]
    candidates = np.unique(np.concatenate([g.candidates for g in found]))
    exact, sigs = [], []
    owners = [p for p in parts if p.keys_dir is not None]
    lasts = np.array([int(p.sources[-1]) for p in owners], dtype=np.int64)  # records ascend through the parts
    cut = np.searchsorted(candidates, lasts, side="right")
    asks = [(p, candidates[a:b]) for p, a, b in zip(owners, np.concatenate([[0], cut[:-1]]), cut) if b > a]
    for (e, s), _ in in_order(runner, fetch_keys, (((p.keys_dir, p.record_offset, recs),
                                                    f"the keys of {recs.size:,} records were being read", p)
                                                   for p, recs in asks)):
        exact.append(e)
        sigs.append(s)
    keys = RecordKeys(candidates, [record_where(sources, r) for r in candidates.tolist()],
                      [row.tobytes() for row in np.concatenate(exact)] if exact else [],
                      np.concatenate(sigs) if sigs else np.empty((0, dedup.num_perm), np.uint32), [])
    return dedup.decide(keys)


def write_planned(runner: TaskRunner, root: Path, stage_dir: Path, parts: list[StagedPart], is_val: np.ndarray,
                  token_dtype: np.dtype, opts, output: str, kind: str = KIND_EPISODES, val: bool | None = None,
                  direct: Callable[[list[str]], DirectUpload | None] | None = None, media: bool = False) -> dict:
    """The final shards of rows of ``kind``, planned here (``plan_shards``) and written by
    the workers (``write_shard``) into ``root``'s split folders (``val``: a val split
    too; None: where --val-split is given), or, where ``direct``
    (given every planned object) gives a ``DirectUpload``, put by them straight into the
    object-store target; returns each split's metadata (the shards' records in order) and
    removes what was staged. ``media``: a vision model's dataset (each shard's media table)."""
    splits = ("train", "val") if (opts.val_split > 0 if val is None else val) else ("train",)
    for split in splits:
        (root / split).mkdir()
    jobs = plan_shards(parts, is_val, opts.shard_tokens, splits)
    upload = None if direct is None else direct(
        [f"{job.split}/{shard_name(job.index)}/{f}" for job in jobs for f in shard_files(False)])
    shards: dict[str, list[dict]] = {split: [] for split in splits}
    stage_id = folder_identity(stage_dir)
    before = Counter()  # rows of the split in the shards before a job's (a row's number in columns.jsonl)
    args = []
    for job in jobs:
        args.append(((job, token_dtype.name, str(root), str(stage_dir), output, upload, stage_id, kind,
                      before[job.split], media), f"{job.split}/{shard_name(job.index)} was being written", job))
        before[job.split] += sum(p.stop - p.first if p.take is None else int(p.take.sum()) for p in job.pieces)
    for rec, job in in_order(runner, write_shard, args):
        shards[job.split].append(rec)
    flagged = [f"{split}/{rec['name']}/{f}" for split, recs in shards.items() for rec in recs
               for f in (LAST_REPLY_FILE, MEDIA_FILE) if f in rec["files"]]
    # a shard's flags and media table (only where it holds a flagged episode, a media item): the commit's too
    if upload is not None and flagged:
        direct(flagged)
    shutil.rmtree(stage_dir, ignore_errors=True)
    rows = ("rows",) if kind in ENTRIES_PER_ROW else ()
    return {split: {**{k: sum(r[k] for r in recs) for k in (*rows, "episodes", "tokens", "trained_tokens")},
                    **flagged_count(recs), **media_count(recs), "shards": recs}
            for split, recs in shards.items()}

