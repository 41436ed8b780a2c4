"""The preference and RL pipelines: records -> pairs (or KTO rows, or prompts) -> split -> dataset.

::

    inputs ──read (sources)──► records ──parse_preference──► render_record (token-space split,
        proven) ──► one truncation cut per pair ──► exact seeded split of the rows
        ──► train/ val/ shards (RowSplitWriter) ──► metadata (written last) ──► rename

The inputs, rejects (``rejects.jsonl``, the same reasons and lines as prepare-chat), the
tokenizer and template profile, the split and the committing writer are prepare's own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import orjson

from .. import __version__
from ..chat.loss_rule import rule_from_state
from ..chat.pair_rule import completion_mask
from ..chat.serving import check_state_stops
from ..curate import (
    CurateSettings,
    Deduplicator,
    RecordKeys,
    canonical_text,
    exact_key,
    load_evals,
)
from ..curate.minhash import shingle_hashes, signatures
from ..errors import RecordError, UsageError
from ..prepare.build import plan_build
from ..prepare.pool import PoolRunner, chunks_of
from ..prepare.results import Progress
from ..prepare.run import _all_rejected
from ..prepare.split import split_assignment
from ..records.conversation import decode_json
from ..records.preference import PreferenceRecord, parse_preference, parse_prompt, value_texts
from ..records.rejects import RejectsFile, reject_line, writing
from ..records.turns import TurnPolicy
from ..sources import RawRecord, SourceInfo, expand_inputs, inspect_source, iter_all
from ..sources.partitions import records_sha256
from ..store.build_key import BUILD, BuildCheck, library_changes
from ..store.format import (
    ENTRIES_PER_ROW,
    KIND_KTO,
    KIND_PAIRS,
    KIND_PROMPTS,
    REJECTS_FILE,
    STAGING_SPLIT,
    TOKENIZER_FILE,
    token_dtype_for,
)
from ..store.location import local_path
from ..store.serving_file import write_serving
from ..store.split_writer import RowSplitWriter
from ..store.writer import DatasetWriter, sweep_beside
from ..tasks import in_order, overlapped, process_pool, worker_started
from ..template import choose_tokenizer, template_summary, tokenizer_state
from ..tokenize.identity import recorded_identity
from .options import PrefOptions
from .render import PairRender, RenderingChunk, finish_records, one_process_run, render_prompt, start_records
from .split import split_rows
from .truncate import Cut, plan_cut


@dataclass
class PrefSummary:
    output_dir: str
    kind: str
    records_read: int = 0
    rows: dict = field(default_factory=dict)  # split -> pairs / KTO rows / prompts
    tokens: dict = field(default_factory=dict)
    trained_tokens: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    repaired: dict = field(default_factory=dict)
    forms: dict = field(default_factory=dict)  # record form -> rows kept
    truncated: dict = field(default_factory=dict)  # prompts_cut, completions_cut (rows)
    labels: dict = field(default_factory=dict)  # kto: desirable / undesirable rows
    dedup: dict = field(default_factory=dict)  # mode, exact_duplicates (counted either way)
    decontamination: dict = field(default_factory=dict)  # ngram, files: [{path, items, too_short, contaminated}]
    seconds: float = 0.0
    build_key: str | None = None  # the dataset's build key (store.build_key)
    up_to_date: bool = False  # the target held this build already: nothing was done
    changed: list = field(default_factory=list)  # why the target was rebuilt, in words (empty: a new target)
    libraries_changed: list = field(default_factory=list)  # up to date, but made with other library versions

    def as_dict(self) -> dict:
        return {"output_dir": self.output_dir, "kind": self.kind, "records_read": self.records_read,
                "rows": self.rows, "tokens": self.tokens, "trained_tokens": self.trained_tokens,
                "rejected": self.rejected, "repaired": self.repaired, "forms": self.forms,
                "truncated": self.truncated, "labels": self.labels, "dedup": self.dedup,
                "decontamination": self.decontamination, "seconds": round(self.seconds, 3),
                "build_key": self.build_key, "up_to_date": self.up_to_date, "changed": list(self.changed),
                "libraries_changed": list(self.libraries_changed)}

    @classmethod
    def of_dataset(cls, output_dir: str, meta: dict) -> PrefSummary:
        """The summary of the dataset a run found up to date, from its metadata."""
        counts, kind = meta.get("counts") or {}, meta.get("kind", KIND_PAIRS)
        out = cls(output_dir, kind, records_read=counts.get("records_read", 0), rejected=counts.get("rejected") or {},
                  repaired=counts.get("repaired") or {}, forms=counts.get("forms") or {},
                  truncated=counts.get("truncated") or {}, labels=counts.get("labels") or {},
                  dedup=meta.get("dedup") or {}, decontamination=meta.get("decontamination") or {}, up_to_date=True)
        for split, m in (meta.get("splits") or {}).items():
            out.rows[split], out.tokens[split] = m.get("rows", 0), m.get("tokens", 0)
            out.trained_tokens[split] = m.get("trained_tokens", 0)
        return out


def _special_flags(tok) -> np.ndarray:
    """bool per id: whether it is one of the tokenizer's special tokens."""
    flags = np.zeros(tok.vocab_size + 1, dtype=bool)
    flags[[i for i in tok.special_tokens.values() if i is not None and i <= tok.vocab_size]] = True
    return flags


@dataclass(frozen=True)
class Context:
    """What rendering a row needs, learned once per run (and again by verify)."""

    tok: object
    profile: object
    rule: object
    policy: TurnPolicy
    opts: PrefOptions
    special: np.ndarray
    rl: bool


@dataclass(frozen=True)
class Row:
    """One kept row: its kind, episodes (ids, mask), KTO label, RL columns, form, repairs."""

    kind: str
    parts: list
    label: int | None = None
    columns: bytes | None = None
    form: str = ""
    repairs: tuple = ()
    prompt_cut: bool = False
    completion_cut: bool = False
    text: str = ""  # the canonical text of the prompt and every completion (curation)


def open_context(opts: PrefOptions, rl: bool) -> tuple[Context, dict]:
    """The tokenizer, template profile and mask rule of ``opts``, and the tokenizer state."""
    tok, profile = choose_tokenizer(opts.tokenizer, opts.chat_template, opts.train_on, opts.tokenizer_engine,
                                    opts.template_vars, limits=opts.template_limits())
    state = tok.state() if profile is None else tokenizer_state(tok, profile)
    check_state_stops(state, opts.allow_pad_as_stop)  # a model that could not learn to stop: refused now
    ctx = Context(tok, profile, rule_from_state(state), opts.policy, opts,
                  _special_flags(tok), rl)
    return ctx, state


def _columns(raw, obj: dict, names) -> bytes:
    """The JSON object of ``columns.jsonl``: each column's JSON text as written in the input,
    as a JSON string (``value_texts``); a row from a Parquet file, the value's JSON text."""
    texts = value_texts(raw) if isinstance(raw, (bytes, bytearray)) else {}
    out = []
    for k in names:
        q = orjson.dumps(k)
        text = texts[q].decode("utf-8") if q in texts else orjson.dumps(obj[k]).decode("utf-8")
        out.append(b"%s: %s" % (q, orjson.dumps(text)))
    return b"{" + b", ".join(out) + b"}"


def record_row(raw: bytes, where: str, ctx: Context) -> Row:
    """The row of one input record under ``ctx``, or raises ``RecordError``: prepare writes
    it (``record_rows``, a chunk at once), verify renders it again and compares."""
    (row,) = record_rows([(raw, where)], ctx)
    if isinstance(row, RecordError):
        raise row
    return row


def _prompt_row(obj: dict, raw, where: str, ctx: Context) -> Row:
    pr = parse_prompt(obj, where)
    ids = render_prompt(pr, ctx.tok, ctx.profile, ctx.policy, where)
    budget = ctx.opts.truncation.max_prompt_length
    if budget is not None and ids.shape[0] > budget:
        raise RecordError("prompt_too_long", f"the prompt is {ids.shape[0]:,} tokens, over --max-prompt-length "
                          f"{budget:,}; an RL prompt is never cut", where)
    text = "\n".join(str(m.get("content", m.get("value", ""))) for m in pr.prompt)
    return Row(KIND_PROMPTS, [(ids, np.zeros(ids.shape[0], dtype=np.uint8))],
               columns=_columns(raw, obj, pr.columns), text=text)


@dataclass
class StartedRows:
    """``start_rows``' chunk: per record its outcome so far (a ``Row`` of an RL prompt, a
    ``RecordError``, or None while its pair renders), the preference records rendering."""

    out: list
    pending: list[tuple[int, PreferenceRecord, str]]
    rendering: RenderingChunk


def start_rows(items: Sequence[tuple[bytes, str]], ctx: Context, pool: Executor | None = None) -> StartedRows:
    """The first half of ``record_rows``: the records read and rendered, their texts being
    tokenized (on ``pool``'s thread when given: ``render.start_records``)."""
    out: list = [None] * len(items)
    pending: list[tuple[int, PreferenceRecord, str]] = []
    for i, (raw, where) in enumerate(items):
        try:
            obj = decode_json(raw, where) if isinstance(raw, (bytes, str)) else raw
            if ctx.rl:
                out[i] = _prompt_row(obj, raw, where, ctx)
            else:
                pending.append((i, parse_preference(obj, where, ctx.opts.form), where))
        except RecordError as e:
            out[i] = e
    rendering = start_records([(pr, where) for _, pr, where in pending], ctx.tok, ctx.profile, ctx.policy, pool)
    return StartedRows(out, pending, rendering)


def finish_rows(started: StartedRows, ctx: Context) -> list[Row | RecordError]:
    """The second half of ``record_rows``: each record's ``Row`` or ``RecordError``."""
    out = started.out
    for (i, pr, where), r in zip(started.pending, finish_records(started.rendering, ctx.tok, ctx.rule)):
        try:
            out[i] = r if isinstance(r, RecordError) else _pair_row(pr, r, where, ctx)
        except RecordError as e:
            out[i] = e
    return out


def record_rows(items: Sequence[tuple[bytes, str]], ctx: Context) -> list[Row | RecordError]:
    """``record_row`` of each ``(raw, where)``: its ``Row`` or the ``RecordError`` it
    raises. Preference records are rendered as one chunk (``render_records``)."""
    return finish_rows(start_rows(items, ctx), ctx)


def _pair_row(pr: PreferenceRecord, out: PairRender, where: str, ctx: Context) -> Row:
    """The row of a rendered preference record under the truncation policy."""
    opts = ctx.opts
    special = ctx.special
    cut = plan_cut(special[out.prompt], [special[c] for c in out.completions], list(out.masks), opts.truncation) \
        if opts.truncation.limited else Cut(0, tuple(c.shape[0] for c in out.completions))
    if cut.reason is not None:
        raise RecordError(cut.reason, cut.message, where)
    prompt = out.prompt[cut.prompt_start:]
    parts = [(prompt, np.zeros(prompt.shape[0], dtype=np.uint8))]
    for c, m, e in zip(out.completions, out.masks, cut.ends):
        if not cut.prompt_cut and e == c.shape[0]:  # uncut: the mask render_records proved
            parts.append((c, m))
            continue
        mask = completion_mask(ctx.rule, prompt, c[:e])
        if not np.array_equal(mask, m[:e]):
            raise RecordError("prompt_cut_changes_mask", f"cut to {prompt.shape[0]:,} prompt tokens (--truncation "
                              f"{opts.truncation.policy}), the mask rule no longer trains the completion as the whole "
                              f"render does (the reply's context is cut away); raise --max-prompt-length", where)
        parts.append((c[:e], mask))
    return Row(KIND_KTO if pr.label is not None else KIND_PAIRS, parts,
               label=None if pr.label is None else int(pr.label), form=pr.form, repairs=out.repairs,
               prompt_cut=cut.prompt_cut,
               completion_cut=any(e < c.shape[0] for c, e in zip(out.completions, cut.ends)),
               text="\n\n".join(canonical_text(c) for c in out.conversations))


@dataclass
class PrefChunk:
    """What one chunk of records became (picklable: sent back from a worker): per record in
    input order ``(record, where, Row)`` or ``(record, where, (reason, message))``, and the
    curating keys of its rows (``RecordKeys``, rows in the same order)."""

    records: int
    outcomes: list
    keys: RecordKeys


def row_keys(rows: list[tuple[int, str, Row]], curate: CurateSettings) -> RecordKeys:
    """The curating keys of ``rows`` ((record, where, row), input order): the exact key of
    each row's canonical text (prompt and every completion), the first evaluation item it
    shares an n-gram with, and with ``--dedup near`` the MinHash signature of the shingles
    of its tokens (prompt, then each completion), as prepare-chat's records have."""
    evals, exact, contaminated = curate.evals, [], []
    for record, where, row in rows:
        exact.append(exact_key(row.text))
        hit = evals.first_hit(row.text) if evals is not None else None
        if hit is not None:
            contaminated.append((record, where, hit[0], hit[1]))
    sigs = None
    if curate.dedup == "near":
        ids = [p for _, _, row in rows for p, _ in row.parts]
        flat = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
        sizes = np.array([sum(p.shape[0] for p, _ in row.parts) for _, _, row in rows], dtype=np.int64)
        ends = np.cumsum(sizes)
        shingles, offsets = shingle_hashes(flat, ends - sizes, ends, curate.shingle)
        sigs = signatures(shingles, offsets, curate.num_perm, curate.seed)
    return RecordKeys(np.array([r for r, _, _ in rows], dtype=np.int64), [w for _, w, _ in rows], exact, sigs,
                      contaminated)


@dataclass
class StartedChunk:
    """``start_chunk``'s chunk of input records, its readable ones rendering."""

    items: Sequence[RawRecord]
    rows: StartedRows


def start_chunk(items: Sequence[RawRecord], ctx: Context, pool: Executor | None = None) -> StartedChunk:
    """The first half of ``pref_chunk``: the chunk rendered, its texts being tokenized
    (on ``pool``'s thread when given, while the caller starts the next chunk)."""
    return StartedChunk(items, start_rows([(rec.raw, rec.where) for rec in items if rec.reject is None], ctx, pool))


def finish_chunk(started: StartedChunk, ctx: Context, curate: CurateSettings) -> PrefChunk:
    """The second half of ``pref_chunk``: the chunk's rows and their keys."""
    outcomes, rows, at = [], [], []
    made = iter(finish_rows(started.rows, ctx))
    for rec in started.items:
        if rec.reject is not None:  # decided while reading (too large to read)
            outcomes.append((rec.record, rec.where, rec.reject))
            continue
        row = next(made)
        if isinstance(row, RecordError):
            outcomes.append((rec.record, rec.where, (row.reason, row.detail)))
            continue
        at.append(len(outcomes))
        rows.append((rec.record, rec.where, row))
        outcomes.append(rows[-1])
    keys = row_keys(rows, curate)
    for i, (record, where, row) in zip(at, rows):  # the text has served (keys): not sent back
        outcomes[i] = (record, where, dataclasses.replace(row, text=""))
    return PrefChunk(len(started.items), outcomes, keys)


def pref_chunk(items: Sequence[RawRecord], ctx: Context, curate: CurateSettings) -> PrefChunk:
    """One chunk of records rendered into rows (pure but for the tokenizer), with their keys."""
    return finish_chunk(start_chunk(items, ctx), ctx, curate)


PREF_WORKER: dict = {}


def _pref_worker_init(parent_pid: int, ctx: Context, curate: CurateSettings) -> None:
    worker_started(parent_pid)
    PREF_WORKER["ctx"], PREF_WORKER["curate"] = ctx, curate


def _pref_worker_run(items: Sequence[RawRecord]) -> PrefChunk:
    return pref_chunk(items, PREF_WORKER["ctx"], PREF_WORKER["curate"])


_TASK_CONTEXTS: dict[bytes, Context] = {}  # a cluster worker's contexts, by their pickle's digest


def pref_task(ctx_blob: bytes, curate: CurateSettings, items: Sequence[RawRecord]) -> PrefChunk:
    """``pref_chunk`` as a cluster task (``--engine ray``): the run's context arrives
    pickled (the tokenizer as its path and sha256) and is rebuilt once per worker."""
    key = hashlib.blake2b(ctx_blob, digest_size=16).digest()
    ctx = _TASK_CONTEXTS.get(key)
    if ctx is None:
        _TASK_CONTEXTS.clear()
        ctx = _TASK_CONTEXTS[key] = pickle.loads(ctx_blob)  # noqa: S301 - the run's own context, pickled by this run
    return pref_chunk(items, ctx, curate)


class PrefExecutor(Protocol):
    """Where a run's chunks are rendered when not in this machine's processes (``--engine
    ray``: ``sftdata.engine.pref_ray``): ``start`` gives a task runner (``in_order``'s:
    ``submit``, ``result``, ``close``, ``depth``) that runs ``pref_task`` with the
    context and curating settings it was started with (``shared`` puts a value once)."""

    def start(self, ctx: Context, curate: CurateSettings): ...


def pref_results(infos: list[SourceInfo], ctx: Context, curate: CurateSettings, workers: int,
                 executor: PrefExecutor | None = None) -> Iterator[tuple[PrefChunk, int]]:
    """Chunk results in input order (prepare's chunks); with ``workers`` > 1 rendered by
    that many processes (prepare's pool, at most 2 x workers chunks in flight); with an
    ``executor``, by its tasks (a Ray cluster; as many chunks in flight as it says)."""
    chunks = chunks_of(iter_all(infos, ctx.opts.max_record_bytes))
    if executor is not None:
        runner = executor.start(ctx, curate)
        blob, shared = runner.shared(pickle.dumps(ctx)), runner.shared(curate)
        try:
            yield from in_order(runner, pref_task, (((blob, shared, items), f"the records from {items[0].where} on "
                                                     f"were being prepared", pos) for items, pos in chunks))
        except BaseException:
            runner.close(True)
            raise
        runner.close(False)
        return
    if workers <= 1:  # each chunk's texts are tokenized on a second thread while the next one renders
        with one_process_run() as pool:
            for started, pos in overlapped(chunks, lambda items: start_chunk(items, ctx, pool)):
                yield finish_chunk(started, ctx, curate), pos
        return
    runner = PoolRunner(ctx.opts, None, None, None, curate,
                        pool=process_pool(workers, _pref_worker_init, (ctx, curate), curate))
    done = False
    try:
        yield from in_order(runner, _pref_worker_run, (((items,), f"the records from {items[0].where} on were "
                                                        f"being prepared", pos) for items, pos in chunks))
        done = True
    finally:
        runner.close(not done)


class _Gather:
    """The driver's decisions on each record in input order (contamination, duplicates, the
    dataset's kind, --strict), the kept rows written as they come, the counts."""

    def __init__(self, w: DatasetWriter, opts: PrefOptions, rl: bool, dtype: np.dtype, evals):
        self.w, self.opts, self.dtype, self.evals = w, opts, dtype, evals
        self.kind = KIND_PROMPTS if rl else None
        self.dedup = Deduplicator(opts.dedup, opts.dedup_threshold)
        self.contaminated: Counter = Counter()
        self.rejected, self.repaired, self.forms, self.counts, self.labels = (Counter() for _ in range(5))
        self.records = 0
        self.direct = opts.val_split == 0  # no split to draw: rows go straight to train, in input order
        self.writer: RowSplitWriter | None = None
        self.hits: dict = {}  # the chunk's contaminated rows: record -> (evaluation item, shared words)

    def _curate(self, record: int, where: str, keys: RecordKeys, i: int) -> None:
        """Raise ``RecordError`` when the row shares an n-gram with an evaluation item (its
        prompt or any completion: ``contaminated``) or repeats an earlier kept row
        (``duplicate``: exactly with ``--dedup exact``, or nearly with ``near``; exact ones
        counted either way)."""
        hit = self.hits.get(record)
        if hit is not None:
            ev = self.evals
            fi, number, ewhere = ev.items[hit[0]]
            self.contaminated[fi] += 1
            raise RecordError("contaminated", f"shares the {ev.n}-word sequence \"{hit[1]}\" with item {number} of "
                              f"the evaluation file {ev.files[fi]} ({ewhere}); dropped so that the evaluation stays "
                              f"unseen", where)
        one = RecordKeys(keys.records[i:i + 1], [where], keys.exact[i:i + 1],
                         None if keys.signatures is None else keys.signatures[i:i + 1], [])
        for d in self.dedup.decide(one):
            raise RecordError("duplicate", d.message().replace("the same conversation as", "the same prompt and "
                                                               "completions as"), where)

    def add(self, res: PrefChunk, rej, rejects: Path, output_dir) -> None:
        """One chunk's records, in input order."""
        self.hits = {c[0]: (c[2], c[3]) for c in res.keys.contaminated}
        kept, lines, k = [], [], 0
        for record, where, out in res.outcomes:
            try:
                if isinstance(out, tuple):
                    raise RecordError(*out, where)
                row, i = out, k
                k += 1
                self._curate(record, where, res.keys, i)
                if self.kind is None:
                    self.kind = row.kind
                elif self.kind != row.kind:
                    raise RecordError("mixed_kinds", f"a {row.kind} row in a {self.kind} dataset (the first kept row "
                                      f"decided); prepare pairs and KTO rows into separate datasets", where)
            except RecordError as e:
                if self.opts.strict:
                    raise RecordError(e.reason, e.detail + " (--strict stops at the first bad record; drop "
                                      "--strict to skip and count bad records)", where, record) from None
                self.rejected[e.reason] += 1
                lines.append(reject_line(record, where, e.reason, e.detail) + b"\n")
                continue
            kept.append((record, row))
            if row.label is not None:
                self.labels["desirable" if row.label else "undesirable"] += 1
            if row.form:
                self.forms[row.form] += 1
            for r in row.repairs:
                self.repaired[r] += 1
            self.counts["prompts_cut"] += row.prompt_cut
            self.counts["completions_cut"] += row.completion_cut
        self.records += res.records
        if lines:
            with writing(rejects, output_dir):
                rej.write(b"".join(lines))
        if kept:
            with writing(self.w.path, output_dir):
                self._write(kept)

    def _write(self, kept: list[tuple[int, Row]]) -> None:
        if self.writer is None:
            self.writer = self.w.row_split("train", self.kind, self.dtype, self.opts.shard_tokens) if self.direct \
                else self.w.row_split(STAGING_SPLIT, self.kind, self.dtype, 1 << 62)
        parts = [p for _, row in kept for p in row.parts]
        self.writer.add_rows(np.concatenate([p for p, _ in parts]), np.concatenate([m for _, m in parts]),
                             np.array([p.shape[0] for p, _ in parts], dtype=np.int64),
                             np.array([r for r, _ in kept], dtype=np.int64),
                             labels=np.array([row.label for _, row in kept], dtype=np.uint8)
                             if self.kind == KIND_KTO else None,
                             columns=[row.columns for _, row in kept] if self.kind == KIND_PROMPTS else None)

    def splits(self) -> dict:
        """Each split's metadata: the staged rows split (exact and seeded, prepare's), or
        train as written."""
        staged = self.writer.close()
        if self.direct:
            return {"train": staged}
        n = staged["rows"]
        is_val = split_assignment(n, self.opts.val_split, self.opts.seed)
        if n - int(is_val.sum()) == 0:
            raise UsageError(f"--val-split {self.opts.val_split} of {n} rows leaves no training row; lower --val-split")
        writers = {False: self.w.row_split("train", self.kind, self.dtype, self.opts.shard_tokens),
                   True: self.w.row_split("val", self.kind, self.dtype, self.opts.shard_tokens)
                   if is_val.any() else None}
        split_rows(self.w.path / STAGING_SPLIT / staged["shards"][0]["name"], self.kind, self.dtype, is_val, writers)
        out = {name: wr.close() for name, wr in (("train", writers[False]), ("val", writers[True])) if wr is not None}
        shutil.rmtree(self.w.path / STAGING_SPLIT)
        return out


def prepare_pref(inputs: Sequence[str | Path], output_dir: str | Path, opts: PrefOptions,
                 progress: Callable[[Progress], None] | None = None, rl: bool = False,
                 planned: Callable[[BuildCheck], None] | None = None,
                 executor: PrefExecutor | None = None) -> PrefSummary:
    """Prepare preference records (``rl``: RL prompts) into a dataset at ``output_dir``:
    kind ``pairs`` (or ``kto`` when the records are KTO rows; ``prompts`` with ``rl``).
    Raises ``SftDataError``s; every record that cannot be written exactly is rejected by
    name into ``rejects.jsonl``.

    The build key is prepare-chat's (``prepare.build``, of kind "pairs" or "prompts"): a
    target that holds this build is up to date (nothing is read or written; the summary
    is the dataset's, ``up_to_date``); another is refused without ``overwrite`` naming what
    changed, ``force`` rebuilds regardless; ``planned`` is called with the decision first.
    ``executor``: render the chunks on a cluster (``sftdata.engine.pref_ray``; this process
    still reads the inputs and writes the rows, so the dataset is byte-identical)."""
    opts.validate()
    if not inputs:
        raise UsageError("no input files given")
    t0 = time.perf_counter()
    output_dir = local_path(output_dir)
    ctx, state = open_context(opts, rl)
    tok, profile = ctx.tok, ctx.profile
    options = {**opts.recorded(), "tokenizer": tok.path or tok.name}
    plan = plan_build(output_dir, expand_inputs(inputs), opts.decontaminate, state, options, opts.force,
                      kind=KIND_PROMPTS if rl else KIND_PAIRS)
    if plan.check.up_to_date:
        sweep_beside(output_dir)  # nothing to build, but what a killed run left beside it still goes
        summary = PrefSummary.of_dataset(str(output_dir), plan.check.target.metadata)
        summary.build_key, summary.libraries_changed = plan.check.key, library_changes(plan.check.target.metadata)
        summary.seconds = time.perf_counter() - t0
        return summary
    plan.check.refuse_unless(opts.overwrite or opts.force)
    if planned is not None:
        planned(plan.check)
    infos = [inspect_source(src) for src in plan.inputs]
    known = all(i.size_known for i in infos)
    total = sum(i.bytes for i in infos) if known else None
    dtype = token_dtype_for(tok.vocab_size)
    evals = load_evals(list(opts.decontaminate), opts.decontaminate_ngram, opts.max_record_bytes) \
        if opts.decontaminate else None
    curate = CurateSettings(opts.dedup, evals)
    with DatasetWriter(output_dir, overwrite=opts.overwrite or opts.force, wait=opts.wait) as w:
        g = _Gather(w, opts, rl, dtype, evals)
        rejects = w.path / REJECTS_FILE
        with open(rejects, "wb") as f, closing(pref_results(infos, ctx, curate, opts.workers, executor)) as results:
            rej = RejectsFile(f)  # bounded: past its size, rejects are counted only
            for res, pos in results:
                g.add(res, rej, rejects, output_dir)
                if progress:
                    progress(Progress(pos, total, g.records, 0))
            with writing(rejects, output_dir):
                rej.close()
        records, rejected, dedup, contaminated = g.records, g.rejected, g.dedup, g.contaminated
        for info in (i for i in infos if not records_sha256(i, opts.source_sha256)):  # as prepare-chat records it
            info.sha256 = None
        if g.writer is None:
            raise _all_rejected(inputs, records, rejected, rejects, output_dir, w.target)
        kind = g.kind
        with writing(w.path, output_dir):
            splits_meta = g.splits()
            w.write_json(TOKENIZER_FILE, state)
            write_serving(w.path, state, dtype)
        repaired, forms, counts, labels = g.repaired, g.forms, g.counts, g.labels
        summary = PrefSummary(str(output_dir), kind, records_read=records, rejected=dict(sorted(rejected.items())),
                              repaired=dict(sorted(repaired.items())), forms=dict(sorted(forms.items())),
                              truncated={"prompts_cut": counts["prompts_cut"],
                                         "completions_cut": counts["completions_cut"]},
                              labels=dict(sorted(labels.items())))
        for split, m in splits_meta.items():
            summary.rows[split] = m["rows"]
            summary.tokens[split] = m["tokens"]
            summary.trained_tokens[split] = m["trained_tokens"]
        metadata = {
            "kind": kind,
            "created_by": f"sftdata {__version__}",
            "token_dtype": dtype.name,
            "tokenizer": tok.summary() if profile is None else template_summary(tok, profile),
            "tokenizer_identity": recorded_identity(state, tok).as_dict(),
            "entries_per_row": ENTRIES_PER_ROW[kind],
            "splits": splits_meta,
            "pairs" if kind == KIND_PAIRS else "rows": dict(summary.rows),
            "truncation": opts.truncation.recorded(),
            "sources": [i.as_dict() for i in infos],
            "options": options,
            "counts": {"records_read": records, "rejected": summary.rejected, "repaired": summary.repaired,
                       "forms": summary.forms, "truncated": summary.truncated, "labels": summary.labels},
            "dedup": dedup.counts(),
        }
        summary.dedup = dedup.counts()
        summary.changed = list(plan.check.changes)
        metadata[BUILD] = plan.record(infos, state, options)  # from the inputs as read
        summary.build_key = metadata[BUILD]["key"]
        if evals is not None:
            summary.decontamination = {"ngram": evals.n, "files": [
                {**f, "contaminated": contaminated[i]} for i, f in enumerate(evals.describe())]}
            metadata["decontamination"] = summary.decontamination
        with writing(w.path, output_dir):
            w.commit(metadata)
    summary.seconds = time.perf_counter() - t0
    return summary
