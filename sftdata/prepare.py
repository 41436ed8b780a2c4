"""The prepare pipeline: records -> conversations -> episodes -> split -> dataset.

::

    inputs ──read (sources)──► chunks of raw records ──(workers)──► parse + render
        ──► staging shard, in input order ──► exact seeded split ──► train/ val/ shards
        ──► metadata (written last) ──► atomic rename to --output-dir

Chunks are processed by ``workers`` processes but written strictly in input order, so
the output is byte-identical for any number of workers. The split is exact over the
accepted episodes: ``round(val_split * n)`` of them, chosen by
``RandomState(seed).permutation(n)``, each split keeping input order. Memory is bounded
by options, not by the input (docs/CLI.md has the formula): a few chunks in flight,
each at most ``CHUNK_BYTES`` plus one record, and no record longer than
``max_record_bytes`` is ever held (``sources`` reads past it and it is rejected as
``record_too_large``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import pickle
import shutil
import signal
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import orjson

from . import __version__
from .conversation import parse_record
from .curate import (
    DEDUP_MODES,
    DEFAULT_NGRAM,
    DEFAULT_THRESHOLD,
    CurateSettings,
    Deduplicator,
    RecordKeys,
    concat_keys,
    conversation_keys,
    load_evals,
)
from .errors import (
    AllRecordsRejectedError,
    NothingToTrainError,
    NoUsableRecordsError,
    RecordError,
    SftDataError,
    UsageError,
)
from .lifetime import die_with_parent
from .memo import DEFAULT_MEMO_MB, POLICIES, MemoStats, SegmentMemo
from .order import DEFAULT_SEED
from .rejects import REJECT_KEYS, keep_rejects, writing
from .render import render_chunk
from .serving import check_state_stops
from .sources import DEFAULT_MAX_RECORD_BYTES, RawRecord, SourceInfo, expand_inputs, inspect_source, iter_all
from .sources.partitions import Partition, SequentialScan, iter_partition, plan_partitions, splittable
from .store import (
    DEFAULT_SHARD_TOKENS,
    REJECTS_FILE,
    TOKENIZER_FILE,
    DatasetWriter,
    Shard,
    SplitWriter,
    local_path,
    remote_url,
    token_dtype_for,
    write_serving,
)
from .template import TemplateProfile, model_profile, records_episodes, template_summary, tokenizer_state
from .tokenizer import ChatTokenizer, HFTokenizer, engine_record, is_model_tokenizer_spec, open_tokenizer
from .tokenizer_engine import check_engine
from .turns import REASONING_POLICIES, TRAIN_ON, TURN_COUNTS, TurnPolicy

CHUNK_RECORDS = 512
CHUNK_BYTES = 1 << 20
COPY_TOKENS = 1 << 20  # tokens read at once when splitting the staging shard (bounds memory)
PARTS_DIR = "_parts"  # where an engine's tasks write their episodes (removed before the commit)
STOP_FILE = "STOP"  # in PARTS_DIR: the run has stopped, tasks write nothing more (engine.tasks: the same)
# --workers > 1 on plain JSONL: the input is cut into ranges of at most MAX_PART_BYTES (a range's tokens come back
# whole; the progress bar moves once per range), each at most 1/(TAIL_WAYS x workers) of what is left and at least
# MIN_PART_BYTES, so that the last ranges are small and the workers finish together
MAX_PART_BYTES = 4 << 20
MIN_PART_BYTES = 256 << 10
TAIL_WAYS = 2
MAX_NAMED_MISMATCHES = 100  # rule_mismatch records named in the summary and the metadata


@dataclass(frozen=True)
class PrepareOptions:
    mode: str = "chat"  # "chat" | "tool"
    val_split: float = 0.0
    seed: int = DEFAULT_SEED
    max_tokens: int | None = None
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    tokenizer: str | None = None
    workers: int = 1
    strict: bool = False
    overwrite: bool = False
    wait: bool = False  # wait for another sftdata writing the same output
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    reasoning: str = "keep"  # keep | last | drop
    train_on: str = "all"  # all | last
    chat_template: str | None = None  # model | model:NAME | preset | FILE.jinja (a model's own tokenizer only)
    tokenizer_engine: str = "auto"  # auto | tiktoken | hf (a model's own tokenizer; the ids are the same)
    allow_pad_as_stop: bool = False  # accept a pad id that is also the end-of-turn token (serving.check_pad_not_stop)
    dedup: str = "off"  # off | exact | near (docs/CURATION.md)
    dedup_threshold: float = DEFAULT_THRESHOLD  # near: estimated Jaccard similarity of token shingles
    decontaminate: tuple[str, ...] = ()  # evaluation files
    decontaminate_ngram: int = DEFAULT_NGRAM
    memo_mb: float = DEFAULT_MEMO_MB  # memory for the memo of encoded texts, all workers together; 0 = off
    memo_policy: str = "frequency"  # what the memo keeps when full (memo.POLICIES; benchmarks compare them)

    @property
    def policy(self) -> TurnPolicy:
        return TurnPolicy(self.reasoning, self.train_on)

    def validate(self) -> None:
        if self.mode not in ("chat", "tool"):
            raise UsageError(f"mode must be 'chat' or 'tool', not {self.mode!r}")
        if self.reasoning not in REASONING_POLICIES:
            raise UsageError(f"--reasoning must be one of {', '.join(REASONING_POLICIES)}, not {self.reasoning!r}")
        if self.train_on not in TRAIN_ON:
            raise UsageError(f"--train-on must be one of {', '.join(TRAIN_ON)}, not {self.train_on!r}")
        if not (0.0 <= self.val_split < 1.0) or math.isnan(self.val_split):
            raise UsageError(f"--val-split must be a fraction in [0, 1), got {self.val_split}")
        if self.max_tokens is not None and self.max_tokens < 4:
            raise UsageError(f"--max-tokens must be at least 4, got {self.max_tokens}")
        if self.shard_tokens < 1:
            raise UsageError(f"--shard-tokens must be positive, got {self.shard_tokens}")
        if self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        if not self.memo_mb >= 0 or math.isinf(self.memo_mb):
            raise UsageError(f"--memo-mb must be 0 (no memo) or a positive number of megabytes, got {self.memo_mb}")
        if self.memo_policy not in POLICIES:
            raise UsageError(f"memo_policy must be one of {', '.join(POLICIES)}, not {self.memo_policy!r}")
        if self.dedup not in DEDUP_MODES:
            raise UsageError(f"--dedup must be one of {', '.join(DEDUP_MODES)}, not {self.dedup!r}")
        if not 0.0 < self.dedup_threshold <= 1.0 or math.isnan(self.dedup_threshold):
            raise UsageError(f"--dedup-threshold must be a Jaccard similarity in (0, 1], got {self.dedup_threshold}")
        if self.decontaminate_ngram < 1:
            raise UsageError(f"--decontaminate-ngram must be at least 1, got {self.decontaminate_ngram}")
        if self.max_record_bytes < 1:
            raise UsageError(f"--max-record-bytes must be positive, got {self.max_record_bytes}")
        check_engine(self.tokenizer_engine)
        if self.tokenizer_engine == "hf" and not is_model_tokenizer_spec(self.tokenizer):
            raise UsageError(f"--tokenizer-engine hf needs a model's own tokenizer (a tokenizer.json or its folder); "
                             f"{'the default tokenizer' if self.tokenizer is None else repr(self.tokenizer)} is a "
                             f"tiktoken encoding")
        if self.chat_template is not None and not is_model_tokenizer_spec(self.tokenizer):
            raise UsageError(f"--chat-template {self.chat_template} needs a model's own tokenizer: --tokenizer "
                             f"path/to/tokenizer.json or the model folder holding it. "
                             f"{'The default tokenizer' if self.tokenizer is None else repr(self.tokenizer)} uses "
                             f"sftdata's chat markers, which have no chat template")

    def memo_bytes_per_worker(self) -> int:
        """Each worker's share of ``--memo-mb`` (MiB, 2^20 bytes)."""
        return int(self.memo_mb * (1 << 20)) // max(1, self.workers)

    def new_memo(self, tok) -> SegmentMemo | None:
        """A worker's memo of encoded texts (None when ``--memo-mb 0``)."""
        cap = self.memo_bytes_per_worker()
        return SegmentMemo(tok, cap, self.memo_policy) if cap > 0 else None

    def recorded(self) -> dict:
        """The options that determine the output (workers, overwrite and the memo do not)."""
        out = {"mode": self.mode, "val_split": self.val_split, "seed": self.seed,
               "max_tokens": self.max_tokens, "shard_tokens": self.shard_tokens,
               "strict": self.strict, "max_record_bytes": self.max_record_bytes, "reasoning": self.reasoning,
               "train_on": self.train_on}
        if self.chat_template is not None:
            out["chat_template"] = self.chat_template
        if self.allow_pad_as_stop:
            out["allow_pad_as_stop"] = True
        if self.dedup != "off":  # recorded only when used: the default output stays byte-identical
            out["dedup"] = self.dedup
            if self.dedup == "near":
                out["dedup_threshold"] = self.dedup_threshold
        if self.decontaminate:
            out.update(decontaminate=[str(p) for p in self.decontaminate], decontaminate_ngram=self.decontaminate_ngram)
        return out


@dataclass
class Progress:
    bytes_done: int
    bytes_total: int | None  # None when an input's size is not known before it is read (stdin)
    records: int
    tokens: int


@dataclass
class PrepareSummary:
    output_dir: str
    records_read: int = 0
    episodes: dict = field(default_factory=dict)  # split -> count
    tokens: dict = field(default_factory=dict)
    trained_tokens: dict = field(default_factory=dict)
    shards: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)  # reason -> count
    repaired: dict = field(default_factory=dict)  # repair -> records
    turns: dict = field(default_factory=lambda: dict.fromkeys(TURN_COUNTS, 0))  # per assistant turn (TURN_COUNTS)
    records_truncated: int = 0
    pairs_dropped: int = 0
    seconds: float = 0.0
    input_bytes: int = 0
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    per_reply_records: int = 0  # chat template: records served one episode per assistant reply
    per_reply_episodes: int = 0
    rule_mismatch: list = field(default_factory=list)  # chat template: rejected records, by name (capped)
    tokenizer_engine: dict = field(default_factory=dict)  # which engine encoded, and why
    dedup: dict = field(default_factory=dict)  # mode, exact_duplicates (always counted), near_duplicates ...
    decontamination: dict = field(default_factory=dict)  # ngram, files: [{path, items, too_short, contaminated}]
    memo: MemoStats = field(default_factory=MemoStats)  # what the memo of encoded texts saved
    memo_mb: float = 0.0  # --memo-mb (0: no memo)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())

    @property
    def trained_share(self) -> float:
        t = self.total_tokens
        return sum(self.trained_tokens.values()) / t if t else 0.0

    def as_dict(self) -> dict:
        return {"output_dir": self.output_dir, "records_read": self.records_read,
                "episodes": self.episodes, "tokens": self.tokens, "trained_tokens": self.trained_tokens,
                "trained_share": round(self.trained_share, 6), "shards": self.shards,
                "rejected": self.rejected, "rejected_total": sum(self.rejected.values()),
                "repaired": self.repaired, "turns": self.turns, "records_truncated": self.records_truncated,
                "pairs_dropped": self.pairs_dropped, "seconds": round(self.seconds, 3),
                "input_bytes": self.input_bytes, "max_record_bytes": self.max_record_bytes,
                "per_reply_records": self.per_reply_records, "per_reply_episodes": self.per_reply_episodes,
                "rule_mismatch": self.rule_mismatch, "tokenizer_engine": self.tokenizer_engine, "dedup": self.dedup,
                "decontamination": self.decontamination, "memo": self.memo_dict()}

    def memo_dict(self) -> dict:
        m = self.memo
        return {"memo_mb": self.memo_mb, "lookups": m.lookups, "hits": m.hits, "hit_rate": round(m.hit_rate, 6),
                "tokens_reused": m.tokens_reused, "tokens_encoded": m.tokens_encoded,
                "reused_share": round(m.reused_share, 6), "evictions": m.evictions,
                "peak_mb_per_worker": round(m.peak_bytes / (1 << 20), 3)}


@dataclass
class ChunkResult:
    """What one chunk of records became. Picklable (sent back from workers)."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    sources: np.ndarray
    rejects: list  # (record, where, reason, message)
    repairs: Counter
    turns: Counter  # per assistant turn of the accepted records (TURN_COUNTS)
    truncated: int
    pairs_dropped: int
    records: int
    per_reply_records: int = 0
    per_reply_episodes: int = 0
    mismatches: list = field(default_factory=list)  # (record, where) of rule_mismatch rejects
    keys: RecordKeys | None = None  # the accepted records' duplicate keys and contamination (curate)
    staged: StagedPart | None = None  # an engine's task wrote the episodes itself (ids and mask are then empty)
    memo: MemoStats | None = None  # what the worker's memo saved on this chunk (None: no memo)


@dataclass(frozen=True)
class StagedPart:
    """Episodes an engine's task wrote to a shard folder of its own, in input order; its
    ``sources`` are numbered from the start of their input: ``record_offset`` is added."""

    path: str
    episodes: int
    tokens: int
    record_offset: int = 0


class Executor(Protocol):
    """What runs ``process_chunk`` over the inputs (``--engine``): yields the chunk
    results in input order with the input bytes read so far, and leaves in ``infos``
    each input's ``first_record``, ``records``, ``sha256`` and ``bytes``. It may write
    the episodes itself (``ChunkResult.staged``), in folders under ``stage_dir``."""

    def __call__(self, infos: list[SourceInfo], opts: PrepareOptions, tok: ChatTokenizer | HFTokenizer,
                 profile: TemplateProfile | None, token_dtype: np.dtype, stage_dir: Path
                 ) -> Iterator[tuple[ChunkResult, int]]: ...


def process_chunk(items: Sequence[RawRecord], tok: ChatTokenizer | HFTokenizer, mode: str,
                  max_tokens: int | None, policy: TurnPolicy = TurnPolicy(),
                  profile: TemplateProfile | None = None, memo: SegmentMemo | None = None,
                  curate: CurateSettings = CurateSettings()) -> ChunkResult:
    """Parse, validate and render one chunk of records (pure but for the tokenizer and
    the worker's ``memo`` of encoded texts, which changes no id), and compute the keys of
    its accepted records (``curate``: the exact-duplicate key always) from the same parse.
    With a ``profile`` (a model's chat template), ``template_chunk`` renders them."""
    if profile is not None:
        return template_chunk(items, tok, profile, mode, max_tokens, policy, curate)
    convs, kept, rejects = [], [], []
    repairs: Counter = Counter()
    turns: Counter = Counter()
    for rec in items:
        if rec.reject is not None:  # decided while reading (too large to read)
            rejects.append((rec.record, rec.where, *rec.reject))
            continue
        try:
            conv = parse_record(rec.raw, rec.where, mode, policy)
        except RecordError as e:
            rejects.append((rec.record, rec.where, e.reason, e.detail))
            continue
        for name in set(conv.repairs):
            repairs[name] += 1
        convs.append(conv)
        kept.append(rec)
    chunk = render_chunk(convs, tok, wheres=[r.where for r in kept], max_tokens=max_tokens, memo=memo)
    sources = []
    accepted = {}  # record -> (where, conversation), for the keys
    truncated = dropped = 0
    for rec, conv, r in zip(kept, convs, chunk.results):
        if isinstance(r, RecordError):
            rejects.append((rec.record, rec.where, r.reason, r.detail))
            continue
        if conv.turn_counts:
            turns.update(conv.turn_counts)
        sources.append(rec.record)
        accepted[rec.record] = (rec.where, conv)
        if r:
            truncated += 1
            dropped += r
    rejects.sort()
    sources = np.asarray(sources, dtype=np.int64)
    return ChunkResult(
        ids=chunk.ids, mask=chunk.mask, lengths=chunk.lengths, sources=sources,
        rejects=rejects, repairs=repairs, turns=turns, truncated=truncated, pairs_dropped=dropped, records=len(items),
        keys=conversation_keys(accepted, sources, chunk.ids, chunk.lengths, curate),
        memo=memo.take_stats() if memo is not None else None)


def choose_tokenizer(spec: str | None, chat_template: str | None, train_on: str = "all", engine: str = "auto"
                     ) -> tuple[ChatTokenizer | HFTokenizer, TemplateProfile | None]:
    """The tokenizer ``--tokenizer`` names and, for a model's own tokenizer, the profile of
    the template ``--chat-template`` names (default: the folder's own), learned once here
    and sent to the workers. ``--train-on last`` makes its rule train each episode's last
    reply only. ``engine``: ``--tokenizer-engine``."""
    tok = open_tokenizer(spec, engine)
    if isinstance(tok, ChatTokenizer):
        return tok, None
    return tok, model_profile(tok, chat_template, last_reply_only=train_on == "last")


def template_chunk(items: Sequence[RawRecord], tok: HFTokenizer, profile: TemplateProfile, mode: str,
                   max_tokens: int | None, policy: TurnPolicy = TurnPolicy(),
                   curate: CurateSettings = CurateSettings()) -> ChunkResult:
    """``process_chunk`` with a model's chat template: each record becomes the episodes the
    template renders (one per reply where it must), each episode's mask the rendered one,
    which its stored rule re-derives (a record where it does not is rejected by name)."""
    ids, masks, lengths, sources, rejects, mismatches = [], [], [], [], [], []
    repairs: Counter = Counter()
    turns: Counter = Counter()
    truncated = dropped = per_reply = per_reply_eps = 0
    convs, kept, accepted = [], [], {}
    for rec in items:
        if rec.reject is not None:  # decided while reading (too large to read)
            rejects.append((rec.record, rec.where, *rec.reject))
            continue
        try:
            convs.append(parse_record(rec.raw, rec.where, mode, policy))
            kept.append(rec)
        except RecordError as e:
            rejects.append((rec.record, rec.where, e.reason, e.detail))
    results = records_episodes([(c, r.where) for c, r in zip(convs, kept)], profile, tok, max_tokens)
    for rec, conv, out in zip(kept, convs, results):
        if isinstance(out, RecordError):
            rejects.append((rec.record, rec.where, out.reason, out.detail))
            if out.reason == "rule_mismatch":
                mismatches.append((rec.record, rec.where))
            continue
        for r in set(conv.repairs):
            repairs[r] += 1
        turns.update(conv.turn_counts)
        accepted[rec.record] = (rec.where, conv)
        for ep in out.episodes:
            ids.append(ep.ids)
            masks.append(ep.mask)
            lengths.append(ep.ids.shape[0])
            sources.append(rec.record)
        if out.per_reply:
            per_reply += 1
            per_reply_eps += len(out.episodes)
        if out.pairs_dropped:
            truncated += 1
            dropped += out.pairs_dropped
    rejects.sort()
    all_ids = np.concatenate(ids) if ids else np.empty(0, np.uint32)
    lengths, sources = np.asarray(lengths, dtype=np.int64), np.asarray(sources, dtype=np.int64)
    return ChunkResult(
        ids=all_ids, mask=np.concatenate(masks) if masks else np.empty(0, np.uint8), lengths=lengths, sources=sources,
        rejects=rejects, repairs=repairs, turns=turns, truncated=truncated, pairs_dropped=dropped,
        records=len(items), per_reply_records=per_reply, per_reply_episodes=per_reply_eps, mismatches=mismatches,
        keys=conversation_keys(accepted, sources, all_ids, lengths, curate))


# -- worker processes ---------------------------------------------------------------
_WORKER: dict = {}


def _worker_init(parent_pid: int, tok, profile: TemplateProfile | None, mode: str, max_tokens: int | None,
                 policy: TurnPolicy, curate: CurateSettings = CurateSettings(),
                 opts: PrepareOptions | None = None) -> None:
    die_with_parent(parent_pid)  # a kill -9 of the parent must not leave workers running
    # Ctrl-C reaches the whole process group: the parent stops the run and terminates the
    # pool; a worker that died of it would print a traceback and leave a task unanswered
    # (pool.terminate() then hangs). SIGTERM (how the pool ends workers) keeps its default.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER["tok"] = tok  # pickled to a spawned worker: each kind reloads itself and checks its hash
    _WORKER["profile"] = profile
    _WORKER["mode"] = mode
    _WORKER["max_tokens"] = max_tokens
    _WORKER["policy"] = policy
    _WORKER["curate"] = curate
    _WORKER["memo"] = opts.new_memo(_WORKER["tok"]) if opts is not None else None  # one per worker, kept


def _worker_run(items: Sequence[RawRecord]) -> ChunkResult:
    return curated_chunk(items, _WORKER["tok"], _WORKER["mode"], _WORKER["max_tokens"], _WORKER["policy"],
                         _WORKER["profile"], _WORKER["curate"], _WORKER["memo"])


def curated_chunk(items: Sequence[RawRecord], tok, mode: str, max_tokens: int | None, policy: TurnPolicy,
                  profile: TemplateProfile | None, curate: CurateSettings,
                  memo: SegmentMemo | None = None) -> ChunkResult:
    """``process_chunk`` with the keys ``curate`` asks for."""
    return process_chunk(items, tok, mode, max_tokens, policy, profile, memo, curate)


def _chunks(records: Iterable[tuple[RawRecord, int]]) -> Iterator[tuple[list[RawRecord], int]]:
    buf: list[RawRecord] = []
    size = 0
    pos = 0
    for rec, pos in records:
        buf.append(rec)
        size += len(rec.raw) + 64
        if len(buf) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield buf, pos
            buf, size = [], 0
    if buf:
        yield buf, pos


def _pool(opts: PrepareOptions, tok, profile: TemplateProfile | None, curate: CurateSettings):
    """``opts.workers`` worker processes (``_worker_init``) in a ``ProcessPoolExecutor``: a
    worker that dies (killed by the system, out of memory) breaks the pool and ends the run
    with an error. A ``multiprocessing.Pool`` would wait forever for the task it held."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # rensa (--dedup near) runs a thread pool: a process forked from one that has used it
    # waits forever for its threads, so near-dedup workers start from a new interpreter
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() and curate.dedup != "near" else "spawn")
    return ProcessPoolExecutor(opts.workers, mp_context=ctx, initializer=_worker_init,
                               initargs=(os.getpid(), tok, profile, opts.mode, opts.max_tokens, opts.policy, curate,
                                         opts))


def _results(chunks: Iterator[tuple[list[RawRecord], int]], opts: PrepareOptions,
             tok: ChatTokenizer | HFTokenizer, profile: TemplateProfile | None = None,
             curate: CurateSettings = CurateSettings()) -> Iterator[tuple[ChunkResult, int]]:
    """Chunk results in input order; with workers, at most 2 x workers chunks in flight.

    Workers run in a ``ProcessPoolExecutor``: a worker that dies (killed by the system,
    out of memory) breaks the pool and ends the run with an error. A
    ``multiprocessing.Pool`` would wait forever for the chunk the dead worker held."""
    if opts.workers <= 1:
        memo = opts.new_memo(tok)
        for items, pos in chunks:
            yield curated_chunk(items, tok, opts.mode, opts.max_tokens, opts.policy, profile, curate, memo), pos
        return
    jobs = ((_worker_run, (items,), items[0].where, pos) for items, pos in chunks)
    yield from _in_order(_pool(opts, tok, profile, curate), jobs, 2 * opts.workers)


def _in_order(pool, jobs: Iterator[tuple[Callable, tuple, str, object]], depth: int) -> Iterator[tuple[object, object]]:
    """``(result, tag)`` of each job ``(function, args, where, tag)`` of ``jobs``, run in
    ``pool``, in the jobs' order with at most ``depth`` in flight; the pool is shut down at
    the end. A worker that dies breaks the pool: the error names ``where`` of the job
    waited for (or being submitted)."""
    from concurrent.futures.process import BrokenProcessPool

    pending: deque = deque()

    def take() -> tuple[object, object]:
        fut, where, tag = pending.popleft()
        try:
            return fut.result(), tag
        except BrokenProcessPool:
            raise _broken(where) from None

    try:
        for fn, args, where, tag in jobs:
            try:
                pending.append((pool.submit(fn, *args), where, tag))
            except BrokenProcessPool:
                raise _broken(where) from None
            if len(pending) >= depth:
                yield take()
        while pending:
            yield take()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


# -- partitions: each task reads its own byte range of the input --------------------
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


def _empty() -> ChunkResult:
    return ChunkResult(np.empty(0, np.uint32), np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64),
                       [], Counter(), Counter(), 0, 0, 0)


def _merge(acc: ChunkResult | None, res: ChunkResult) -> ChunkResult:
    """``res``'s counts, rejects and keys added to ``acc`` (tokens are not kept)."""
    if acc is None:
        return ChunkResult(np.empty(0, np.uint32), np.empty(0, np.uint8), np.empty(0, np.int64),
                           np.empty(0, np.int64), list(res.rejects), Counter(res.repairs), Counter(res.turns),
                           res.truncated, res.pairs_dropped, res.records, res.per_reply_records,
                           res.per_reply_episodes, list(res.mismatches), keys=res.keys,
                           memo=dataclasses.replace(res.memo) if res.memo is not None else None)
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
    if res.memo is not None:
        if acc.memo is None:
            acc.memo = MemoStats()
        acc.memo.add(res.memo)
    return acc


_TOKENIZERS: dict = {}  # per worker process: tokenizers rebuilt once, not once per task or per run
_KEEP_TOKENIZERS = 4


def _tokenizer(pickled: bytes | None):
    """The (tokenizer, profile) pickled in ``pickled`` (a few hundred bytes: a tokenizer
    pickles as what rebuilds it), rebuilt on a worker's first task and kept for later
    tasks and runs (rebuilding takes seconds: the ranks are read and checked). None: the
    local worker's own (``_worker_init``)."""
    if pickled is None:
        return _WORKER["tok"], _WORKER["profile"]
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
        return PartSummary(part.index, _merge(None, _empty()), 0, None)
    tok, profile = _tokenizer(tokenizer)
    memo = _WORKER.get("memo") if tokenizer is None else None
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
    for items, _ in _chunks(records()):
        if stop is not None and stop.exists():  # the run stopped (an error, Ctrl-C): write nothing more
            writer.close()
            return PartSummary(part.index, _merge(None, _empty()), 0, None)
        # with the exact-duplicate keys the driver counts (prepare's summary, whatever the engine), from
        # the same parse as the tokens
        res = process_chunk(items, tok, settings["mode"], settings["max_tokens"], settings["policy"], profile, memo,
                            CurateSettings())
        if res.lengths.size:
            if writer is not None:
                writer.add_many(res.ids, res.mask, res.lengths, res.sources)
            else:
                kept.append(res)
        acc = _merge(acc, res)
    if acc is None:
        acc = _merge(None, _empty())
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
        res = _shifted(s.result, self.first_record)
        if s.path is not None:
            res.staged = StagedPart(s.path, s.episodes, s.tokens, self.first_record)
        self.done += (p.end - p.start) if not p.whole else s.bytes
        if self.last[p.source] == p.index:  # the input is complete: its numbers are known
            info.first_record, info.records = self.first_record, self.records_of[p.source]
            if digest is not None:
                info.sha256, info.bytes = digest()
            self.first_record += info.records
        return res, self.done


def _shifted(res: ChunkResult, first: int) -> ChunkResult:
    if first:
        res.sources = res.sources + first  # tokens returned with the result (staged ones: record_offset)
        res.rejects = [(r + first, *rest) for r, *rest in res.rejects]
        res.mismatches = [(r + first, where) for r, where in res.mismatches]
        if res.keys is not None:
            res.keys.records = res.keys.records + first
    return res


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


def _broken(where: str) -> SftDataError:
    return SftDataError(f"a worker process stopped unexpectedly (killed by the system, e.g. out of "
                        f"memory) while the records from {where} on were being prepared; nothing was "
                        f"written. Free memory, or rerun with fewer --workers (--workers 1 uses no "
                        f"worker process)")


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
    pool = _pool(opts, tok, profile, CurateSettings())
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
            with closing(_in_order(pool, jobs(), 2 * opts.workers)) as results:  # the pool stops before the rmtree
                for s, p in results:
                    _take_handoff(s, token_dtype)
                    yield numbering.place(p, s, scans[p.source].digest if p.source in scans else None)
        finally:
            shutil.rmtree(stage_dir, ignore_errors=True)  # empty after a complete run; else what was handed over


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
    return _results(_chunks(iter_all(infos, opts.max_record_bytes)), opts, tok, profile, curate)


def split_assignment(n: int, val_split: float, seed: int) -> np.ndarray:
    """Boolean array: True where episode ``i`` (input order) goes to val.

    Exactly ``floor(val_split * n + 0.5)`` episodes, chosen by
    ``RandomState(seed).permutation(n)``.
    """
    k = int(math.floor(val_split * n + 0.5))
    is_val = np.zeros(n, dtype=bool)
    if k:
        is_val[np.random.RandomState(seed).permutation(n)[:k]] = True
    return is_val


def _split_staging(src: Shard, is_val: np.ndarray, writers: dict[bool, SplitWriter], record_offset: int = 0) -> None:
    """Stream the staging shard into train/val writers in windows of about COPY_TOKENS
    tokens, keeping input order within each split (boolean selection, no index arrays)."""
    lengths = src.episodes[:, 1].astype(np.int64)
    ends = np.cumsum(lengths)
    n = len(lengths)
    i = 0
    while i < n:
        base = int(ends[i - 1]) if i else 0
        j = max(i + 1, int(np.searchsorted(ends, base + COPY_TOKENS, side="right")))
        j = min(j, n)
        stop = int(ends[j - 1])
        toks, mask = src.read_range(base, stop)
        lens, srcs, val = lengths[i:j], src.sources[i:j].astype(np.int64) + record_offset, is_val[i:j]
        tok_val = np.repeat(val, lens)
        for flag, w in writers.items():
            if w is None:
                continue
            sel = val if flag else ~val
            if sel.any():
                tsel = tok_val if flag else ~tok_val
                w.add_many(toks[tsel], mask[tsel], lens[sel], srcs[sel])
        i = j


def _split_parts(w: DatasetWriter, staged: dict, parts: list[StagedPart], is_val: np.ndarray, dtype: np.dtype,
                 opts: PrepareOptions) -> dict:
    """The staging shard (``staged``: its metadata), then the engine's parts, into train and
    val in input order; returns each split's metadata and removes what was staged."""
    pieces = [(w.path / "_staging" / "shard_00000", 0)] if staged["episodes"] else []
    pieces += [(Path(p.path), p.record_offset) for p in parts]
    writers = {False: w.split("train", dtype, opts.shard_tokens),
               True: w.split("val", dtype, opts.shard_tokens) if opts.val_split > 0 else None}
    first = 0
    for path, offset in pieces:  # in input order
        src = Shard(path, dtype)
        _split_staging(src, is_val[first:first + src.num_episodes], writers, offset)
        first += src.num_episodes
        del src
    splits_meta = {name: wr.close() for name, wr in (("train", writers[False]), ("val", writers[True]))
                   if wr is not None}
    shutil.rmtree(w.path / "_staging")
    shutil.rmtree(w.path / PARTS_DIR, ignore_errors=True)
    return splits_meta


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
            progress: Callable[[Progress], None] | None = None, executor: Executor | None = None) -> PrepareSummary:
    """Prepare ``inputs`` into a dataset at ``output_dir``. Raises ``SftDataError``s.
    ``executor`` runs the rendering (default ``local_results``; ``sftdata.engine`` has Ray's):
    the dataset is the same whichever runs it.

    When every record is rejected, nothing is created at ``output_dir`` and the reasons go
    to a file beside it that the error names (``AllRecordsRejectedError.rejects_path``)."""
    opts.validate()
    output_dir = remote_url(output_dir) or local_path(output_dir)  # a path, a file:// URL or an object-store URL
    if not inputs:
        raise UsageError("no input files given")
    t0 = time.perf_counter()
    tok, profile = choose_tokenizer(opts.tokenizer, opts.chat_template, opts.train_on, opts.tokenizer_engine)
    state = tok.state() if profile is None else tokenizer_state(tok, profile)
    check_state_stops(state, opts.allow_pad_as_stop)  # a model that could not learn to stop: refused now
    if executor is not None and (opts.dedup != "off" or opts.decontaminate):
        raise UsageError("--dedup and --decontaminate run with --engine local (one decision in input order in this "
                         "process); drop them, or prepare with --engine local")
    evals = load_evals(list(opts.decontaminate), opts.decontaminate_ngram, opts.max_record_bytes) \
        if opts.decontaminate else None
    curate = CurateSettings(opts.dedup, evals)
    dedup = Deduplicator(opts.dedup, opts.dedup_threshold)
    contaminated: Counter = Counter()  # per evaluation file
    infos: list[SourceInfo] = [inspect_source(src) for src in expand_inputs(inputs)]
    known = all(i.size_known for i in infos)
    total_bytes = sum(i.bytes for i in infos) if known else None
    dtype = token_dtype_for(tok.vocab_size)  # uint32 for a vocabulary beyond 65,536 ids
    summary = PrepareSummary(output_dir=str(output_dir), max_record_bytes=opts.max_record_bytes,
                             tokenizer_engine=engine_record(tok), memo_mb=opts.memo_mb)
    rejected: Counter = Counter()
    repaired: Counter = Counter()
    turns: Counter = Counter()
    with DatasetWriter(output_dir, overwrite=opts.overwrite, wait=opts.wait) as w:
        # no val split to draw (and no engine writing parts of its own): the episodes go straight to
        # train in input order, the shards train's own, with no staging copy to split afterwards
        direct = opts.val_split == 0 and executor is None
        stage_name = "train" if direct else "_staging"
        staging = w.split("train", dtype, opts.shard_tokens) if direct else w.split("_staging", dtype, 1 << 62)
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
                splits_meta = _split_parts(w, staged, parts, is_val, dtype, opts)
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
            "splits": splits_meta,
            "sources": [i.as_dict() for i in infos],
            "options": {**opts.recorded(), "tokenizer": tok.path or tok.name},
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
        with writing(w.path, output_dir):
            w.commit(metadata)
    summary.seconds = time.perf_counter() - t0
    return summary


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
