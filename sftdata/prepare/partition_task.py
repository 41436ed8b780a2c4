"""The per-partition task: a worker (a Ray task, or a local ``--workers`` process) reads,
renders and masks its own partition of the input and stages its episodes in a shard
folder of its own; the coordinator numbers the results in input order.
"""

from __future__ import annotations

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
from ..store.format import STOP_FILE
from ..store.fsops import make_owned_folder
from ..store.split_writer import SplitWriter
from .chunk import empty_result, merged, process_chunk, shifted
from .curate_tasks import KEYS_DIR, stage_keys
from .options import PrepareOptions
from .pool import WORKER, chunks_of
from .results import ChunkResult, StagedPart


@dataclass
class PartSummary:
    """What a partition task sends back (small: no tokens): counts, rejects and keys, the
    staged shard's folder, and each staged episode's length and record (``lengths``,
    ``sources``: 16 bytes an episode, what the coordinator plans the final shards with)."""

    index: int
    result: ChunkResult  # ids and mask empty; records numbered from the start of the input
    records: int  # record numbers the partition used (lines, or the whole input's records)
    path: str | None  # the shard folder holding its episodes (None: none, or the run stopped)
    episodes: int = 0
    tokens: int = 0
    sha256: str | None = None  # a whole input: what reading it found
    bytes: int = 0
    block_sha256: str | None = None  # a whole input: its block hash
    lengths: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    sources: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    keys: str | None = None  # the folder of its records' duplicate keys (curate_tasks)
    lines_before: int = 0  # the lines of its input before it, as the run gave them
    read: RangeRead | None = None  # a byte range of JSONL: what its reader hashed (``ReadCheck``)


_TOKENIZERS: dict = {}  # per worker process: tokenizers rebuilt once, not once per task or per run
_KEEP_TOKENIZERS = 4


def _tokenizer(pickled: bytes | None):
    """The (tokenizer, profile) pickled in ``pickled`` (a few hundred bytes: a tokenizer
    pickles as what rebuilds it), rebuilt on a worker's first task and kept for later
    tasks and runs (rebuilding takes seconds: the ranks are read and checked). None: the
    local worker's own (``_worker_init``)."""
    if pickled is None:
        return WORKER["tok"], WORKER["profile"]
    key = hashlib.sha256(pickled).hexdigest()
    got = _TOKENIZERS.get(key)
    if got is None:
        if len(_TOKENIZERS) >= _KEEP_TOKENIZERS:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        got = _TOKENIZERS[key] = pickle.loads(pickled)  # noqa: S301  (made by this run's driver)
    return got


def _stopped(index: int) -> PartSummary:
    return PartSummary(index, merged(None, empty_result()), 0, None)


def prepare_partition(part: Partition, lines_before: int, tokenizer: bytes | None, curate: CurateSettings | None,
                      settings: dict, stage_dir: str) -> PartSummary:
    """One task: read, render and mask the records of ``part`` (numbered from
    ``lines_before`` in its input) into a shard folder of its own under ``stage_dir``,
    renamed to ``part_N`` when complete, with its records' duplicate keys beside them
    (``curate_tasks.stage_keys``). ``tokenizer``: the pickled (tokenizer, profile) of the
    run, and ``curate`` what to compute per record (evaluation sets: contamination); both
    None in a local worker, which has its own (and its memo)."""
    stop = Path(stage_dir) / STOP_FILE
    if stop.exists():
        return _stopped(part.index)
    tok, profile = _tokenizer(tokenizer)
    memo = WORKER.get("memo") if tokenizer is None else None
    curate = WORKER.get("curate", CurateSettings()) if curate is None else curate
    final = Path(stage_dir) / f"part_{part.index:06d}"
    tmp = make_owned_folder(Path(stage_dir), f"part_{part.index:06d}", settings.get("stage"))  # never its parents
    writer = SplitWriter(tmp, "s", np.dtype(settings["token_dtype"]), 1 << 62)
    lines, read = [0], []

    def records():
        for rec, pos in iter_partition(part, lines_before, settings["max_record_bytes"], read):
            if rec is None:
                lines[0] = pos
            else:
                yield rec, pos

    acc, lengths, sources = None, [], []
    with writing(tmp, settings.get("output", stage_dir)):
        for items, _ in chunks_of(records()):
            if stop.exists():  # the run stopped (an error, Ctrl-C): write nothing more
                writer.close()
                return _stopped(part.index)
            # with the duplicate keys (the exact ones always: prepare's summary counts them) and the
            # contamination, from the same parse as the tokens
            res = process_chunk(items, tok, settings["mode"], settings["max_tokens"], settings["policy"], profile,
                                memo, curate)
            if res.lengths.size:
                writer.add_many(res.ids, res.mask, res.lengths, res.sources, res.last_only)
                lengths.append(res.lengths)
                sources.append(res.sources)
            acc = merged(acc, res)
        meta = writer.close()
        if acc is None:
            acc = merged(None, empty_result())
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
    return PartSummary(part.index, acc, lines[0], str(final / "s" / "shard_00000") if meta["episodes"] else None,
                       meta["episodes"], meta["tokens"], sha, size, blocks,
                       np.concatenate(lengths) if lengths else np.empty(0, np.int64),
                       np.concatenate(sources) if sources else np.empty(0, np.int64),
                       str(final / KEYS_DIR) if meta["episodes"] else None, lines_before, read[0] if read else None)


def partition_settings(opts: PrepareOptions, token_dtype: np.dtype, output: str, buckets: int) -> dict:
    """What every partition task needs of the options (``output``: the run's output, named
    by a failed write; ``buckets``: of the duplicate keys, one group task each)."""
    return {"mode": opts.mode, "max_tokens": opts.max_tokens, "policy": opts.policy,
            "max_record_bytes": opts.max_record_bytes, "token_dtype": np.dtype(token_dtype).name, "output": output,
            "buckets": buckets, "threshold": opts.dedup_threshold}


class PartNumbering:
    """Partition summaries, taken in input order, made into chunk results with global
    record numbers (the staged episodes as a ``StagedPart``); fills in each input's
    ``first_record``, ``records``, ``sha256``, ``bytes`` and ``block_sha256`` as it
    completes, the reads of its ranges held against each other (``ReadCheck``: an input
    that changed while it was read fails the run). Made before any range is read: it takes
    the inputs' state then."""

    def __init__(self, parts: list[Partition], infos: list[SourceInfo]):
        self.infos, self.last = infos, {p.source: p.index for p in parts}
        self.first_record, self.records_of, self.done = 0, Counter(), 0
        self.check = ReadCheck(infos, parts)

    def place(self, p: Partition, s: PartSummary, hashes=None) -> tuple[ChunkResult, int]:
        """``hashes``: the input's (sha256 or None, size, its scans' block hash or None,
        the block hash of the read that took its sha256 or None), asked once its last
        partition is placed (a whole input's come with its summary)."""
        info = self.infos[p.source]
        self.check.add(p, s.lines_before, s.records, s.read, self.last[p.source] == p.index)
        self.records_of[p.source] += s.records
        if p.whole:
            info.sha256, info.bytes, info.block_sha256 = s.sha256, s.bytes, s.block_sha256
        res = shifted(s.result, self.first_record)
        if s.path is not None:
            res.staged = StagedPart(s.path, s.episodes, s.tokens, self.first_record, s.lengths,
                                    s.sources + self.first_record, keys_dir=s.keys)
        self.done += (p.end - p.start) if not p.whole else s.bytes
        if self.last[p.source] == p.index:  # the input is complete: its numbers are known
            info.first_record, info.records = self.first_record, self.records_of[p.source]
            if hashes is not None:
                sha, size, scanned, whole = hashes()
                info.sha256, info.bytes = sha, size
                info.block_sha256 = self.check.block_hash(p.source, info, scanned, whole)
            self.first_record += info.records
        return res, self.done
