"""``prepare-chat`` / ``prepare-tool`` on a Ray cluster (``--engine ray``).

::

    driver: plan partitions ─► one task per partition ───────────────► gather summaries in
            (byte ranges of      reads its bytes itself, renders and     input order, shift
             JSONL on line        masks them (``process_chunk``), and    record numbers, split,
             starts; other        writes its episodes to
             inputs whole)        _parts/part_N.tmp-PID, renamed to _parts/part_N when complete

What crosses the network: the partition descriptors and the tokenizer (pickled, a few
hundred bytes: what rebuilds it; each worker rebuilds it once) to the tasks; back, a
summary per partition (counts, rejected records, the shard's path). Tokens go from the
task straight to the output's staging area; the driver then copies them, in input order,
into the train/val shards (``prepare``'s own split), so the dataset is byte-identical
to ``--engine local`` for any number of workers.

A task whose worker dies is retried by Ray (``max_retries``); the dead attempt's
``.tmp-PID`` folder is never renamed, so its partial files are never read, and the whole
staging area goes when the run commits or fails.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..curate import CurateSettings, concat_keys
from ..errors import UsageError
from ..prepare import ChunkResult, Executor, PrepareOptions, StagedPart, _chunks, process_chunk
from ..sources import SourceInfo
from ..sources.partitions import PART_BYTES, Partition, file_digest, iter_partition, line_counts, plan_partitions
from ..store import SplitWriter
from .cluster import RayCluster, connect, import_ray
from .tasks import STOP_FILE, TASK_RETRIES, get_result, stop_tasks

MIN_PART_BYTES = 1 << 20
PARTS_PER_CPU = 16  # partitions per CPU of the cluster: the last ones to finish leave CPUs idle briefly


@dataclass
class PartSummary:
    """What a partition task sends back (small: no tokens)."""

    index: int
    result: ChunkResult  # ids and mask empty; records numbered from the start of the input
    records: int  # record numbers the partition used (lines, or the whole input's records)
    path: str | None  # the shard folder holding its episodes
    episodes: int = 0
    tokens: int = 0
    sha256: str | None = None  # a whole input: what reading it found
    bytes: int = 0


def part_bytes_for(infos: list[SourceInfo], cpus: int, part_bytes: int | None = None) -> int:
    if part_bytes is not None:
        return part_bytes
    total = sum(i.bytes for i in infos)
    return int(min(PART_BYTES, max(MIN_PART_BYTES, total // (PARTS_PER_CPU * cpus))))


def _empty() -> ChunkResult:
    return ChunkResult(np.empty(0, np.uint32), np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64),
                       [], Counter(), Counter(), 0, 0, 0)


def _merge(acc: ChunkResult | None, res: ChunkResult) -> ChunkResult:
    if acc is None:
        return ChunkResult(np.empty(0, np.uint32), np.empty(0, np.uint8), np.empty(0, np.int64),
                           np.empty(0, np.int64), list(res.rejects), Counter(res.repairs), Counter(res.turns),
                           res.truncated, res.pairs_dropped, res.records, res.per_reply_records,
                           res.per_reply_episodes, list(res.mismatches), keys=res.keys)
    acc.keys = concat_keys(acc.keys, res.keys)
    acc.rejects += res.rejects
    acc.repairs.update(res.repairs)
    acc.turns.update(res.turns)
    acc.truncated += res.truncated
    acc.pairs_dropped += res.pairs_dropped
    acc.records += res.records
    acc.per_reply_records += res.per_reply_records
    acc.per_reply_episodes += res.per_reply_episodes
    acc.mismatches += res.mismatches
    return acc


_TOKENIZERS: dict = {}  # per worker process: tokenizers rebuilt once, not once per task or per run
_KEEP_TOKENIZERS = 4


def _tokenizer(pickled: bytes):
    """The (tokenizer, profile) pickled in ``pickled`` (a few hundred bytes: a tokenizer
    pickles as what rebuilds it), rebuilt on a worker's first task and kept for later
    tasks and runs (rebuilding takes seconds: the ranks are read and checked)."""
    key = hashlib.sha256(pickled).hexdigest()
    got = _TOKENIZERS.get(key)
    if got is None:
        if len(_TOKENIZERS) >= _KEEP_TOKENIZERS:
            _TOKENIZERS.pop(next(iter(_TOKENIZERS)))
        got = _TOKENIZERS[key] = pickle.loads(pickled)  # noqa: S301  (made by this run's driver)
    return got


def prepare_partition(part: Partition, scan, cut: int, tokenizer: bytes, settings: dict, stage_dir: str
                      ) -> PartSummary:
    """One task: render and mask the records of ``part`` into a shard folder of its own
    under ``stage_dir`` (``scan``: ``line_counts`` of its input, ``cut`` its index there;
    ``tokenizer``: the pickled (tokenizer, profile) of the run)."""
    stop = Path(stage_dir) / STOP_FILE
    if stop.exists():
        return PartSummary(part.index, _merge(None, _empty()), 0, None)
    tok, profile = _tokenizer(tokenizer)
    lines_before = scan[cut] if scan is not None and cut >= 0 else 0
    dtype = np.dtype(settings["token_dtype"])
    final = Path(stage_dir) / f"part_{part.index:06d}"
    tmp = Path(stage_dir) / f"part_{part.index:06d}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # not parents: a staging area already removed (the run ended) stays removed
    writer = SplitWriter(tmp, "s", dtype, 1 << 62)
    lines = [0]

    def records():
        for rec, pos in iter_partition(part, lines_before, settings["max_record_bytes"]):
            if rec is None:
                lines[0] = pos
            else:
                yield rec, pos

    acc = None
    for items, _ in _chunks(records()):
        if stop.exists():  # the run stopped (an error, Ctrl-C): write nothing more
            writer.close()
            return PartSummary(part.index, _merge(None, _empty()), 0, None)
        # with the exact-duplicate keys the driver counts (prepare's summary, whatever the engine), from
        # the same parse as the tokens
        res = process_chunk(items, tok, settings["mode"], settings["max_tokens"], settings["policy"], profile,
                            curate=CurateSettings())
        if res.lengths.size:
            writer.add_many(res.ids, res.mask, res.lengths, res.sources)
        acc = _merge(acc, res)
    meta = writer.close()
    if final.exists():  # an earlier attempt completed, but its answer was lost with its worker
        shutil.rmtree(final)
    os.rename(tmp, final)
    if acc is None:
        acc = _merge(None, _empty())
    whole = part.whole
    return PartSummary(part.index, acc, lines[0],
                       str(final / "s" / "shard_00000") if meta["episodes"] else None, meta["episodes"],
                       meta["tokens"], part.info.sha256 if whole else None, part.info.bytes if whole else 0)


def _shifted(res: ChunkResult, first: int) -> ChunkResult:
    if first:
        res.rejects = [(r + first, *rest) for r, *rest in res.rejects]
        res.mismatches = [(r + first, where) for r, where in res.mismatches]
        if res.keys is not None:
            res.keys.records = res.keys.records + first
    return res


def run_partitions(cluster: RayCluster, infos: list[SourceInfo], opts: PrepareOptions, tok, profile,
                   token_dtype: np.dtype, stage_dir: Path, part_bytes: int | None = None
                   ) -> Iterator[tuple[ChunkResult, int]]:
    """The Ray executor's body: submit every partition, then yield the results in input
    order, each shifted to global record numbers, and fill in ``infos``."""
    for info in infos:
        if info.kind == "stdin":
            raise UsageError("--engine ray reads files and URLs, which its tasks open themselves; stdin (-) can only "
                             "be read here: use --engine local, or save the input to a file")
    ray = cluster.ray
    parts = plan_partitions(infos, part_bytes_for(infos, cluster.cpus, part_bytes))
    stage_dir.mkdir(parents=True, exist_ok=True)
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(prepare_partition)
    scan_task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(line_counts)
    digest_task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(file_digest)
    cuts: dict[int, list[int]] = {}
    for p in parts:
        if not p.whole and p.start > 0:
            cuts.setdefault(p.source, []).append(p.start)
    scans = {si: scan_task.remote(infos[si].path, c) for si, c in cuts.items()}
    digests = {si: digest_task.remote(infos[si].path) for si in cuts}  # needed only at the end: nothing waits
    tokenizer = pickle.dumps((tok, profile))
    settings = {"mode": opts.mode, "max_tokens": opts.max_tokens, "policy": opts.policy,
                "max_record_bytes": opts.max_record_bytes, "token_dtype": np.dtype(token_dtype).name}
    cut_of = {(si, c): k for si, cs in cuts.items() for k, c in enumerate(cs)}
    refs = [task.remote(p, scans.get(p.source) if p.start else None,  # the first range starts at line 0
                        cut_of.get((p.source, p.start), -1),
                        tokenizer, settings, str(stage_dir)) for p in parts]
    last = {p.source: p.index for p in parts}
    first_record, records_of, done = 0, Counter(), 0
    got = 0
    try:
        for p, ref in zip(parts, refs):
            s: PartSummary = get_result(ray, ref)
            got += 1
            info = infos[p.source]
            records_of[p.source] += s.records
            if p.whole:
                info.sha256, info.bytes = s.sha256, s.bytes
            res = _shifted(s.result, first_record)
            if s.path is not None:
                res.staged = StagedPart(s.path, s.episodes, s.tokens, first_record)
            done += (p.end - p.start) if not p.whole else s.bytes
            if last[p.source] == p.index:  # the input is complete: its numbers are known
                info.first_record, info.records = first_record, records_of[p.source]
                if p.source in digests:
                    info.sha256, info.bytes = get_result(ray, digests[p.source])
                first_record += info.records
            yield res, done
    finally:
        if got < len(refs):  # stopped early (an error, Ctrl-C): no task may write on into the staging area
            stop_tasks(ray, refs[got:] + list(scans.values()) + list(digests.values()), stage_dir)


def ray_prepare_executor(address: str | None = None, part_bytes: int | None = None) -> Executor:
    """An ``Executor`` for ``sftdata.prepare.prepare`` that runs on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``, else a local one). Without Ray installed, a
    ``UsageError`` now, before anything is read or written."""
    import_ray()

    def run(infos, opts, tok, profile, token_dtype, stage_dir):
        return run_partitions(connect(address), infos, opts, tok, profile, token_dtype, stage_dir, part_bytes)

    return run
