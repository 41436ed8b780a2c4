"""The per-partition task: a worker (a Ray task, or a local ``--workers`` process) reads,
renders and masks its own partition of the input and stages its episodes in a shard
folder of its own; the coordinator numbers the results in input order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..curate import CurateSettings, RecordKeys
from ..records.rejects import writing
from ..sources import SourceInfo
from ..sources.partitions import Partition, RangeRead, ReadCheck, iter_partition
from ..storage.fsops import make_owned_folder
from ..store.format import KIND_EPISODES, STOP_FILE
from .curate_tasks import KEYS_DIR, stage_keys
from .pool import WORKER, chunks_of
from .results import StagedPart
from .split import add_rows, open_split


@dataclass
class PartSummary:
    """What a partition task sends back (small: no tokens): counts, rejects and keys, and
    the rows it staged: per kind of row a ``StagedPart`` (its shard folder, each row's
    length and record: what the coordinator plans the final shards with)."""

    index: int
    result: object  # the work's outcome (ChunkResult ...), no tokens; records numbered from the start of the input
    records: int  # record numbers the partition used (lines, or the whole input's records)
    staged: dict = field(default_factory=dict)  # kind -> StagedPart (none: no row, or the run stopped)
    sha256: str | None = None  # a whole input: what reading it found
    bytes: int = 0
    block_sha256: str | None = None  # a whole input: its block hash
    keys: str | None = None  # the folder of its records' duplicate keys (curate_tasks)
    lines_before: int = 0  # the lines of its input before it, as the run gave them
    read: RangeRead | None = None  # a byte range of JSONL: what its reader hashed (``ReadCheck``)


_WORKS: dict = {}  # per worker process: works rebuilt once, not once per task or per run
_KEEP_WORKS = 4


def _work(pickled: bytes | None):
    """The work pickled in ``pickled`` (a few hundred bytes: a tokenizer pickles as what
    rebuilds it), rebuilt on a worker's first task and kept for later tasks and runs
    (rebuilding takes seconds: the ranks are read and checked). None: the local worker's
    own (``pool.start_worker``)."""
    if pickled is None:
        return WORKER["work"]
    key = hashlib.sha256(pickled).hexdigest()
    got = _WORKS.get(key)
    if got is None:
        if len(_WORKS) >= _KEEP_WORKS:
            _WORKS.pop(next(iter(_WORKS)))
        got = _WORKS[key] = pickle.loads(pickled)  # noqa: S301  (made by this run's driver)
    return got


def _stopped(index: int, work) -> PartSummary:
    return PartSummary(index, work.merged(None, None), 0)


def prepare_partition(part: Partition, lines_before: int, work: bytes | None, curate: CurateSettings | None,
                      settings: dict, stage_dir: str) -> PartSummary:
    """One task: read the records of ``part`` (numbered from ``lines_before`` in its input)
    and make them rows (``work``: the pickled work of the run's kind of row, None in a
    local worker, which has its own: episodes, and its memo), staged in a shard folder of
    its own under ``stage_dir`` (one split per kind of row), renamed to ``part_N`` when
    complete, with its records' duplicate keys beside them (``curate_tasks.stage_keys``).
    ``curate``: what to compute per record (evaluation sets: contamination; None in a
    local worker)."""
    stop = Path(stage_dir) / STOP_FILE
    doer = _work(work)
    if stop.exists():
        return _stopped(part.index, doer)
    memo = WORKER.get("memo") if work is None else None
    curate = WORKER.get("curate", CurateSettings()) if curate is None else curate
    final = Path(stage_dir) / f"part_{part.index:06d}"
    tmp = make_owned_folder(Path(stage_dir), f"part_{part.index:06d}", settings.get("stage"))  # never its parents
    writers, lines, read = {}, [0], []

    def records():
        for rec, pos in iter_partition(part, lines_before, settings["max_record_bytes"], read):
            if rec is None:
                lines[0] = pos
            else:
                yield rec, pos

    acc = None
    with writing(tmp, settings.get("output", stage_dir)):
        for items, _ in chunks_of(records()):
            if stop.exists():  # the run stopped (an error, Ctrl-C): write nothing more
                for w in writers.values():
                    w[0].close()
                return _stopped(part.index, doer)
            res, rows = doer.chunk(items, memo, curate)
            for kind, r in rows.items():
                if r.size:
                    w = writers.get(kind) or writers.setdefault(kind, (open_split(
                        tmp, kind, STAGED.get(kind, kind), np.dtype(settings["token_dtype"]), 1 << 62), [], []))
                    add_rows(w[0], r)
                    w[1].append(r.lengths.reshape(-1, r.per).sum(axis=1))
                    w[2].append(r.sources)
            acc = doer.merged(acc, res)
        staged = {kind: _staged(final, kind, w) for kind, w in writers.items()}
        if acc is None:
            acc = doer.merged(None, None)
        keys, contaminated = acc.keys, [] if acc.keys is None else acc.keys.contaminated
        if keys is not None and contaminated:  # dropped whatever else is decided: not among the keys
            keys = keys.subset(~np.isin(keys.records, [c[0] for c in contaminated]))
        stage_keys(tmp / KEYS_DIR, keys, settings["buckets"], curate.dedup, settings["threshold"])
        # what the coordinator gets of the keys: the contaminated records (the groups of keys stay here)
        acc.keys = RecordKeys(np.empty(0, np.int64), [], [], None, contaminated)
    info = part.info
    sha, size, blocks = (info.sha256, info.bytes, info.block_sha256) if part.whole else (None, 0, None)
    if final.exists():  # an earlier attempt completed, but its answer was lost with its worker
        shutil.rmtree(final)
    os.rename(tmp, final)
    return PartSummary(part.index, acc, lines[0], staged, sha, size, blocks,
                       str(final / KEYS_DIR) if staged else None, lines_before, read[0] if read else None)


STAGED = {KIND_EPISODES: "s"}  # the split folder a part stages a kind's rows in (by default: the kind)


def _staged(final: Path, kind: str, w: tuple) -> StagedPart:
    """The ``StagedPart`` of the rows of ``kind`` a task wrote (``w``: writer, the rows'
    lengths, their records), at its place once the task's folder is renamed ``final``."""
    meta = w[0].close()
    lengths, sources = np.concatenate(w[1]), np.concatenate(w[2])
    return StagedPart(str(final / STAGED.get(kind, kind) / "shard_00000"), meta.get("rows", meta["episodes"]),
                      meta["tokens"], 0, _narrow(lengths), _narrow(sources), keys_dir=str(final / KEYS_DIR))


def _narrow(values: np.ndarray) -> np.ndarray:
    """``values`` (int64, not negative) in the smallest unsigned type that holds them: the
    fewest bytes to send (a row's tokens and a record's number: 2 and 4 bytes, mostly)."""
    return values.astype(np.min_scalar_type(int(values.max()))) if values.size else values


def partition_settings(opts, token_dtype: np.dtype, output: str, buckets: int) -> dict:
    """What every partition task needs of the options (``output``: the run's output, named
    by a failed write; ``buckets``: of the duplicate keys, one group task each)."""
    return {"max_record_bytes": opts.max_record_bytes, "token_dtype": np.dtype(token_dtype).name, "output": output,
            "buckets": buckets, "threshold": opts.dedup_threshold}


class PartNumbering:
    """Partition summaries, taken in input order, made into chunk results with global
    record numbers (their staged rows: ``staged``, a ``StagedPart`` per kind); fills in each input's
    ``first_record``, ``records``, ``sha256``, ``bytes`` and ``block_sha256`` as it
    completes, the reads of its ranges held against each other (``ReadCheck``: an input
    that changed while it was read fails the run). Made before any range is read: it takes
    the inputs' state then."""

    def __init__(self, parts: list[Partition], infos: list[SourceInfo]):
        self.infos, self.last = infos, {p.source: p.index for p in parts}
        self.first_record, self.records_of, self.done = 0, Counter(), 0
        self.check = ReadCheck(infos, parts)

    def place(self, p: Partition, s: PartSummary, hashes=None) -> tuple[object, int]:
        """``hashes``: the input's (sha256 or None, size, its scans' block hash or None,
        the block hash of the read that took its sha256 or None), asked once its last
        partition is placed (a whole input's come with its summary)."""
        info = self.infos[p.source]
        self.check.add(p, s.lines_before, s.records, s.read, self.last[p.source] == p.index)
        self.records_of[p.source] += s.records
        if p.whole:
            info.sha256, info.bytes, info.block_sha256 = s.sha256, s.bytes, s.block_sha256
        first = self.first_record
        res = s.result.shifted(first)
        res.staged = {kind: dataclasses.replace(sp, record_offset=first, sources=sp.sources.astype(np.int64) + first)
                      for kind, sp in s.staged.items()}
        self.done += (p.end - p.start) if not p.whole else s.bytes
        if self.last[p.source] == p.index:  # the input is complete: its numbers are known
            info.first_record, info.records = self.first_record, self.records_of[p.source]
            if hashes is not None:
                sha, size, scanned, whole = hashes()
                info.sha256, info.bytes = sha, size
                info.block_sha256 = self.check.block_hash(p.source, info, scanned, whole)
            self.first_record += info.records
        return res, self.done
