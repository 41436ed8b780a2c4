"""One driver builds every kind of dataset: episodes (prepare-chat, prepare-tool), preference
pairs and KTO rows (prepare-pref) and RL prompts (prepare-rl).

::

    inputs ──read (sources)──► chunks of raw records ──(the kind, on workers)──► outcomes
        ──► in input order: --strict, curation (contamination, then duplicates), the
            kind's own decisions, rejects.jsonl ──► the kept rows staged
        ──► exact seeded split (split.py) ──► train/ val/ shards ──► tokenizer files
        ──► metadata with the build key (written last) ──► atomic rename to --output-dir

The driver knows a kind only through ``RowKind``: how a chunk of records becomes outcomes
(in this process, in ``--workers`` processes, or on a cluster), what it keeps of them
(``accept``: the rows, one or more sequences each, with their kind's extras), and its
summary's and metadata's own figures. Chunks are processed by workers but decided on
strictly in input order, so the output is byte-identical for any number of workers. A
kind may run partitioned (``runner_of``): the workers read their own partitions
and write the final shards, this process plans and commits (``partitioned``).
"""

from __future__ import annotations

import heapq
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, nullcontext
from pathlib import Path
from typing import Protocol

import numpy as np

from .. import __version__
from ..curate import CurateSettings, Deduplicator, Drop, load_evals
from ..errors import AllRecordsRejectedError, NothingToTrainError, NoUsableRecordsError, RecordError, SftDataError, UsageError
from ..records.rejects import NOT_A_RECORD, RejectsFile, keep_rejects, line_record, lists_every_reject, reject_line, writing
from ..sources import SourceInfo, expand_inputs, inspect_source, iter_all, record_where
from ..sources.partitions import partitionable, records_sha256
from ..storage.location import local_path, remote_url
from ..store.build_key import BUILD, BuildCheck, library_changes
from ..store.format import PARTS_DIR, REJECTS_FILE, STAGING_SPLIT, TOKENIZER_FILE, token_dtype_for
from ..store.rows import Rows
from ..store.serving_file import write_serving
from ..store.writer import DatasetWriter, sweep_beside
from ..tasks import TaskRunner, in_order, overlapped, running
from ..template import template_summary
from ..tokenize.identity import recorded_identity
from .build import plan_build
from .partitioned import decide_duplicates, partitioned_results, write_planned
from .pool import PoolRunner, chunks_of, worker_task
from .results import Progress, StagedPart
from .split import add_rows, open_split, split_assignment, split_staged

STRICT = " (--strict stops at the first bad record; drop --strict to skip and count bad records)"


class RowKind(Protocol):
    """A kind of row, as the driver knows it. ``open`` sets ``tok``, ``profile`` and
    ``state`` (the tokenizer, its template profile, the recorded tokenizer state)."""

    build_kind: str  # the build key's kind: "episodes", "pairs" (pairs and KTO rows), "prompts"
    item: str  # what a row is called in messages: "episode", "row"
    same: str  # how a duplicate's message names what it repeats ("the same conversation as")
    trains: bool  # a train split that trains no token is refused (RL prompts train none)
    remote: bool  # may be written to object storage
    empty_val: bool  # --val-split > 0 gives a val split even when it draws no row
    records_dedup: bool  # the metadata records the dedup counts even with --dedup off
    counts_tokens: bool  # the progress counts tokens (else records only)
    local_parts: bool  # --workers processes read their own partitions where the inputs can be cut
    tok: object
    profile: object
    state: dict
    store_kind: str | None  # the dataset's kind (pairs or kto: decided by the first kept row)
    summary_type: type  # its summary's class; ``of_dataset``: the summary of a dataset found up to date

    # what a worker or partition task makes rows with (chunk.EpisodeWork, pref.run.PairWork), set by ``open``;
    # and what makes a worker's memo of encoded texts (pool.start_worker's ``opts``; None: no memo)
    work: object
    memo_opts: object

    def open(self) -> None: ...
    def local(self, curate: CurateSettings) -> AbstractContextManager: ...  # (start, finish) of a chunk here
    # a chunk's or partition's rows but those of ``drop``, counted; the kind's own rejects (record order)
    def accept(self, chunk, drop: set[int]) -> tuple[list, Rows | StagedPart | None]: ...
    def new_summary(self, output_dir: str): ...
    # the summary filled in; the metadata's entries before "splits", its counts, its entries after "splits"
    def finish(self, summary, splits: dict, infos: list[SourceInfo]) -> tuple[dict, dict, dict]: ...


def strict_error(reject: tuple) -> RecordError:
    record, where, reason, message = reject
    return RecordError(reason, message + STRICT, where, record)


def curate(chunk, dedup: Deduplicator, evals, contaminated: Counter, same: str) -> tuple[list, set[int]]:
    """The driver's decision on a chunk's records, in input order: contaminated records,
    then duplicates of records kept before them; returns their rejects (record, where,
    reason, message) and records, and counts the contaminated ones per evaluation file in
    ``contaminated``. (A partitioned run's duplicates are decided after its last result:
    ``partitioned.decide_duplicates``.)"""
    keys = chunk.keys
    if keys is None:
        return [], set()
    out, drop = [], set()
    for record, where, item, shared in keys.contaminated:
        fi, number, ewhere = evals.items[item]
        contaminated[fi] += 1
        drop.add(record)
        out.append((record, where, "contaminated", f"shares the {evals.n}-word sequence \"{shared}\" with item "
                    f"{number} of the evaluation file {evals.files[fi]} ({ewhere}); dropped so that the evaluation "
                    f"stays unseen"))
    if drop:
        keys = keys.subset(~np.isin(keys.records, list(drop)))
    for d in dedup.decide(keys):
        drop.add(d.record)
        out.append(_duplicate(d, same))
    return out, drop


def _duplicate(d: Drop, same: str) -> tuple:
    """The reject of the duplicate ``d``, naming what it repeats as the kind's ``same`` does."""
    return d.record, d.where, "duplicate", d.message().replace("the same conversation as", same)


def can_partition(infos: list[SourceInfo], opts) -> bool:
    """``--workers`` > 1 with every input a file workers can cut (plain local JSONL in byte
    ranges on line starts, local Parquet in row groups): the workers read the input
    themselves (``partitioned``).
    Otherwise this process reads it and sends records."""
    return opts.workers > 1 and all(partitionable(i) for i in infos)


def runner_of(kind: RowKind, opts, infos: list[SourceInfo], stage_dir: Path, curate: CurateSettings, executor
              ) -> TaskRunner | None:
    """A partitioned run's runner, its tasks making rows with the kind's ``work``: the
    engine's (``executor``), or ``--workers`` processes where the kind has them read the
    inputs and the inputs can be cut; None: this process reads the inputs in chunks."""
    if executor is not None:
        return executor.start(opts, kind.work, stage_dir, curate)
    if kind.local_parts and can_partition(infos, opts):
        return PoolRunner(opts.workers, (kind.work, curate, kind.memo_opts), stage_dir)
    return None


def chunk_results(kind: RowKind, chunks: Iterator, opts, curate: CurateSettings) -> Iterator[tuple[object, int]]:
    """The kind's outcome of each chunk, in input order: in this process (each chunk
    finished while the next one starts: ``overlapped``), or in ``--workers`` processes
    (at most 2 x workers chunks in flight)."""
    if opts.workers <= 1:
        with kind.local(curate) as (start, finish):
            for started, pos in overlapped(chunks, start):
                yield finish(started), pos
        return
    with running(PoolRunner(opts.workers, (kind.work, curate, kind.memo_opts))) as runner:
        yield from in_order(runner, worker_task, (((items,), f"the records from {items[0].where} on were being "
                                                   f"prepared", pos) for items, pos in chunks))


def build(kind: RowKind, inputs: Sequence[str | Path], output_dir: str | Path, opts,
          progress: Callable[[Progress], None] | None = None, planned: Callable[[BuildCheck], None] | None = None,
          executor=None):
    """Build ``inputs`` into a dataset of ``kind`` at ``output_dir``; returns the kind's
    summary. Raises ``SftDataError``s.

    A target whose metadata holds this run's build key (``store.build_key``) is up to date:
    nothing is read or written, and the summary (``up_to_date``) is the dataset's. Another
    key is refused without ``overwrite`` (``force`` rebuilds regardless), naming what
    changed; ``planned`` is called with the decision to build, and why, before any work.
    When every record is rejected, nothing is created at ``output_dir`` and the reasons go
    to a file beside it that the error names (``AllRecordsRejectedError.rejects_path``)."""
    if not inputs:
        raise UsageError("no input files given")
    output_dir = (remote_url(output_dir) if kind.remote else None) or local_path(output_dir)
    t0 = time.perf_counter()
    kind.open()
    options = {**opts.recorded(), "tokenizer": kind.tok.path or kind.tok.name}
    plan = plan_build(output_dir, expand_inputs(inputs), opts.decontaminate, kind.state, options, opts.force,
                      kind=kind.build_kind)
    if plan.check.up_to_date:
        sweep_beside(output_dir)  # nothing to build, but what a killed run left beside it still goes
        meta = plan.check.target.metadata
        summary = kind.summary_type.of_dataset(str(output_dir), meta)
        summary.build_key, summary.libraries_changed = plan.check.key, library_changes(meta)
        summary.seconds = time.perf_counter() - t0
        return summary
    plan.check.refuse_unless(opts.overwrite or opts.force)
    if planned is not None:
        planned(plan.check)
    evals = load_evals(list(opts.decontaminate), opts.decontaminate_ngram, opts.max_record_bytes) \
        if opts.decontaminate else None
    run = _Build(kind, opts, [inspect_source(src) for src in plan.inputs], evals, progress, str(output_dir))
    run.summary.changed = list(plan.check.changes)
    with DatasetWriter(output_dir, overwrite=opts.overwrite or opts.force, wait=opts.wait) as w:
        runner = runner_of(kind, opts, run.infos, w.path / PARTS_DIR, run.curate, executor)
        # a run that stops early: its tasks stop before the staging is removed
        with running(runner) if runner is not None else nullcontext():
            run.gather(w, runner)
            metadata = run.metadata(run.write(w, runner, inputs), options)
            metadata[BUILD] = plan.record(run.infos, kind.state, options)  # from the inputs as read
            run.summary.build_key = metadata[BUILD]["key"]
            with writing(w.path, output_dir):
                w.commit(metadata)
    run.summary.seconds = time.perf_counter() - t0
    return run.summary


class _Build:
    """One build's state between its steps: ``gather`` (every outcome in input order:
    rejects, curating, the rows staged), ``write`` (the exact split, the shards),
    ``metadata``."""

    def __init__(self, kind: RowKind, opts, infos: list[SourceInfo], evals, progress, output: str):
        self.kind, self.opts, self.infos, self.evals, self.progress, self.output = kind, opts, infos, evals, progress, output
        self.curate = CurateSettings(opts.dedup, evals)
        self.dedup = Deduplicator(opts.dedup, opts.dedup_threshold)
        self.contaminated: Counter = Counter()  # per evaluation file
        self.dtype = token_dtype_for(kind.tok.vocab_size)  # uint32 for a vocabulary beyond 65,536 ids
        self.summary = kind.new_summary(output)
        self.rejected: Counter = Counter()
        self.records = 0
        self.parts: list[StagedPart] = []  # the workers' staged rows (a partitioned run)
        self.staging = None  # this process's staging split (or train itself: ``direct``)
        self.staged: dict | None = None
        self.direct = False
        # a vision model's dataset: every shard holds its media table (store.format.MEDIA_FILE)
        self.media = getattr(kind.profile, "processor", None) is not None

    def _stage(self, w: DatasetWriter, rows: Rows) -> None:
        if self.staging is None:
            kind, opts = self.kind.store_kind, self.opts
            self.staging = open_split(w.path, kind, "train", self.dtype, opts.shard_tokens, self.media) \
                if self.direct else open_split(w.path, kind, STAGING_SPLIT, self.dtype, 1 << 62)
        with writing(w.path / ("train" if self.direct else STAGING_SPLIT), self.output):
            add_rows(self.staging, rows)

    def _results(self, runner: TaskRunner | None, stage_dir: Path) -> Iterator:
        if runner is not None:
            return partitioned_results(self.infos, self.opts, self.dtype, runner, stage_dir, self.output)
        chunks = chunks_of(iter_all(self.infos, self.opts.max_record_bytes))
        return chunk_results(self.kind, chunks, self.opts, self.curate)

    def gather(self, w: DatasetWriter, runner: TaskRunner | None) -> None:
        """Every outcome in input order: --strict, rejects.jsonl, curating, the kind's
        decisions; the kept rows into this process's staging split, or (a partitioned run,
        once its duplicates are decided: ``_settle``) their parts."""
        opts = self.opts
        # no val split to draw (and no workers writing parts of their own): the rows go straight to train in
        # input order, the shards train's own, with no staging copy to split afterwards
        self.direct = opts.val_split == 0 and runner is None
        total = sum(i.bytes for i in self.infos) if all(i.size_known for i in self.infos) else None
        tokens, pending = 0, []
        rejects = self.rejects = w.path / REJECTS_FILE
        with open(rejects, "wb") as f, closing(self._results(runner, w.path / PARTS_DIR)) as results:
            rej = RejectsFile(f)  # bounded: past its size, rejects are counted only
            for res, pos in results:
                if res.rejects and opts.strict and runner is not None:
                    raise strict_error(min(res.rejects))
                curated, drop = curate(res, self.dedup, self.evals, self.contaminated, self.kind.same)
                if runner is not None:
                    pending.append((res, drop))
                    self._reject(rej, res.rejects + curated)
                    tokens += sum(p.tokens for p in res.staged.values()) if self.kind.counts_tokens else 0
                else:
                    tokens += self._take(w, rej, res, drop, curated)
                self.records += res.records
                if self.progress:
                    self.progress(Progress(pos, total, self.records, tokens))
            with writing(rejects, self.output):
                rej.close()
                rej.flush()
        if runner is not None:  # the duplicates of a partitioned run: decided over every partition's keys
            self._settle(runner, pending, rejects, w.path / PARTS_DIR, rej.left_out)
        if self.staging is not None:
            with writing(w.path / ("train" if self.direct else STAGING_SPLIT), self.output):
                self.staged = self.staging.close()
        for info in self.infos:
            if not records_sha256(info, getattr(opts, "source_sha256", False)):  # a large file read in partitions
                info.sha256 = None

    def _counted(self, rejects: list) -> list[tuple[int, bytes]]:
        """``rejects`` (record, where, reason, message) counted; (record, line) of each, in record order."""
        out = []
        for record, where, reason, message in sorted(rejects):
            self.rejected[reason] += 1
            out.append((record, reject_line(record, where, reason, message)))
        return out

    def _reject(self, rej: RejectsFile, rejects: list) -> None:
        """``rejects`` (record, where, reason, message) counted and written in record order."""
        lines = [line for _, line in self._counted(rejects)]
        if lines:
            with writing(self.rejects, self.output):
                rej.write(b"\n".join(lines) + b"\n")

    def _take(self, w: DatasetWriter, rej: RejectsFile, res, drop: set[int], curated: list) -> int:
        """What the kind keeps of ``res`` but ``drop``, staged; returns its tokens (progress)."""
        own, rows = self.kind.accept(res, drop)
        if (res.rejects or own) and self.opts.strict:  # the first bad record, whichever step found it
            raise strict_error(min(res.rejects + own))
        self._reject(rej, res.rejects + curated + own)
        if rows is None or not rows.size:
            return 0
        self._stage(w, rows)
        return int(rows.ids.shape[0]) if self.kind.counts_tokens else 0

    def _settle(self, runner: TaskRunner, pending: list, rejects: Path, stage_dir: Path, left_out: int) -> None:
        """A partitioned run's results decided: its duplicates (``decide_duplicates``, over
        every partition's keys) and the kind's own decisions, each result's rows but those
        left out as its parts; their rejects merged into ``rejects`` in record order, under
        the same size bound as a one-process run's (``left_out``: the rejects the file had
        no room for already). The stored lines are the first of all rejects in record
        order, as one process writes them: those dropped for room were past every line kept."""
        keyed = [_keys_part(res) for res, _ in pending if res.staged]
        sources = [i.as_dict() for i in self.infos]
        drops = decide_duplicates(runner, keyed, self.dedup, sources)
        found = [_duplicate(d, self.kind.same) for d in drops]  # with the kind's own rejects
        dups = np.array(sorted(d.record for d in drops), dtype=np.int64)
        for res, drop in pending:
            if dups.size and res.staged:
                src = _keys_part(res).sources
                drop = drop | set(dups[(dups >= src[0]) & (dups <= src[-1])].tolist())
            own, part = self.kind.accept(res, drop)
            own = [(r, where or record_where(sources, r), *rest) for r, where, *rest in own]  # a task's: no where
            if own and self.opts.strict:
                raise strict_error(own[0])
            found += own
            if part is not None:
                self.parts.append(part)
        lines = self._counted(found)
        if not lines:
            return
        merged = stage_dir / REJECTS_FILE
        with writing(merged, self.output), open(rejects, "rb") as old, open(merged, "wb") as out:
            earlier = ((r, line.rstrip(b"\n")) for line in old if (r := line_record(line)) != NOT_A_RECORD)
            capped = RejectsFile(out)
            for _, line in heapq.merge(earlier, lines, key=lambda x: x[0]):
                capped.write(line + b"\n")
            capped.left_out += left_out
            capped.close()
        os.replace(merged, rejects)

    def write(self, w: DatasetWriter, runner: TaskRunner | None, inputs) -> dict:
        """The exact split over the kept rows, and the splits' shards (written by the
        workers in a partitioned run); returns each split's metadata."""
        opts, kind, output = self.opts, self.kind, self.output
        staged = self.staged or {}
        n = staged.get("rows", staged.get("episodes", 0)) + sum(p.kept for p in self.parts)
        rejects = w.path / REJECTS_FILE
        if n == 0:
            raise _all_rejected(inputs, self.records, self.rejected, rejects, output, w.target)
        is_val = split_assignment(n, opts.val_split, opts.seed)
        if n - int(is_val.sum()) == 0:
            raise UsageError(f"--val-split {opts.val_split} of {n} {kind.item}s leaves no training {kind.item}; "
                             f"lower --val-split")
        val = opts.val_split > 0 if kind.empty_val else bool(is_val.any())
        with writing(w.path, output):
            if self.direct:
                splits = {"train": self.staged}
            elif runner is not None:
                splits = write_planned(runner, w.path, w.path / PARTS_DIR, self.parts, is_val, self.dtype, opts,
                                       output, kind.store_kind, val, direct=w.direct_upload, media=self.media)
            else:
                splits = split_staged(w.path, kind.store_kind, self.staged, self.parts, is_val, self.dtype, val,
                                      opts.shard_tokens, self.media)
            w.write_json(TOKENIZER_FILE, kind.state)
            write_serving(w.path, kind.state, self.dtype)
        if kind.trains and splits["train"]["trained_tokens"] == 0:
            raise _nothing_trained(splits["train"]["episodes"], self.rejected, rejects, output, w.target)
        return splits

    def metadata(self, splits: dict, options: dict) -> dict:
        """The dataset's metadata (the summary's figures filled in on the way)."""
        kind, summary, tok, profile = self.kind, self.summary, self.kind.tok, self.kind.profile
        summary.records_read = self.records
        summary.rejected = dict(sorted(self.rejected.items()))
        summary.dedup = self.dedup.counts()
        before, counts, after = kind.finish(summary, splits, self.infos)
        metadata = {
            "kind": kind.store_kind,
            "created_by": f"sftdata {__version__}",
            "token_dtype": self.dtype.name,
            "tokenizer": tok.summary() if profile is None else template_summary(tok, profile),
            "tokenizer_identity": recorded_identity(kind.state, tok).as_dict(),  # what a training process checks
            **before,
            "splits": splits,
            **after,
            "sources": [i.as_dict() for i in self.infos],
            "options": options,
            "counts": {"records_read": self.records, "rejected": summary.rejected, **counts},
        }
        if self.evals is not None:
            summary.decontamination = {"ngram": self.evals.n, "files": [
                {**f, "contaminated": self.contaminated[i]} for i, f in enumerate(self.evals.describe())]}
            metadata["decontamination"] = summary.decontamination
        if kind.records_dedup or self.opts.dedup != "off":
            metadata["dedup"] = summary.dedup
        return metadata


def _keys_part(res) -> StagedPart:
    """The staged part that holds a partition's duplicate keys, with the records of all its
    rows (of every kind it staged), for ``decide_duplicates``."""
    parts = list(res.staged.values())
    if len(parts) == 1:
        return parts[0]
    return StagedPart("", 0, 0, parts[0].record_offset, sources=np.sort(np.concatenate([p.sources for p in parts])),
                      keys_dir=parts[0].keys_dir)


def _all_rejected(inputs, records: int, rejected: Counter, rejects: Path, output_dir, beside: Path) -> SftDataError:
    if records == 0:
        names = ", ".join(str(p) for p in inputs)
        return NoUsableRecordsError(f"no records in {names} (an empty file, only blank lines, or []); nothing "
                                    f"to write. Give JSONL (one conversation per line) or a JSON array of "
                                    f"conversations")
    kept = keep_rejects(rejects, beside)
    top = ", ".join(f"{r}: {c}" for r, c in rejected.most_common(5))
    hint = (". The records hold tool calls or results: prepare them with `sftdata prepare-tool`"
            if rejected.get("tool_conversation", 0) * 2 > records else "")
    where = (f"The reason for each record is in {kept}" if lists_every_reject(kept) else
             f"The first rejects are listed with their reasons in {kept}; its size bound left the rest out (the "
             f"counts above count every one)")
    return AllRecordsRejectedError(f"every record was rejected ({records:,} read; {top}); nothing was written to "
                                   f"{output_dir}. {where}{hint}",
                                   str(kept), dict(rejected))


def _nothing_trained(episodes: int, rejected: Counter, rejects: Path, output_dir, beside: Path) -> SftDataError:
    """The train split's mask trains no token: a dataset that would train nothing."""
    kept = f"; the records rejected are listed in {keep_rejects(rejects, beside)}" if rejected else ""
    return NothingToTrainError(f"the {episodes:,} train episodes hold 0 trained tokens (the mask trains no assistant "
                               f"reply), so a model would learn nothing from them; nothing was written to "
                               f"{output_dir}{kept}. Check that the records hold assistant replies after user or "
                               f"tool turns")


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def usable_workers(workers: int | None, warn: Callable[[str], None] | None = None) -> int:
    """``--workers`` as run (the CLI's and the scripts'): all cores when not given; more than
    the cores are capped (``warn`` is told so), as more processes than cores only cost
    memory and start-up."""
    cores = default_workers()
    if workers is not None and workers > cores and warn is not None:
        warn(f"--workers {workers}: this machine gives sftdata {cores} core(s); using {cores}")
    return cores if workers is None else min(workers, cores)
