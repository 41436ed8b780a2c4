"""Pairs, KTO rows and RL prompts as a kind of row (``RowsKind``), which the one build driver
(``sftdata.prepare.driver``) builds as it builds episodes::

    records ──parse_preference──► render_record (token-space split, proven) ──► one
        truncation cut per pair ──► a row: prompt and completion(s) (a prompt alone, and
        its columns: RL) ──► the driver: curation, rejects, the exact split, the commit

Verify renders a row again with the same functions (``open_context``, ``start_chunk``,
``finish_chunk``: ``sftdata.prepare.rerender``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import orjson

from ..chat.loss_rule import rule_from_state
from ..chat.pair_rule import completion_mask
from ..curate import CurateSettings, RecordKeys, canonical_text, concat_keys, exact_key
from ..curate.minhash import shingle_hashes, signatures
from ..errors import RecordError
from ..records.conversation import decode_json
from ..records.preference import PreferenceRecord, parse_preference, parse_prompt, value_texts
from ..records.turns import TurnPolicy
from ..sources import RawRecord, SourceInfo
from ..store.build_key import BuildSummary
from ..store.format import ENTRIES_PER_ROW, KIND_KTO, KIND_PAIRS, KIND_PROMPTS
from ..store.rows import Rows
from ..template import open_for_build, tokenizer_state
from .options import PrefOptions
from .render import PairRender, RenderingChunk, finish_records, one_process_run, render_prompt, start_records
from .truncate import Cut, plan_cut


@dataclass
class PrefSummary(BuildSummary):
    kind: str = KIND_PAIRS
    rows: dict = field(default_factory=dict)  # split -> pairs / KTO rows / prompts
    forms: dict = field(default_factory=dict)  # record form -> rows kept
    truncated: dict = field(default_factory=dict)  # prompts_cut, completions_cut (rows)
    labels: dict = field(default_factory=dict)  # kto: desirable / undesirable rows

    def as_dict(self) -> dict:
        return {"output_dir": self.output_dir, "kind": self.kind, "records_read": self.records_read,
                "rows": self.rows, "tokens": self.tokens, "trained_tokens": self.trained_tokens,
                "rejected": self.rejected, "repaired": self.repaired, "forms": self.forms,
                "truncated": self.truncated, "labels": self.labels, "dedup": self.dedup,
                "decontamination": self.decontamination, "seconds": round(self.seconds, 3), **self.key_dict()}

    @classmethod
    def of_dataset(cls, output_dir: str, meta: dict) -> PrefSummary:
        """The summary of the dataset a run found up to date, from its metadata."""
        counts = meta.get("counts") or {}
        out = cls.found(output_dir, meta, kind=meta.get("kind", KIND_PAIRS), forms=counts.get("forms") or {},
                        truncated=counts.get("truncated") or {}, labels=counts.get("labels") or {})
        out.rows = {split: m.get("rows", 0) for split, m in (meta.get("splits") or {}).items()}
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

    def __reduce__(self):  # pickled as what rebuilds it (a tokenizer pickles as its path and sha256)
        return _context, (self.tok, self.profile, self.opts, self.rl)


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
    tok, profile, state = open_for_build(opts)
    return _context(tok, profile, opts, rl, state), state


def _context(tok, profile, opts: PrefOptions, rl: bool, state: dict | None = None) -> Context:
    state = state or (tok.state() if profile is None else tokenizer_state(tok, profile))
    return Context(tok, profile, rule_from_state(state), opts.policy, opts,
                   _special_flags(tok), rl)


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
class StartedChunk:
    """``start_chunk``'s chunk: its records, per record its outcome so far (a ``Row`` of an
    RL prompt, a reject's (reason, message), or None while its pair renders), and the
    preference records rendering."""

    items: Sequence[RawRecord]
    out: list
    pending: list[tuple[int, PreferenceRecord, str]]
    rendering: RenderingChunk


def start_chunk(items: Sequence[RawRecord], ctx: Context, pool: Executor | None = None) -> StartedChunk:
    """The first half of ``PairWork.outcome``: each record of the chunk read and rendered, the
    texts of its preference records, as one chunk, being tokenized (on ``pool``'s thread
    when given, while the caller starts the next chunk: ``render.start_records``)."""
    out: list = [None] * len(items)
    pending: list[tuple[int, PreferenceRecord, str]] = []
    for i, rec in enumerate(items):
        if rec.reject is not None:  # decided while reading (too large to read)
            out[i] = rec.reject
            continue
        try:
            obj = decode_json(rec.raw, rec.where) if isinstance(rec.raw, (bytes, str)) else rec.raw
            if ctx.rl:
                out[i] = _prompt_row(obj, rec.raw, rec.where, ctx)
            else:
                pending.append((i, parse_preference(obj, rec.where, ctx.opts.form), rec.where))
        except RecordError as e:
            out[i] = (e.reason, e.detail)
    rendering = start_records([(pr, where) for _, pr, where in pending], ctx.tok, ctx.profile, ctx.policy, pool)
    return StartedChunk(items, out, pending, rendering)


def finish_chunk(started: StartedChunk, ctx: Context, curate: CurateSettings) -> PrefChunk:
    """The second half of ``PairWork.outcome``: the chunk's rows, its rejects and the rows' keys."""
    out = started.out
    for (i, pr, where), r in zip(started.pending, finish_records(started.rendering, ctx.tok, ctx.rule)):
        try:
            out[i] = (r.reason, r.detail) if isinstance(r, RecordError) else _pair_row(pr, r, where, ctx)
        except RecordError as e:
            out[i] = (e.reason, e.detail)
    rejects, rows = [], []
    for rec, got in zip(started.items, out):
        if isinstance(got, Row):
            rows.append((rec.record, rec.where, got))
        else:
            rejects.append((rec.record, rec.where, *got))
    keys = row_keys(rows, curate)
    # the text has served (keys): not sent back
    return PrefChunk(len(started.items), rejects, [(r, w, dataclasses.replace(row, text="")) for r, w, row in rows],
                     keys)


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


KINDS = (KIND_PAIRS, KIND_KTO, KIND_PROMPTS)


@dataclass
class RowFacts:
    """What the coordinator of a partitioned run learns of each row a task staged, in record
    order (no token, no text, no record number: its staged rows' records are those; two
    bytes a row): its kind, KTO label and cuts (``bits``: kind, label + 1, prompt cut,
    completion cut), its form, and (few) its repairs."""

    bits: np.ndarray  # uint8: kind index (KINDS) | (label + 1) << 2 | prompt cut << 4 | completion cut << 5
    forms: np.ndarray  # index in ``names``
    names: list = field(default_factory=list)
    repairs: list = field(default_factory=list)  # (row, repairs) of the rows with any

    @classmethod
    def of(cls, rows: list[tuple[int, str, Row]]) -> RowFacts:
        names = sorted({row.form for _, _, row in rows})
        bits = [KINDS.index(row.kind) | (0 if row.label is None else row.label + 1) << 2 | row.prompt_cut << 4
                | row.completion_cut << 5 for _, _, row in rows]
        return cls(np.array(bits, np.uint8), np.array([names.index(row.form) for _, _, row in rows], np.uint8), names,
                   [(i, row.repairs) for i, (_, _, row) in enumerate(rows) if row.repairs])

    def __add__(self, other: RowFacts) -> RowFacts:
        names = sorted(set(self.names) | set(other.names))
        forms = [np.array([names.index(f.names[i]) for i in f.forms.tolist()], np.uint8) for f in (self, other)]
        n = self.bits.shape[0]
        return RowFacts(np.concatenate([self.bits, other.bits]), np.concatenate(forms), names,
                        self.repairs + [(i + n, r) for i, r in other.repairs])

    def rows(self, records: np.ndarray):
        """Each row (its record from ``records``) as ``(record, where, kind, label, form,
        repairs, prompt_cut, completion_cut)`` (where: None, the coordinator knows it)."""
        repairs = dict(self.repairs)
        for i, (r, b, f) in enumerate(zip(records.tolist(), self.bits.tolist(), self.forms.tolist())):
            yield r, None, KINDS[b & 3], None if not b >> 2 & 3 else (b >> 2 & 3) - 1, self.names[f], \
                repairs.get(i, ()), bool(b >> 4 & 1), bool(b >> 5 & 1)


@dataclass
class PrefChunk:
    """What one chunk of records became (picklable: sent back from a worker): its records,
    the rejected ones ``(record, where, reason, message)`` and the rows ``(record, where,
    Row)`` (a partition task's: their ``RowFacts``, the rows staged), in input order, and
    the curating keys of its rows (``RecordKeys``, rows in the same order)."""

    records: int
    rejects: list
    rows: list | RowFacts
    keys: RecordKeys | None
    staged: dict | None = None  # a partition task staged the rows: {kind: StagedPart}

    def facts(self):
        """Each row as ``RowFacts.rows`` gives them."""
        if isinstance(self.rows, RowFacts):  # a partition's: its rows' records are those it staged
            staged = [p.sources for p in self.staged.values()]
            yield from self.rows.rows(np.sort(np.concatenate(staged)) if staged else np.empty(0, np.int64))
            return
        for record, where, row in self.rows:
            yield record, where, row.kind, row.label, row.form, row.repairs, row.prompt_cut, row.completion_cut

    def shifted(self, first: int) -> PrefChunk:
        """This chunk with its record numbers counted from ``first`` (in place)."""
        if first:
            self.rejects = [(r + first, *rest) for r, *rest in self.rejects]
            if self.keys is not None:
                self.keys.shift(first)
        return self


@dataclass
class PairWork:
    """What a worker or partition task (``sftdata.prepare.partition_task``) makes of a chunk
    of records: rows (``outcome``); a partition task's staged per kind, and their
    ``RowFacts``."""

    ctx: Context

    def outcome(self, items: Sequence[RawRecord], memo, curate: CurateSettings) -> PrefChunk:
        """One chunk of records rendered into rows (pure but for the tokenizer), with their keys."""
        return finish_chunk(start_chunk(items, self.ctx), self.ctx, curate)

    @staticmethod
    def merged(acc: PrefChunk | None, res: PrefChunk | None) -> PrefChunk:
        res = res or PrefChunk(0, [], RowFacts.of([]), None)
        if acc is None:
            return res
        return PrefChunk(acc.records + res.records, acc.rejects + res.rejects, acc.rows + res.rows,
                         concat_keys(acc.keys, res.keys))

    def chunk(self, items: Sequence[RawRecord], memo, curate: CurateSettings) -> tuple[PrefChunk, dict]:
        res = self.outcome(items, memo, curate)
        rows = {k: rows_of(k, [(r, row) for r, _, row in res.rows if row.kind == k]) for k in KINDS}
        return PrefChunk(res.records, res.rejects, RowFacts.of(res.rows), res.keys), rows


def rows_of(kind: str, kept: list[tuple[int, Row]]) -> Rows:
    """The ``Rows`` of ``kept`` (record, row), all of ``kind``."""
    parts = [p for _, row in kept for p in row.parts]
    if not parts:
        return Rows(np.empty(0, np.uint32), np.empty(0, np.uint8), np.empty(0, np.int64), np.empty(0, np.int64),
                    ENTRIES_PER_ROW[kind])
    return Rows(np.concatenate([p for p, _ in parts]), np.concatenate([m for _, m in parts]),
                np.array([p.shape[0] for p, _ in parts], dtype=np.int64), np.array([r for r, _ in kept], dtype=np.int64),
                ENTRIES_PER_ROW[kind],
                labels=np.array([row.label for _, row in kept], dtype=np.uint8) if kind == KIND_KTO else None,
                columns=[row.columns for _, row in kept] if kind == KIND_PROMPTS else None)


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


class RowsKind:
    """Pairs and KTO rows (the dataset's kind: its first kept row's), or RL prompts (``rl``):
    the kind of row the build driver (``sftdata.prepare.driver``) knows them by."""

    item, same = "row", "the same prompt and completions as"
    trains = remote = empty_val = counts_tokens = local_parts = False
    records_dedup = True
    summary_type = PrefSummary
    memo_opts = None

    def __init__(self, opts: PrefOptions, rl: bool):
        self.opts, self.rl = opts, rl
        self.build_kind = KIND_PROMPTS if rl else KIND_PAIRS
        self.store_kind = KIND_PROMPTS if rl else None
        self.repaired, self.forms, self.counts, self.labels = Counter(), Counter(), Counter(), Counter()

    def open(self) -> None:
        self.ctx, self.state = open_context(self.opts, self.rl)
        self.tok, self.profile, self.work = self.ctx.tok, self.ctx.profile, PairWork(self.ctx)

    @contextmanager
    def local(self, curate: CurateSettings):
        """Each chunk's texts tokenized on a second thread while the next one renders."""
        with one_process_run() as pool:
            yield (lambda items: start_chunk(items, self.ctx, pool)), (lambda s: finish_chunk(s, self.ctx, curate))

    def new_summary(self, output_dir: str) -> PrefSummary:
        return PrefSummary(output_dir, kind=self.build_kind)

    def accept(self, chunk: PrefChunk, drop: set[int]) -> tuple[list, object]:
        """The rows of ``chunk`` but those of ``drop`` (a partitioned run's: its staged part
        of the dataset's kind, those left out); a row of another kind than the dataset's is
        rejected (``mixed_kinds``); the kept ones are counted."""
        own, kept = [], set()
        for record, where, kind, label, form, repairs, prompt_cut, completion_cut in chunk.facts():
            if record in drop:
                continue
            if self.store_kind is None:
                self.store_kind = kind
            elif self.store_kind != kind:  # (a partitioned run's: where None, the driver names it)
                own.append((record, where, "mixed_kinds", f"a {kind} row in a {self.store_kind} dataset (the first "
                            f"kept row decided); prepare pairs and KTO rows into separate datasets"))
                continue
            kept.add(record)
            if label is not None:
                self.labels["desirable" if label else "undesirable"] += 1
            if form:
                self.forms[form] += 1
            self.repaired.update(repairs)
            self.counts["prompts_cut"] += prompt_cut
            self.counts["completions_cut"] += completion_cut
        if chunk.staged is not None:
            part = chunk.staged.get(self.store_kind)
            return own, None if part is None else part.without(drop | {r for r, *_ in own})
        return own, rows_of(self.store_kind, [(r, row) for r, _, row in chunk.rows if r in kept]) if kept else None

    def finish(self, summary: PrefSummary, splits: dict, infos: list[SourceInfo]) -> tuple[dict, dict, dict]:
        kind = summary.kind = self.store_kind
        summary.repaired, summary.forms = dict(sorted(self.repaired.items())), dict(sorted(self.forms.items()))
        summary.truncated = {"prompts_cut": self.counts["prompts_cut"], "completions_cut": self.counts["completions_cut"]}
        summary.labels = dict(sorted(self.labels.items()))
        summary.add_splits(splits)
        summary.rows = {split: m["rows"] for split, m in splits.items()}
        counts = {"repaired": summary.repaired, "forms": summary.forms, "truncated": summary.truncated,
                  "labels": summary.labels}
        return ({"entries_per_row": ENTRIES_PER_ROW[kind]}, counts,
                {"pairs" if kind == KIND_PAIRS else "rows": dict(summary.rows), "truncation": self.opts.truncation.recorded()})
