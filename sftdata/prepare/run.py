"""The prepare pipeline: records -> conversations -> episodes -> split -> dataset.

::

    inputs ──read (sources)──► chunks of raw records ──(workers)──► parse + render
        ──► staging shard, in input order ──► exact seeded split ──► train/ val/ shards
        ──► metadata (written last) ──► atomic rename to --output-dir

Chunks are processed by ``workers`` processes but written strictly in input order, so
the output is byte-identical for any number of workers. Where the inputs can be cut
(``can_partition``; ``--engine ray``: always) the run is partitioned instead: the
workers read their own partitions and write the final shards, this process plans and
commits (``partitioned``). This process decides on each result's records in input order
(duplicates, contamination: ``curate_result``); the exact split over the accepted
episodes is split.py's. Memory is bounded by options, not
by the input (docs/CLI.md has the formula): a few chunks in flight, each at most
``CHUNK_BYTES`` plus one record, and no record longer than ``max_record_bytes`` is ever
held (``sources`` reads past it and it is rejected as ``record_too_large``).
"""

from __future__ import annotations

import dataclasses
import heapq
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import numpy as np

from .. import __version__
from ..chat.serving import check_state_stops
from ..chat.tokenizer import ChatTokenizer, HFTokenizer, engine_record
from ..curate import CurateSettings, Deduplicator, load_evals
from ..errors import (
    AllRecordsRejectedError,
    NothingToTrainError,
    NoUsableRecordsError,
    RecordError,
    SftDataError,
    UsageError,
)
from ..records.rejects import (
    NOT_A_RECORD,
    RejectsFile,
    keep_rejects,
    line_record,
    lists_every_reject,
    reject_line,
    writing,
)
from ..records.turns import TURN_COUNTS
from ..sources import SourceInfo, expand_inputs, inspect_source, iter_all
from ..sources.partitions import partitionable, records_sha256
from ..store.build_key import BUILD, BuildCheck, library_changes
from ..store.format import PARTS_DIR, REJECTS_FILE, STAGING_SPLIT, TOKENIZER_FILE, token_dtype_for
from ..store.location import local_path, remote_url
from ..store.serving_file import write_serving
from ..store.writer import DatasetWriter, sweep_beside
from ..tasks import TaskRunner
from ..template import (
    TemplateProfile,
    choose_tokenizer,
    template_summary,
    tokenizer_state,
)
from ..tokenize.identity import recorded_identity
from .build import plan_build
from .options import PrepareOptions
from .partitioned import decide_duplicates, partitioned_results, write_planned
from .pool import PoolRunner, chunk_results, chunks_of
from .results import ChunkResult, Executor, PrepareSummary, Progress, StagedPart
from .split import split_assignment, split_parts

MAX_NAMED_MISMATCHES = 100  # rule_mismatch records named in the summary and the metadata


def curate_result(res: ChunkResult, dedup: Deduplicator, evals, contaminated: Counter) -> list[tuple]:
    """The driver's decision on a chunk result, in input order: contaminated records, then
    duplicates of records kept before them, are dropped from ``res`` (in place; staged
    episodes: its ``keep``); returns their rejects (record, where, reason, message) and
    counts the contaminated ones per evaluation file in ``contaminated``. (A partitioned
    run's duplicates are decided after its last result: ``partitioned.decide_duplicates``.)"""
    keys = res.keys
    if keys is None:
        return []
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
        out.append((d.record, d.where, "duplicate", d.message()))
    if drop and res.staged is not None:
        res.staged = drop_records(res.staged, drop)
    elif drop:
        keep = ~np.isin(res.sources, list(drop))
        tokens = np.repeat(keep, res.lengths)
        res.ids, res.mask = res.ids[tokens], res.mask[tokens]
        res.lengths, res.sources = res.lengths[keep], res.sources[keep]
        res.last_only = None if res.last_only is None else res.last_only[keep]
    return out


def drop_records(part: StagedPart, records) -> StagedPart:
    """``part`` with the episodes of ``records`` left out of what it keeps."""
    keep = ~np.isin(part.sources, np.fromiter(records, dtype=np.int64))
    return dataclasses.replace(part, keep=keep if part.keep is None else part.keep & keep)


def local_results(infos: list[SourceInfo], opts: PrepareOptions, tok: ChatTokenizer | HFTokenizer,
                  profile: TemplateProfile | None, curate: CurateSettings = CurateSettings()
                  ) -> Iterator[tuple[ChunkResult, int]]:
    """The local engine where the inputs are not cut (``can_partition``): this process
    reads, ``--workers`` processes render (and compute the records' duplicate keys and
    contamination, ``curate``)."""
    return chunk_results(chunks_of(iter_all(infos, opts.max_record_bytes)), opts, tok, profile, curate)


def can_partition(infos: list[SourceInfo], opts: PrepareOptions) -> bool:
    """``--workers`` > 1 with every input a file workers can cut (plain local JSONL in byte
    ranges on line starts, local Parquet in row groups): the workers read the input
    themselves (``partitioned``).
    Otherwise this process reads it and sends records."""
    return opts.workers > 1 and all(partitionable(i) for i in infos)


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


def prepare(inputs: Sequence[str | Path], output_dir: str | Path, opts: PrepareOptions,
            progress: Callable[[Progress], None] | None = None, executor: Executor | None = None,
            planned: Callable[[BuildCheck], None] | None = None) -> PrepareSummary:
    """Prepare ``inputs`` into a dataset at ``output_dir``. Raises ``SftDataError``s.
    ``executor`` runs a partitioned run's tasks (default: this process, or ``--workers``
    processes; ``sftdata.engine`` has Ray's): the dataset is the same whichever runs it.

    A target whose metadata holds this run's build key (``store.build_key``) is up to date:
    nothing is read or written, and the summary (``up_to_date``) is the dataset's. Another
    key is refused without ``overwrite`` (``force`` rebuilds regardless), naming what
    changed; ``planned`` is called with the decision to build, and why, before any work.

    When every record is rejected, nothing is created at ``output_dir`` and the reasons go
    to a file beside it that the error names (``AllRecordsRejectedError.rejects_path``)."""
    opts.validate()
    output_dir = remote_url(output_dir) or local_path(output_dir)  # a path, a file:// URL or an object-store URL
    if not inputs:
        raise UsageError("no input files given")
    t0 = time.perf_counter()
    tok, profile = choose_tokenizer(opts.tokenizer, opts.chat_template, opts.train_on, opts.tokenizer_engine,
                                    opts.template_vars, opts.per_reply, opts.mode, opts.template_limits())
    state = tok.state() if profile is None else tokenizer_state(tok, profile)
    check_state_stops(state, opts.allow_pad_as_stop)  # a model that could not learn to stop: refused now
    options = {**opts.recorded(), "tokenizer": tok.path or tok.name}
    plan = plan_build(output_dir, expand_inputs(inputs), opts.decontaminate, state, options, opts.force)
    if plan.check.up_to_date:
        sweep_beside(output_dir)  # nothing to build, but what a killed run left beside it still goes
        meta = plan.check.target.metadata
        summary = PrepareSummary.of_dataset(str(output_dir), meta)
        summary.build_key, summary.libraries_changed = plan.check.key, library_changes(meta)
        summary.seconds = time.perf_counter() - t0
        return summary
    plan.check.refuse_unless(opts.overwrite or opts.force)
    if planned is not None:
        planned(plan.check)
    evals = load_evals(list(opts.decontaminate), opts.decontaminate_ngram, opts.max_record_bytes) \
        if opts.decontaminate else None
    run = _Run(opts, tok, profile, state, [inspect_source(src) for src in plan.inputs], evals, progress, options)
    summary = run.summary
    summary.output_dir = str(output_dir)
    summary.changed = list(plan.check.changes)
    with DatasetWriter(output_dir, overwrite=opts.overwrite or opts.force, wait=opts.wait) as w:
        stage_dir = w.path / PARTS_DIR
        runner = executor.start(opts, tok, profile, stage_dir, run.curate) if executor is not None else \
            PoolRunner(opts, tok, profile, stage_dir, run.curate) if can_partition(run.infos, opts) else None
        done = False
        try:
            run.gather(w, runner, output_dir)
            splits_meta = run.write(w, runner, inputs, output_dir)
            metadata = run.metadata(splits_meta)
            metadata[BUILD] = plan.record(run.infos, state, options)  # from the inputs as read
            summary.build_key = metadata[BUILD]["key"]
            with writing(w.path, output_dir):
                w.commit(metadata)
            done = True
        finally:  # a run that stops early: its tasks stop before the staging is removed
            if runner is not None:
                runner.close(stopped=not done)
    summary.seconds = time.perf_counter() - t0
    return summary


class _Run:
    """One run's state between its steps: ``gather`` (every result in input order: rejects,
    curating, the episodes staged), ``write`` (the exact split, the shards), ``metadata``."""

    def __init__(self, opts: PrepareOptions, tok, profile: TemplateProfile | None, state: dict,
                 infos: list[SourceInfo], evals, progress: Callable[[Progress], None] | None, options: dict):
        self.opts, self.tok, self.profile, self.state, self.infos = opts, tok, profile, state, infos
        self.options = options  # as recorded, and in the build key
        self.evals, self.progress = evals, progress
        self.curate = CurateSettings(opts.dedup, evals)
        self.dedup = Deduplicator(opts.dedup, opts.dedup_threshold)
        self.contaminated: Counter = Counter()  # per evaluation file
        self.dtype = token_dtype_for(tok.vocab_size)  # uint32 for a vocabulary beyond 65,536 ids
        self.summary = PrepareSummary(output_dir="", max_record_bytes=opts.max_record_bytes,
                                      tokenizer_engine=engine_record(tok), memo_mb=opts.memo_mb)
        self.rejected: Counter = Counter()
        self.records = 0
        self.parts: list[StagedPart] = []  # the workers' staged episodes (a partitioned run)
        self.staged = {"episodes": 0}  # this process's staging split (or train itself: ``direct``)
        self.direct = False

    def gather(self, w: DatasetWriter, runner: TaskRunner | None, output_dir) -> None:
        """Every result in input order: --strict, rejects.jsonl, curating, the counts; the
        episodes into this process's staging split, or (a partitioned run) their parts."""
        opts, summary = self.opts, self.summary
        repaired: Counter = Counter()
        turns: Counter = Counter()
        # no val split to draw (and no workers writing parts of their own): the episodes go straight to
        # train in input order, the shards train's own, with no staging copy to split afterwards
        self.direct = opts.val_split == 0 and runner is None
        stage_name = "train" if self.direct else STAGING_SPLIT
        staging = None
        if runner is None:
            staging = w.split("train", self.dtype, opts.shard_tokens) if self.direct else \
                w.split(STAGING_SPLIT, self.dtype, 1 << 62)
        known = all(i.size_known for i in self.infos)
        total_bytes = sum(i.bytes for i in self.infos) if known else None
        tokens = 0
        rejects = w.path / REJECTS_FILE
        results = partitioned_results(self.infos, opts, self.dtype, runner, w.path / PARTS_DIR, str(output_dir)) \
            if runner is not None else local_results(self.infos, opts, self.tok, self.profile, self.curate)
        with open(rejects, "wb") as f, closing(results):
            rej = RejectsFile(f)  # bounded: past its size, rejects are counted only
            for res, pos in results:
                if res.rejects and opts.strict:
                    record, where, reason, message = res.rejects[0]
                    raise RecordError(reason, message + " (--strict stops at the first bad record; "
                                      "drop --strict to skip and count bad records)", where, record)
                lines = []
                res.rejects = sorted(res.rejects + curate_result(res, self.dedup, self.evals, self.contaminated))
                for record, where, reason, message in res.rejects:
                    self.rejected[reason] += 1
                    lines.append(reject_line(record, where, reason, message))
                repaired.update(res.repairs)
                turns.update(res.turns)
                summary.records_truncated += res.truncated
                summary.pairs_dropped += res.pairs_dropped
                summary.per_reply_records += res.per_reply_records
                summary.per_reply_episodes += res.per_reply_episodes
                summary.per_reply_automatic += res.per_reply_automatic
                if res.memo is not None:
                    summary.memo.add(res.memo)
                keep = MAX_NAMED_MISMATCHES - len(summary.rule_mismatch)
                summary.rule_mismatch += [{"record": r, "where": wh} for r, wh in res.mismatches[:max(keep, 0)]]
                if lines:
                    with writing(rejects, output_dir):
                        rej.write(b"\n".join(lines) + b"\n")
                if res.staged is not None:
                    self.parts.append(res.staged)
                elif res.lengths.size:
                    with writing(w.path / stage_name, output_dir):
                        staging.add_many(res.ids, res.mask, res.lengths, res.sources, res.last_only)
                self.records += res.records
                tokens += int(res.ids.shape[0]) if res.staged is None else res.staged.tokens
                if self.progress:
                    self.progress(Progress(pos, total_bytes, self.records, tokens))
            with writing(rejects, output_dir):
                rej.close()
                rej.flush()
        if runner is not None:  # the duplicates of a partitioned run: decided over every partition's keys
            self._drop_duplicates(runner, rejects, w.path / PARTS_DIR, output_dir, rej.left_out)
        summary.records_read = self.records
        summary.input_bytes = sum(i.bytes for i in self.infos)
        summary.rejected = dict(sorted(self.rejected.items()))
        summary.repaired = dict(sorted(repaired.items()))
        summary.turns = {name: turns[name] for name in TURN_COUNTS}
        if staging is not None:
            with writing(w.path / stage_name, output_dir):
                self.staged = staging.close()
        for info in self.infos:
            if not records_sha256(info, opts.source_sha256):  # a large file read in partitions: its block hash
                info.sha256 = None

    def _drop_duplicates(self, runner: TaskRunner, rejects: Path, stage_dir: Path, output_dir, left_out: int) -> None:
        """A partitioned run's duplicates (``decide_duplicates``) left out of the parts, and
        their rejects merged into ``rejects`` in record order, under the same size bound as
        a one-process run's (``left_out``: the rejects the file had no room for already).
        The stored lines are the first of all rejects in record order, as one process
        writes them: those dropped for room were past every line kept."""
        drops = decide_duplicates(runner, self.parts, self.dedup, [i.as_dict() for i in self.infos])
        if not drops:
            return
        dropped = {d.record for d in drops}
        self.parts = [drop_records(p, dropped) if p.keys_dir is not None else p for p in self.parts]
        self.rejected["duplicate"] += len(drops)
        lines = [(d.record, reject_line(d.record, d.where, "duplicate", d.message())) for d in drops]
        merged = stage_dir / REJECTS_FILE
        with writing(merged, output_dir), open(rejects, "rb") as old, open(merged, "wb") as out:
            earlier = ((r, line.rstrip(b"\n")) for line in old if (r := line_record(line)) != NOT_A_RECORD)
            capped = RejectsFile(out)
            for _, line in heapq.merge(earlier, lines, key=lambda x: x[0]):
                capped.write(line + b"\n")
            capped.left_out += left_out
            capped.close()
        os.replace(merged, rejects)

    def write(self, w: DatasetWriter, runner: TaskRunner | None, inputs, output_dir) -> dict:
        """The exact split over the kept episodes, and the splits' shards (written by the
        workers in a partitioned run); returns each split's metadata."""
        opts = self.opts
        n = self.staged["episodes"] + sum(p.kept for p in self.parts)
        rejects = w.path / REJECTS_FILE
        if n == 0:
            raise _all_rejected(inputs, self.records, self.rejected, rejects, output_dir, w.target)
        is_val = split_assignment(n, opts.val_split, opts.seed)
        if n - int(is_val.sum()) == 0:
            raise UsageError(f"--val-split {opts.val_split} of {n} episodes leaves no training episode; "
                             f"lower --val-split")
        with writing(w.path, output_dir):
            if self.direct:
                splits_meta = {"train": self.staged}
            elif runner is not None:
                splits_meta = write_planned(runner, w.path, w.path / PARTS_DIR, self.parts, is_val, self.dtype, opts,
                                            str(output_dir), direct=w.direct_upload)
            else:
                splits_meta = split_parts(w, self.staged, self.parts, is_val, self.dtype, opts)
            w.write_json(TOKENIZER_FILE, self.state)
            write_serving(w.path, self.state, self.dtype)
        if splits_meta["train"]["trained_tokens"] == 0:
            raise _nothing_trained(splits_meta["train"]["episodes"], self.rejected, rejects, output_dir, w.target)
        return splits_meta

    def metadata(self, splits_meta: dict) -> dict:
        """The dataset's metadata (the summary's figures filled in on the way)."""
        summary, opts, tok, profile = self.summary, self.opts, self.tok, self.profile
        for split, m in splits_meta.items():
            summary.episodes[split] = m["episodes"]
            summary.tokens[split] = m["tokens"]
            summary.trained_tokens[split] = m["trained_tokens"]
            summary.shards[split] = len(m["shards"])
        metadata = {
            "kind": "episodes",
            "created_by": f"sftdata {__version__}",
            "token_dtype": self.dtype.name,
            "tokenizer": tok.summary() if profile is None else template_summary(tok, profile),
            "tokenizer_identity": recorded_identity(self.state, tok).as_dict(),  # what a training process checks its tokenizer by
            "splits": splits_meta,
            "sources": [i.as_dict() for i in self.infos],
            "options": self.options,
            "counts": {"records_read": self.records, "episodes": sum(m["episodes"] for m in splits_meta.values()),
                       "rejected": summary.rejected, "repaired": summary.repaired, "turns": summary.turns,
                       "records_truncated": summary.records_truncated,
                       "pairs_dropped": summary.pairs_dropped},
        }
        summary.dedup = self.dedup.counts()
        if self.evals is not None:
            summary.decontamination = {"ngram": self.evals.n, "files": [
                {**f, "contaminated": self.contaminated[i]} for i, f in enumerate(self.evals.describe())]}
            metadata["decontamination"] = summary.decontamination
        if opts.dedup != "off":
            metadata["dedup"] = summary.dedup
        if profile is not None:
            metadata["counts"].update(per_reply_records=summary.per_reply_records,
                                      per_reply_episodes=summary.per_reply_episodes,
                                      per_reply_automatic=summary.per_reply_automatic)
            metadata["rule_mismatch"] = summary.rule_mismatch
        return metadata


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
