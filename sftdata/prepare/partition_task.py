"""The per-partition task: a worker (a Ray task, or a local ``--workers`` process) reads,
renders and masks its own byte range of the input; the local engine's ranges, their
tokens handed over in a file, and their results numbered in input order.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..chat.tokenizer import ChatTokenizer, HFTokenizer
from ..curate import CurateSettings
from ..errors import SftDataError
from ..records.rejects import writing
from ..sources import SourceInfo
from ..sources.partitions import Partition, SequentialScan, iter_partition, plan_partitions, splittable
from ..store.format import STOP_FILE
from ..store.writer import SplitWriter
from ..template import TemplateProfile
from .chunk import empty_result, merged, process_chunk, shifted
from .options import ChunkResult, PrepareOptions, StagedPart
from .pool import WORKER, chunks_of, in_order, worker_pool

# --workers > 1 on plain JSONL: the input is cut into ranges of at most MAX_PART_BYTES (a range's tokens come back
# whole; the progress bar moves once per range), each at most 1/(TAIL_WAYS x workers) of what is left and at least
# MIN_PART_BYTES, so that the last ranges are small and the workers finish together
MAX_PART_BYTES = 4 << 20
MIN_PART_BYTES = 256 << 10
TAIL_WAYS = 2


@dataclass
class PartSummary:
    """What a partition task sends back: counts, rejects and keys, and a staged partition's
    folder (a Ray task: no tokens), or a local range's tokens in ``result``, or in a file
    ``handoff`` (ids then mask) that this process reads once and removes."""

    index: int
    result: ChunkResult  # ids and mask empty when staged; records numbered from the start of the input
    records: int  # record numbers the partition used (lines, or the whole input's records)
    path: str | None  # the shard folder holding its episodes
    episodes: int = 0
    tokens: int = 0
    sha256: str | None = None  # a whole input: what reading it found
    bytes: int = 0
    handoff: str | None = None  # a local range's ids (the run's token dtype) then mask (uint8), in this file


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


def prepare_partition(part: Partition, scan, cut: int, tokenizer: bytes | None, settings: dict,
                      stage_dir: str | None) -> PartSummary:
    """One task (a Ray task, or a ``--workers`` process): read, render and mask the records
    of ``part`` into a shard folder of its own under ``stage_dir``, or with ``stage_dir``
    None (a local worker, whose range is a few MiB) return its tokens in the summary.
    ``scan``: ``line_counts`` of its input, ``cut`` its index there; ``tokenizer``: the
    pickled (tokenizer, profile) of the run, None in a local worker, which keeps its memo."""
    stop = Path(stage_dir) / STOP_FILE if stage_dir is not None else None
    if stop is not None and stop.exists():
        return PartSummary(part.index, merged(None, empty_result()), 0, None)
    tok, profile = _tokenizer(tokenizer)
    memo = WORKER.get("memo") if tokenizer is None else None
    lines_before = scan[cut] if scan is not None and cut >= 0 else 0
    writer = tmp = final = None
    if stage_dir is not None:
        final = Path(stage_dir) / f"part_{part.index:06d}"
        tmp = Path(stage_dir) / f"part_{part.index:06d}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()  # not parents: a staging area already removed (the run ended) stays removed
        writer = SplitWriter(tmp, "s", np.dtype(settings["token_dtype"]), 1 << 62)
    lines = [0]

    def records():
        for rec, pos in iter_partition(part, lines_before, settings["max_record_bytes"]):
            if rec is None:
                lines[0] = pos
            else:
                yield rec, pos

    acc, kept = None, []
    for items, _ in chunks_of(records()):
        if stop is not None and stop.exists():  # the run stopped (an error, Ctrl-C): write nothing more
            writer.close()
            return PartSummary(part.index, merged(None, empty_result()), 0, None)
        # with the exact-duplicate keys the driver counts (prepare's summary, whatever the engine), from
        # the same parse as the tokens
        res = process_chunk(items, tok, settings["mode"], settings["max_tokens"], settings["policy"], profile, memo,
                            CurateSettings())
        if res.lengths.size:
            if writer is not None:
                writer.add_many(res.ids, res.mask, res.lengths, res.sources)
            else:
                kept.append(res)
        acc = merged(acc, res)
    if acc is None:
        acc = merged(None, empty_result())
    whole = part.whole
    sha, size = (part.info.sha256, part.info.bytes) if whole else (None, 0)
    if writer is None:
        handoff = None
        if kept:
            acc.lengths, acc.sources = (np.concatenate([getattr(r, k) for r in kept]) for k in ("lengths", "sources"))
            if settings.get("handoff_dir") is not None:
                handoff = _hand_off(Path(settings["handoff_dir"]) / f"range_{part.index:06d}.bin", kept,
                                    np.dtype(settings["token_dtype"]))
            else:
                acc.ids, acc.mask = np.concatenate([r.ids for r in kept]), np.concatenate([r.mask for r in kept])
        return PartSummary(part.index, acc, lines[0], None, int(acc.lengths.size), int(acc.lengths.sum()), sha, size,
                           handoff)
    meta = writer.close()
    if final.exists():  # an earlier attempt completed, but its answer was lost with its worker
        shutil.rmtree(final)
    os.rename(tmp, final)
    return PartSummary(part.index, acc, lines[0],
                       str(final / "s" / "shard_00000") if meta["episodes"] else None, meta["episodes"],
                       meta["tokens"], sha, size)


def _hand_off(path: Path, kept: list[ChunkResult], dtype: np.dtype) -> str:
    """A local range's tokens written to ``path`` (ids, then mask): the worker goes on to its
    next range at once. Sent back through the pool's pipe, a range of a few MiB held the
    worker until this process had read it all, 64 KiB at a time, with both cores busy."""
    with writing(path, path.parent.parent), open(path, "wb") as f:
        for r in kept:
            f.write(memoryview(np.ascontiguousarray(r.ids, dtype=dtype)).cast("B"))
        for r in kept:
            f.write(memoryview(np.ascontiguousarray(r.mask, dtype=np.uint8)).cast("B"))
    return str(path)


def _take_handoff(s: PartSummary, dtype: np.dtype) -> None:
    """The tokens of ``s``'s handoff file into its result; the file removed once read whole."""
    if s.handoff is None:
        return
    with open(s.handoff, "rb") as f:
        s.result.ids = np.fromfile(f, dtype=dtype, count=s.tokens)
        s.result.mask = np.fromfile(f, dtype=np.uint8, count=s.tokens)
    if s.result.ids.size != s.tokens or s.result.mask.size != s.tokens:  # the file stays for the message;
        # the staging folder it lies in is removed with the failed run
        raise SftDataError(f"the tokens a worker handed over in {s.handoff} were cut short ({s.result.ids.size:,} "
                           f"ids and {s.result.mask.size:,} mask values of {s.tokens:,}); nothing was written. "
                           f"Check the free space of the output's file system and run again")
    os.unlink(s.handoff)
    s.handoff = None


def partition_settings(opts: PrepareOptions, token_dtype: np.dtype) -> dict:
    """What every partition task needs of the options."""
    return {"mode": opts.mode, "max_tokens": opts.max_tokens, "policy": opts.policy,
            "max_record_bytes": opts.max_record_bytes, "token_dtype": np.dtype(token_dtype).name}


def range_cuts(parts: list[Partition]) -> tuple[dict[int, list[int]], dict[tuple[int, int], int]]:
    """Per input, the starts of its ranges after the first (``line_counts`` counts the lines
    before them), and each (input, start)'s index there."""
    cuts: dict[int, list[int]] = {}
    for p in parts:
        if not p.whole and p.start > 0:
            cuts.setdefault(p.source, []).append(p.start)
    return cuts, {(si, c): k for si, cs in cuts.items() for k, c in enumerate(cs)}


class PartNumbering:
    """Partition summaries, taken in input order, made into chunk results with global
    record numbers; fills in each input's ``first_record``, ``records``, ``sha256`` and
    ``bytes`` as it completes."""

    def __init__(self, parts: list[Partition], infos: list[SourceInfo]):
        self.infos, self.last = infos, {p.source: p.index for p in parts}
        self.first_record, self.records_of, self.done = 0, Counter(), 0

    def place(self, p: Partition, s: PartSummary, digest: Callable[[], tuple[str, int]] | None
              ) -> tuple[ChunkResult, int]:
        """``digest``: the input's (sha256, size), asked once its last range is placed."""
        info = self.infos[p.source]
        self.records_of[p.source] += s.records
        if p.whole:
            info.sha256, info.bytes = s.sha256, s.bytes
        res = shifted(s.result, self.first_record)
        if s.path is not None:
            res.staged = StagedPart(s.path, s.episodes, s.tokens, self.first_record)
        self.done += (p.end - p.start) if not p.whole else s.bytes
        if self.last[p.source] == p.index:  # the input is complete: its numbers are known
            info.first_record, info.records = self.first_record, self.records_of[p.source]
            if digest is not None:
                info.sha256, info.bytes = digest()
            self.first_record += info.records
        return res, self.done


def can_partition(infos: list[SourceInfo], opts: PrepareOptions, curate: CurateSettings) -> bool:
    """``--workers`` > 1 with every input a plain local JSONL file (byte ranges on line
    starts) and no --dedup / --decontaminate (decided on tokens in this process): the
    workers read the input themselves. Otherwise this process reads it and sends records."""
    return (opts.workers > 1 and curate.dedup == "off" and curate.evals is None
            and all(splittable(i) for i in infos))


def local_parts(infos: list[SourceInfo], workers: int) -> list[Partition]:
    """The ranges ``workers`` local workers read, in input order (guided sizes: at most
    ``MAX_PART_BYTES``, then shrinking to ``MIN_PART_BYTES`` towards the end)."""
    return plan_partitions(infos, MAX_PART_BYTES, shrink=(TAIL_WAYS * workers, MIN_PART_BYTES))


def partition_results(infos: list[SourceInfo], opts: PrepareOptions, tok: ChatTokenizer | HFTokenizer,
                      profile: TemplateProfile | None, token_dtype: np.dtype, stage_dir: Path
                      ) -> Iterator[tuple[ChunkResult, int]]:
    """The local engine with ``--workers`` > 1 on plain JSONL: each worker process reads
    its own byte range of the input (``prepare_partition``, as a Ray task does) and hands
    its episodes' tokens over in a file under ``stage_dir`` (removed when read); this
    process numbers the results in input order and writes them, at most 2 x workers ranges
    in flight. This process counts the lines before each range (and hashes the input) as
    it hands the ranges out (``SequentialScan``), so the first range starts at once and
    the workers never wait for a pass over the file."""
    parts = local_parts(infos, opts.workers)
    stage_dir.mkdir(exist_ok=True)
    pool = worker_pool(opts, tok, profile, CurateSettings())
    settings = {**partition_settings(opts, token_dtype), "handoff_dir": str(stage_dir)}
    numbering = PartNumbering(parts, infos)
    with ExitStack() as scans_open:
        scans = {si: scans_open.enter_context(SequentialScan(infos[si].path))
                 for si in sorted({p.source for p in parts if not p.whole and p.start > 0})}

        def jobs() -> Iterator[tuple[Callable, tuple, str, Partition]]:
            for p in parts:  # lazily: the scans count lines as the ranges are handed out
                before = scans[p.source].lines_before(p.start) if p.start else 0  # the first range: line 0
                yield (prepare_partition, (p, [before], 0, None, settings, None),
                       f"{infos[p.source].path}:line {before + 1}", p)

        try:
            with closing(in_order(pool, jobs(), 2 * opts.workers)) as results:  # the pool stops before the rmtree
                for s, p in results:
                    _take_handoff(s, token_dtype)
                    yield numbering.place(p, s, scans[p.source].digest if p.source in scans else None)
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)  # empty after a complete run; else what was handed over
