"""The prepare pipeline: records -> conversations -> episodes -> split -> dataset.

::

    inputs ──read (sources)──► chunks of raw records ──(workers)──► parse + render
        ──► staging shard, in input order ──► exact seeded split ──► train/ val/ shards
        ──► metadata (written last) ──► atomic rename to --output-dir

Chunks are processed by ``workers`` processes but written strictly in input order, so
the output is byte-identical for any number of workers. This process decides on each
chunk's records in input order (duplicates, contamination: ``curate_result``); the
exact split over the accepted episodes is split.py's. Memory is bounded by options, not
by the input (docs/CLI.md has the formula): a few chunks in flight, each at most
``CHUNK_BYTES`` plus one record, and no record longer than ``max_record_bytes`` is ever
held (``sources`` reads past it and it is rejected as ``record_too_large``).
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path

import numpy as np
import orjson

from .. import __version__
from ..chat.serving import check_state_stops
from ..chat.tokenizer import ChatTokenizer, HFTokenizer, engine_record, open_tokenizer
from ..curate import CurateSettings, Deduplicator, load_evals
from ..errors import (
    AllRecordsRejectedError,
    NothingToTrainError,
    NoUsableRecordsError,
    RecordError,
    SftDataError,
    UsageError,
)
from ..records.rejects import REJECT_KEYS, keep_rejects, writing
from ..records.turns import TURN_COUNTS
from ..sources import SourceInfo, expand_inputs, inspect_source, iter_all
from ..store.build_key import BUILD, BuildCheck, library_changes
from ..store.format import PARTS_DIR, REJECTS_FILE, STAGING_SPLIT, TOKENIZER_FILE, token_dtype_for
from ..store.location import local_path, remote_url
from ..store.serving_file import write_serving
from ..store.writer import DatasetWriter
from ..template import TemplateLimits, TemplateProfile, model_profile, require_tool_calls, template_summary, tokenizer_state
from ..tokenize.identity import recorded_identity
from .build import plan_build
from .options import ChunkResult, Executor, PrepareOptions, PrepareSummary, Progress, StagedPart
from .partition_task import can_partition, partition_results
from .pool import chunk_results, chunks_of
from .split import split_assignment, split_parts

MAX_NAMED_MISMATCHES = 100  # rule_mismatch records named in the summary and the metadata


def choose_tokenizer(spec: str | None, chat_template: str | None, train_on: str = "all", engine: str = "auto",
                     variables: dict | None = None, per_reply: bool = False, mode: str = "chat",
                     limits: TemplateLimits | None = None) -> tuple[ChatTokenizer | HFTokenizer, TemplateProfile | None]:
    """The tokenizer ``--tokenizer`` names and, for a model's own tokenizer, the profile of
    the template ``--chat-template`` names (default: the folder's own), learned once here
    and sent to the workers, with ``--template-var`` ``variables``. ``--train-on last``
    makes its rule train each episode's last reply only, ``--per-reply`` serves each reply
    as an episode. ``engine``: ``--tokenizer-engine``; ``limits``: what each render of the
    template runs under. In ``tool`` mode a template that renders no tool call is refused
    here (``require_tool_calls``)."""
    tok = open_tokenizer(spec, engine)
    if isinstance(tok, ChatTokenizer):
        return tok, None
    profile = model_profile(tok, chat_template, variables, last_reply_only=train_on == "last", per_reply=per_reply,
                            limits=limits or TemplateLimits())
    if mode == "tool":
        require_tool_calls(profile)
    return tok, profile


def curate_result(res: ChunkResult, dedup: Deduplicator, evals, contaminated: Counter) -> list[tuple]:
    """The driver's decision on a chunk result, in input order: contaminated records, then
    duplicates of records kept before them, are dropped from ``res`` (in place); returns
    their rejects (record, where, reason, message) and counts the contaminated ones per
    evaluation file in ``contaminated``."""
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
    if drop:
        keep = ~np.isin(res.sources, list(drop))
        tokens = np.repeat(keep, res.lengths)
        res.ids, res.mask = res.ids[tokens], res.mask[tokens]
        res.lengths, res.sources = res.lengths[keep], res.sources[keep]
    return out


def local_results(infos: list[SourceInfo], opts: PrepareOptions, tok: ChatTokenizer | HFTokenizer,
                  profile: TemplateProfile | None, token_dtype: np.dtype, stage_dir: Path,
                  curate: CurateSettings = CurateSettings()) -> Iterator[tuple[ChunkResult, int]]:
    """The local engine: this process reads, ``--workers`` processes render (and compute
    the records' duplicate keys and contamination, ``curate``). With ``--workers`` > 1 on
    plain JSONL the workers read their own byte ranges instead (``partition_results``)."""
    if can_partition(infos, opts, curate):
        return partition_results(infos, opts, tok, profile, token_dtype, stage_dir)
    return chunk_results(chunks_of(iter_all(infos, opts.max_record_bytes)), opts, tok, profile, curate)


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
    return AllRecordsRejectedError(f"every record was rejected ({records:,} read; {top}); nothing was written to "
                                   f"{output_dir}. The reason for each record is in {kept}{hint}",
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
    ``executor`` runs the rendering (default ``local_results``; ``sftdata.engine`` has Ray's):
    the dataset is the same whichever runs it.

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
    if executor is not None and (opts.dedup != "off" or opts.decontaminate):
        raise UsageError("--dedup and --decontaminate run with --engine local (one decision in input order in this "
                         "process); drop them, or prepare with --engine local")
    options = {**opts.recorded(), "tokenizer": tok.path or tok.name}
    plan = plan_build(output_dir, expand_inputs(inputs), opts.decontaminate, state, options, opts.force)
    if plan.check.up_to_date:
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
    curate = CurateSettings(opts.dedup, evals)
    dedup = Deduplicator(opts.dedup, opts.dedup_threshold)
    contaminated: Counter = Counter()  # per evaluation file
    infos: list[SourceInfo] = [inspect_source(src) for src in plan.inputs]
    known = all(i.size_known for i in infos)
    total_bytes = sum(i.bytes for i in infos) if known else None
    dtype = token_dtype_for(tok.vocab_size)  # uint32 for a vocabulary beyond 65,536 ids
    summary = PrepareSummary(output_dir=str(output_dir), max_record_bytes=opts.max_record_bytes,
                             tokenizer_engine=engine_record(tok), memo_mb=opts.memo_mb)
    rejected: Counter = Counter()
    repaired: Counter = Counter()
    turns: Counter = Counter()
    summary.changed = list(plan.check.changes)
    with DatasetWriter(output_dir, overwrite=opts.overwrite or opts.force, wait=opts.wait) as w:
        # no val split to draw (and no engine writing parts of its own): the episodes go straight to
        # train in input order, the shards train's own, with no staging copy to split afterwards
        direct = opts.val_split == 0 and executor is None
        stage_name = "train" if direct else STAGING_SPLIT
        staging = w.split("train", dtype, opts.shard_tokens) if direct else w.split(STAGING_SPLIT, dtype, 1 << 62)
        records = tokens = 0
        parts: list[StagedPart] = []
        rejects = w.path / REJECTS_FILE
        run = (executor or functools.partial(local_results, curate=curate))(infos, opts, tok, profile, dtype,
                                                                          w.path / PARTS_DIR)
        with open(rejects, "wb") as rej, closing(run):  # an engine's tasks stop before the staging is removed
            for res, pos in run:
                if res.rejects and opts.strict:
                    record, where, reason, message = res.rejects[0]
                    raise RecordError(reason, message + " (--strict stops at the first bad record; "
                                      "drop --strict to skip and count bad records)", where, record)
                lines = []
                res.rejects = sorted(res.rejects + curate_result(res, dedup, evals, contaminated))
                for record, where, reason, message in res.rejects:
                    rejected[reason] += 1
                    src = where.rsplit(":", 1)[0]
                    lines.append(orjson.dumps(dict(zip(REJECT_KEYS, (record, src, where, reason, message)))))
                repaired.update(res.repairs)
                turns.update(res.turns)
                summary.records_truncated += res.truncated
                summary.pairs_dropped += res.pairs_dropped
                summary.per_reply_records += res.per_reply_records
                summary.per_reply_episodes += res.per_reply_episodes
                if res.memo is not None:
                    summary.memo.add(res.memo)
                keep = MAX_NAMED_MISMATCHES - len(summary.rule_mismatch)
                summary.rule_mismatch += [{"record": r, "where": wh} for r, wh in res.mismatches[:max(keep, 0)]]
                if lines:
                    with writing(rejects, output_dir):
                        rej.write(b"\n".join(lines) + b"\n")
                if res.staged is not None:
                    parts.append(res.staged)
                elif res.lengths.size:
                    with writing(w.path / stage_name, output_dir):
                        staging.add_many(res.ids, res.mask, res.lengths, res.sources)
                records += res.records
                tokens += int(res.ids.shape[0]) if res.staged is None else res.staged.tokens
                if progress:
                    progress(Progress(pos, total_bytes, records, tokens))
            with writing(rejects, output_dir):
                rej.flush()
        summary.records_read = records
        summary.input_bytes = sum(i.bytes for i in infos)
        summary.rejected = dict(sorted(rejected.items()))
        summary.repaired = dict(sorted(repaired.items()))
        summary.turns = {name: turns[name] for name in TURN_COUNTS}
        with writing(w.path / stage_name, output_dir):
            staged = staging.close()
        n = staged["episodes"] + sum(p.episodes for p in parts)
        if n == 0:
            raise _all_rejected(inputs, records, rejected, rejects, output_dir, w.target)
        is_val = split_assignment(n, opts.val_split, opts.seed)
        if n - int(is_val.sum()) == 0:
            raise UsageError(f"--val-split {opts.val_split} of {n} episodes leaves no training episode; "
                             f"lower --val-split")
        with writing(w.path, output_dir):
            if direct:
                splits_meta = {"train": staged}
            else:
                splits_meta = split_parts(w, staged, parts, is_val, dtype, opts)
            w.write_json(TOKENIZER_FILE, state)
            write_serving(w.path, state, dtype)
        if splits_meta["train"]["trained_tokens"] == 0:
            raise _nothing_trained(splits_meta["train"]["episodes"], rejected, rejects, output_dir, w.target)
        for split, m in splits_meta.items():
            summary.episodes[split] = m["episodes"]
            summary.tokens[split] = m["tokens"]
            summary.trained_tokens[split] = m["trained_tokens"]
            summary.shards[split] = len(m["shards"])
        metadata = {
            "kind": "episodes",
            "created_by": f"sftdata {__version__}",
            "token_dtype": dtype.name,
            "tokenizer": tok.summary() if profile is None else template_summary(tok, profile),
            "tokenizer_identity": recorded_identity(state).as_dict(),  # what a training process checks its tokenizer by
            "splits": splits_meta,
            "sources": [i.as_dict() for i in infos],
            "options": options,
            "counts": {"records_read": records, "episodes": n, "rejected": summary.rejected,
                       "repaired": summary.repaired, "turns": summary.turns,
                       "records_truncated": summary.records_truncated,
                       "pairs_dropped": summary.pairs_dropped},
        }
        summary.dedup = dedup.counts()
        if evals is not None:
            summary.decontamination = {"ngram": evals.n, "files": [
                {**f, "contaminated": contaminated[i]} for i, f in enumerate(evals.describe())]}
            metadata["decontamination"] = summary.decontamination
        if opts.dedup != "off":
            metadata["dedup"] = summary.dedup
        if profile is not None:
            metadata["counts"].update(per_reply_records=summary.per_reply_records,
                                      per_reply_episodes=summary.per_reply_episodes)
            metadata["rule_mismatch"] = summary.rule_mismatch
        metadata[BUILD] = plan.record(infos, state, options)  # from the inputs as read
        summary.build_key = metadata[BUILD]["key"]
        with writing(w.path, output_dir):
            w.commit(metadata)
    summary.seconds = time.perf_counter() - t0
    return summary


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
