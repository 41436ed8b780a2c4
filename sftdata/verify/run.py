"""``verify``: every check on a dataset, every problem as data (the CLI draws the report),
and ``VerifyReport``: what it returns, the checks it runs and their results.

The reader opens the dataset tolerantly and runs the structural checks
(``store.scan_dataset``); this adds the tokenizer check, the content checks (one read
of every shard), the trained-token counts, the packed references and the checksums
(hashed in threads beside the content checks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from ..chat.serving import token_strings
from ..errors import DatasetError, UsageError
from ..storage import METADATA_FILE, SPLITS
from ..storage.location import dataset_path
from ..store.format import EPISODES_FILE, ROW_KINDS, SERVING_FILE, TOKENIZER_FILE, TOKENS_FILE, Problem, in_check_order
from ..store.reader import Scan, read_one_generation, scan_dataset
from ..store.serving_file import read_serving
from ..store.structure import check_counts
from ..tasks import Engine
from ..util.cache import bypassed
from ..util.hashing import sha256_file
from .content import check_tokenizer
from .drift import DRIFT_CHECK, EPISODES, check_drift
from .media import MEDIA_CHECKS, check_media, media_source_problems
from .metadata import (
    NOT_RECORDED,
    any_ranges,
    check_metadata_checksum,
    check_ranges,
    check_tokenizer_identity,
    data_ranges,
    proven_shards,
    recorded_vocab,
)
from .references import check_references
from .retokenize import RETOKENIZE_CHECK, retokenize
from .rows import COLUMNS_CHECK, LABELS_CHECK, NO_EOS, ROW_MASK_RULE, ROWS, columns_skipped, labels_skipped
from .serving import ABSENT, serving_findings
from .shards import ShardChecks, ShardContext, check_shard, checksum_jobs, checksum_problems
from .sources import SourceCheck, check_source, recorded_sources, reproducible, source_bytes, source_problems
from .stops import StopFindings
from .tasks import check_shards, compare_tokens, retokenize_shards

_COMMON_HEAD = {
    "metadata": "metadata present, sftdata format, known version",
    "metadata_checksum": "metadata unedited: it hashes to the sha256 it records",
    "tokenizer": "tokenizer rebuilds with the recorded hash (ranks, or tokenizer.json) and is the metadata's",
    "files": "every file and shard present, none unlisted",
    "sizes": "file sizes agree with each other and with the metadata",
}
_COMMON_TAIL = {
    "vocab": "token ids below the vocabulary size",
    "mask_values": "mask values are 0 or 1",
    "ranges": "recorded token id and mask value ranges possible and equal to the data",
}
_STOPS = {
    "stops": "every trained reply ends with a trained stop id; the pad id is never trained and no stop id",
    "serving": "serving.json matches the tokenizer state and the data (stop ids, pad id, BOS, template)",
}
# run only when asked (``verify(sources=True)``, ``verify --sources``): it reads the input files
SOURCES_CHECK = {"sources": "input files recorded in the metadata present and unchanged"}
# ordered so that the most specific problem comes first (counts are often a consequence)
CHECKS: dict[str, str] = {
    **_COMMON_HEAD,
    "index": "episodes in bounds, sorted, contiguous, non-overlapping",
    "eos": "every episode ends with <|EOS|>",
    "counts": "episode, token, trained-token counts equal the metadata",
    **_COMMON_TAIL,
    "mask_rule": "the mask is the mask rule's, re-derived from the tokens",
    **MEDIA_CHECKS,
    **_STOPS,
    "checksums": "sha256 of every file equals the metadata",
}
PACKED_CHECKS: dict[str, str] = {
    **_COMMON_HEAD,
    "rows": "whole rows of row_len tokens, one index record per row",
    "segments": "segments sorted, tiling each row from offset 0 (positions rebuild)",
    "counts": "row, segment, token, trained-token counts equal the metadata",
    "references": "segments' episodes and records agree, and match the source",
    **_COMMON_TAIL,
    "mask_rule": "the mask is the rule's per segment; 0 on injected tokens",
    "padding": "each row's tail after its segments is the padding id",
    **MEDIA_CHECKS,
    **_STOPS,
    "checksums": "sha256 of every file equals the metadata",
}

# a pairs, KTO or prompts dataset (``rows``): the episodes' checks, a row's mask rule, KTO's labels;
# eos is skipped by name (a prompt ends with the generation prompt)
ROW_CHECKS: dict[str, str] = {**{k: CHECKS[k] for k in ("metadata", "metadata_checksum", "tokenizer", "files", "sizes", "index")},
                           "labels": LABELS_CHECK, "columns": COLUMNS_CHECK, "eos": CHECKS["eos"],
                           "counts": CHECKS["counts"], **_COMMON_TAIL,
                           "mask_rule": ROW_MASK_RULE, **MEDIA_CHECKS, **_STOPS, "checksums": CHECKS["checksums"]}

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


def checks_for(kind: str | None) -> dict[str, str]:
    return PACKED_CHECKS if kind == "packed" else ROW_CHECKS if kind in ROW_KINDS else CHECKS


@dataclass
class CheckResult:
    name: str
    description: str
    status: str  # "ok" | "failed" | "skipped"
    problems: int = 0
    note: str = ""


@dataclass
class VerifyReport:
    path: str
    layout: str | None
    kind: str | None
    quick: bool
    checks: list[CheckResult] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    splits: dict = field(default_factory=dict)  # split -> {"episodes", "tokens", "shards"}
    bytes_read: int = 0  # bytes of token/mask data checked plus bytes hashed
    bytes_hashed: int = 0
    seconds: float = 0.0
    sources: list[SourceCheck] | None = None  # the recorded input files, when asked (--sources)
    reproducible: bool | None = None  # every input file matches (None: not asked, or none recorded)
    retokenized: dict | None = None  # --retokenize N: episodes re-encoded by the tokenizers library, how many differ
    drift: dict | None = None  # --retokenize N: their input records rendered again by today's libraries (drift)
    cannot_stop: dict = field(default_factory=dict)  # split -> {"count", "episodes" (packed: "rows"): first ids}

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "layout": self.layout, "kind": self.kind, "quick": self.quick,
                "checks": [asdict(c) for c in self.checks], "problems": [p.as_dict() for p in self.problems],
                "notes": self.notes, "splits": self.splits, "bytes_read": self.bytes_read,
                "bytes_hashed": self.bytes_hashed, "seconds": round(self.seconds, 3),
                "sources": None if self.sources is None else [c.as_dict() for c in self.sources],
                "reproducible": self.reproducible, "cannot_stop": self.cannot_stop, "retokenized": self.retokenized,
                "drift": self.drift}


def check_results(kind: str | None, problems: list[Problem], skipped: dict[str, str], extra: dict | None = None
                  ) -> tuple[list[Problem], list[CheckResult]]:
    """The problems in check order (the most specific first), and each check's result:
    failed when it found a problem, else skipped when it could not run (and why), else ok.
    ``extra``: checks run on request (``SOURCES_CHECK``), after the others."""
    checks = {**checks_for(kind), **(extra or {})}
    problems = in_check_order(problems, checks)
    results = []
    for name, desc in checks.items():
        n = sum(p.check == name for p in problems)
        status = "failed" if n else ("skipped" if name in skipped else "ok")
        results.append(CheckResult(name, desc, status, n, skipped.get(name, "")))
    return problems, results


def verify(path: str | Path, *, quick: bool = False, token_dtype=None, tokenizer: str | None = None,
           progress: ProgressFn | None = None, hash_threads: int = 1, sources: bool = False,
           retokenize_episodes: int = 0, executor: Engine | None = None,
           rerender: Callable | None = None) -> VerifyReport:
    """Run every check on the dataset at ``path``; never stops at the first problem.

    ``quick`` skips the checksums (and the comparison of the recorded value ranges with
    the data). ``sources`` also re-hashes the input files the metadata records
    (``report.sources``, ``report.reproducible``); without it no input file is read.
    ``token_dtype`` and ``tokenizer`` matter only for the older flat layout, which
    records neither. ``retokenize_episodes``: decode that many sampled episodes and
    re-encode them with the tokenizers library (a model's own tokenizer.json; the
    ``retokenize`` check), and render their input records again with the libraries
    installed now (the ``drift`` check; ``rerender``: the rendering of every kind,
    ``sftdata.prepare.rerender_records``, which this layer cannot import; without it
    the check is skipped). Every kind runs the same checks where they mean something
    (``checks_for``); the others are skipped by name, with why. ``executor``: where each shard's data is read and checked
    (``sftdata.engine.ray_engine``; default this process); the report is the same.
    With ``sources`` or ``retokenize_episodes`` no entry of the user's cache is read
    (``util.cache.bypassed``): the tokenizer is rebuilt from its files, as a proof needs.
    Raises ``DatasetError`` only when ``path`` holds no dataset at all. A dataset that a
    writer replaces while it is verified is verified again (``read_one_generation``): the
    report is of the old dataset or of the new one, never of a mix.
    """
    root = dataset_path(path)  # a path, a file:// URL, or an object-store URL (fetched into the cache)
    # the checks that prove the dataset from its sources read no cached table, fact or hash
    with bypassed() if sources or retokenize_episodes else contextlib.nullcontext():
        return read_one_generation(root, lambda: _verify(root, quick, token_dtype, tokenizer, progress,
                                                         hash_threads, sources, retokenize_episodes, executor,
                                                         rerender))


@dataclass
class _Run:
    """One verify of one dataset: what its steps share (the scan, the problems found so
    far, the notes, the checks skipped and why, the bytes read for the progress)."""

    scan: Scan
    quick: bool
    progress: ProgressFn | None
    found: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    done: int = 0
    total: int = 0
    meta_sealed: bool = False  # the metadata hashes to the sha256 it records

    @property
    def ds(self):
        return self.scan.dataset

    @property
    def meta(self) -> dict | None:
        return self.scan.dataset.metadata

    @property
    def row_kind(self) -> bool:
        return self.scan.dataset.kind in ROW_KINDS

    def skip(self, checks: tuple[str, ...], why: str) -> None:
        for c in checks:
            self.skipped.setdefault(c, why)

    def tick(self, nbytes: int) -> None:
        self.done += nbytes
        if self.progress:
            self.progress(self.done, self.total)

    def usable(self) -> list:
        """The shards whose segments the reader found usable (every shard but a packed one's damaged)."""
        return [sh for sh in self.ds.shards if sh.rel not in self.scan.bad_segments]


def _verify(path: Path, quick: bool, token_dtype, tokenizer: str | None, progress: ProgressFn | None,
            hash_threads: int, sources: bool, retokenize_episodes: int, executor: Engine | None,
            rerender: Callable | None) -> VerifyReport:
    """The skeleton every kind runs (episodes, packed, pairs, KTO, prompts): what cannot
    mean anything for a kind is skipped by name, with why (``_open``)."""
    t0 = time.perf_counter()
    run = _open(path, quick, token_dtype, tokenizer, progress)
    ds, meta, root = run.ds, run.meta, run.ds.root
    tc = _tokenizer(run, tokenizer)
    jobs, top_missing, top_resized = checksum_jobs(root, meta, ds.shards) if meta is not None else ([], [], [])
    jobs = [] if quick else jobs
    run.total = sum(sh.data_bytes for sh in ds.shards) + sum(j[1].stat().st_size for j in jobs) + \
        (source_bytes(meta) if sources else 0)
    report = VerifyReport(str(root), ds.layout, ds.kind, quick)
    stops, serving, serving_error = _stops(run, tc)
    ctx = ShardContext(ds.kind == "packed", run.scan.row_len, recorded_vocab(tc.vocab, meta, ds.tokenizer_state),
                       _pad_id(meta), tokenizer is not None, frozenset(run.scan.bad_segments),
                       ds.kind if run.row_kind else None)
    results, remote = _shards(run, report, ctx, None if "stops" in run.skipped else stops, jobs, executor,
                              hash_threads, sources)
    if meta is not None:
        run.found += checksum_problems(results, meta, ds.shards)
        # the recorded value ranges against the vocabulary, and (not --quick) the data's,
        # measured where no checksum already proves them equal
        proven = proven_shards(meta, ds.shards, results, run.meta_sealed)
        measured = {sh.rel: r.ranges for sh, r in zip(ds.shards, remote or []) if r.ranges is not None}
        data = None if quick else {sh.rel: measured[sh.rel] if sh.rel in measured else data_ranges(sh)
                                   for sh in ds.shards if sh.rel not in proven}
        run.found += check_ranges(meta, ds.shards, None if ctx.vocab is None else ctx.vocab.size, data)
    if not any(sh.mask is not None for sh in ds.shards):
        run.skip(("mask_values", "mask_rule", "stops"), "no mask.bin")
    if stops is not None:
        _serving(run, report, stops, tc, serving, serving_error)
    _media(run)
    if retokenize_episodes > 0:
        _resample(run, report, retokenize_episodes, executor, rerender)
    # within a check, the problems keep the order they were found in: top-level file sizes
    # before the shards' sizes, the shards' missing files before the top-level ones
    problems = top_resized + [p for p in run.scan.problems if p.check != "counts"] + tc.problems + top_missing + \
        run.found
    extra = {**(SOURCES_CHECK if sources else {}),
             **({**RETOKENIZE_CHECK, **DRIFT_CHECK} if retokenize_episodes > 0 else {})}
    report.problems, report.checks = check_results(ds.kind, problems, run.skipped, extra or None)
    report.notes = run.notes
    items = "rows" if ctx.rows or run.row_kind else "episodes"
    for split in SPLITS:
        mine = [sh for sh in ds.shards if sh.split == split]
        if mine:
            report.splits[split] = {items: sum(sh.num_items // sh.entries for sh in mine),
                                    "tokens": sum(sh.num_tokens for sh in mine), "shards": len(mine)}
    report.bytes_read = run.done
    report.seconds = time.perf_counter() - t0
    return report


def _open(path: Path, quick: bool, token_dtype, tokenizer: str | None, progress: ProgressFn | None) -> _Run:
    """The dataset scanned (the reader's structural checks), the options it cannot take
    refused, and the checks that cannot mean anything for it skipped, with why."""
    run = _Run(scan_dataset(path, token_dtype=token_dtype), quick, progress)
    scan, ds = run.scan, run.ds
    if tokenizer is not None and scan.tokenizer_file:
        raise UsageError(f"--tokenizer is for older flat layouts; {ds.root} records its tokenizer in {TOKENIZER_FILE}")
    if token_dtype is not None and scan.metadata_file:
        raise UsageError(f"--token-dtype is for older flat layouts; {ds.root} records its token dtype in "
                         f"{METADATA_FILE}")
    if not scan.metadata_file:
        if ds.layout == "flat":
            run.notes.append(f"older flat layout without {METADATA_FILE}: counts, file sizes and checksums cannot be "
                             "checked against a record of what was written")
        run.skip(("counts", "checksums", "metadata_checksum", "ranges"), "no metadata")
    if ds.kind == "packed" and scan.row_len is None:
        run.skip(("rows", "segments", "references", "mask_rule", "padding"), "no packing.row_len")
    if run.row_kind:
        run.skip(("eos",), NO_EOS)
        for name, why in (("labels", labels_skipped(ds.kind)), ("columns", columns_skipped(ds.kind))):
            if why:
                run.skip((name,), why)
    if scan.dtype_guessed and run.meta is None and ds.layout == "flat":
        run.notes.append("no metadata: tokens read as uint32 (pass --token-dtype uint16 if they are not)")
    run.notes += [f"{s}/{TOKENS_FILE} has no {EPISODES_FILE}: a token stream, not episodes; not checked"
                  for s in scan.token_streams]
    if quick:
        run.skip(("checksums",), "--quick")
    return run


def _tokenizer(run: _Run, tokenizer: str | None):
    """The tokenizer check, its identity in the metadata, and the metadata's own checksum."""
    ds, meta = run.ds, run.meta
    tc = check_tokenizer(run.scan, tokenizer)
    run.notes += [tc.note] if tc.note else []
    run.found += check_tokenizer_identity(meta, ds.tokenizer_state, tc.vocab)
    if meta is not None:
        sums, why = check_metadata_checksum(meta)
        run.found += sums
        run.meta_sealed = not sums and why is None
        if why:
            run.skip(("metadata_checksum",), why)
        if not any_ranges(meta, ds.shards):
            run.skip(("ranges",), NOT_RECORDED)
    if tc.unknown:
        run.skip(("vocab", "eos", "mask_rule"), "tokenizer unknown")
    if tc.unchecked:
        run.skip(("tokenizer",), tc.unchecked)
    if tc.vocab is not None and tc.vocab.rule.eos_id is None:
        run.skip(("eos",), "a chat template's episodes end as it writes them")
    return tc


def _pad_id(meta: dict | None) -> int | None:
    pad_id = ((meta or {}).get("packing") or {}).get("pad_token_id")
    return pad_id if isinstance(pad_id, int) and not isinstance(pad_id, bool) else None


def _stops(run: _Run, tc) -> tuple[StopFindings | None, dict | None, DatasetError | None]:
    """The stops check's findings (None: the tokenizer is unknown) and serving.json as read."""
    ds, packed = run.ds, run.ds.kind == "packed"
    serving, serving_error = _read_serving(ds.root)
    if tc.vocab is None:
        run.skip(("stops", "serving"), "tokenizer unknown")
        return None, serving, serving_error
    data_pad = _pad_id(run.meta) if packed else tc.vocab.rule.pad_id
    accepted = bool((serving or {}).get("pad_is_stop")) and (serving or {}).get("pad_id") == data_pad
    stops = StopFindings(tc.vocab.rule, data_pad, token_strings(ds.tokenizer_state or {}), accepted,
                         "rows" if packed else "episodes")
    rule_found, stop_notes = stops.rule_problems()
    run.found += rule_found
    run.notes += stop_notes
    cut = (((run.meta or {}).get("counts") or {}).get("truncated") or {}).get("completions_cut") if run.row_kind else 0
    if cut:
        run.skip(("stops",), f"{cut:,} completion(s) cut by --max-length end inside their reply")
    return stops, serving, serving_error


def _shards(run: _Run, report: VerifyReport, ctx: ShardContext, stops: StopFindings | None, jobs: list,
            executor: Engine | None, hash_threads: int, sources: bool) -> tuple[list, list[ShardChecks] | None]:
    """Every shard read once (here, or as the engine's tasks), the files hashed in threads
    beside, the counts and the packed references, and (``sources``) the input files; the
    checksums found (file, sha256 found, recorded, shard) and the tasks' answers."""
    meta, shards = run.meta, run.ds.shards
    remote: list[ShardChecks] | None = None
    with ThreadPoolExecutor(max_workers=max(1, hash_threads)) as pool:
        here = jobs if executor is None else [j for j in jobs if j[3] is None]  # a task hashes its shard's files
        futures = {j[0]: pool.submit(sha256_file, j[1]) for j in here}  # runs beside the checks below
        src_futures = [pool.submit(check_source, rec) for rec in (recorded_sources(meta) if sources else [])]
        if executor is None:
            for sh in shards:
                run.found += check_shard(sh, ctx, run.tick, stops)
            trained = [None if sh.mask is None else int(np.count_nonzero(sh.mask)) for sh in shards] \
                if meta is not None else []
        else:
            remote = []
            for r in check_shards(executor, shards, ctx, stops, [[j for j in jobs if j[3] == sh.rel] for sh in shards],
                                  meta, run.meta_sealed, run.quick):
                remote.append(r)
                run.found += r.problems
                if stops is not None:
                    stops.absorb(r.cannot_stop)
                run.tick(r.bytes_read)
            trained = [r.trained for r in remote]
        if meta is not None:  # the reader's counts, with the trained tokens measured here
            run.found += check_counts(meta, shards, packed=ctx.packed, trained=trained)
        if ctx.rows:
            refs, ref_notes = check_references(run.usable(), meta, ctx.row_len,
                                               None if executor is None else partial(compare_tokens, executor))
            run.found += refs
            run.notes += ref_notes
        results = []
        hashed = {fn: h for r in remote or [] for fn, h in r.sha256.items()}
        for fn, p, rec, shard in jobs:
            results.append((fn, futures[fn].result() if fn in futures else hashed[fn], rec.get("sha256"), shard))
            report.bytes_hashed += p.stat().st_size
            run.tick(p.stat().st_size)
        if sources:
            _sources(run, report, [f.result() for f in src_futures])
    return results, remote


def _media(run: _Run) -> None:
    """The ``media`` check (a text dataset: skipped, with why)."""
    found = check_media(run.ds)
    run.found += found.problems
    run.notes += found.notes
    if found.skipped:
        run.skip(tuple(MEDIA_CHECKS), found.skipped)


def _sources(run: _Run, report: VerifyReport, checks: list[SourceCheck]) -> None:
    """``--sources``: each recorded input file found as recorded, or a problem naming it;
    the media of a dataset with media read again and hashed."""
    report.sources, report.reproducible = checks, reproducible(checks)
    run.tick(source_bytes(run.meta))
    run.found += source_problems(checks)
    media, media_notes = media_source_problems(run.ds)
    run.found += media
    run.notes += media_notes
    if media:
        report.reproducible = False
    if not checks and not run.ds.has_media:
        run.notes.append(_no_sources_note(run.meta, run.ds.kind))
        run.skip(("sources",), "no input files recorded")


def _serving(run: _Run, report: VerifyReport, stops: StopFindings, tc, serving: dict | None,
             serving_error: DatasetError | None) -> None:
    """The stops found in the data, and serving.json against them and the tokenizer state."""
    ds = run.ds
    report.cannot_stop = stops.cannot_stop
    served, why = serving_findings(ds.root, serving_error, serving, ds.tokenizer_state, tc.vocab.rule, stops.pad_id,
                                   run.usable(), ds.token_dtype, ds.kind == "packed", run.scan.row_len)
    run.found += served
    if why:
        run.skip(("serving",), why)
        if why == ABSENT:
            run.notes.append(f"{SERVING_FILE}: {ABSENT} of sftdata (re-create the dataset to get one)")


def _resample(run: _Run, report: VerifyReport, n: int, executor: Engine | None, rerender: Callable | None) -> None:
    """``--retokenize N``: N sampled episodes (rows) re-encoded by the tokenizers library, and
    their input records rendered again by the libraries installed now (a row: every entry's
    ids and masks, ``rows.ROWS``)."""
    ds = run.ds
    if ds.kind == "packed":
        run.skip(("retokenize", "drift"), "a packed dataset: retokenize its source dataset")
        return
    retok = retokenize(run.usable(), ds.tokenizer_state, n,
                       run=None if executor is None else partial(retokenize_shards, executor))
    run.found += retok.problems
    report.retokenized = retok.as_dict()
    if retok.skipped:
        run.skip(("retokenize",), retok.skipped)
    drift = check_drift(run.usable(), run.meta, ds.tokenizer_state, n, rerender=rerender,
                        kind=ROWS if run.row_kind else EPISODES)
    run.found += drift.problems
    report.drift = drift.as_dict()
    if drift.skipped:
        run.skip(("drift",), drift.skipped)


def _read_serving(root) -> tuple[dict | None, DatasetError | None]:
    try:
        return read_serving(root), None
    except DatasetError as e:
        return None, e


def _no_sources_note(meta: dict | None, kind: str | None) -> str:
    """Why ``--sources`` had nothing to read."""
    if meta is None:
        return f"--sources: no {METADATA_FILE}, so no input files are recorded"
    src = (meta.get("source") or {}).get("path") if kind == "packed" and isinstance(meta.get("source"), dict) else None
    if src:
        return f"--sources: a packed dataset records no input files; run `sftdata verify {src} --sources` on its source"
    return f"--sources: {METADATA_FILE} records no input files"
