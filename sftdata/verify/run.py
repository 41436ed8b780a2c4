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
from ..store.format import EPISODES_FILE, METADATA_FILE, SERVING_FILE, SPLITS, TOKENIZER_FILE, TOKENS_FILE, Problem, in_check_order
from ..store.location import dataset_path
from ..store.reader import read_one_generation, scan_dataset
from ..store.serving_file import read_serving
from ..store.structure import check_counts
from ..tasks import Engine
from ..util.cache import bypassed
from ..util.hashing import sha256_file
from .content import check_tokenizer
from .drift import DRIFT_CHECK, check_drift
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
    **_STOPS,
    "checksums": "sha256 of every file equals the metadata",
}

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


def checks_for(kind: str | None) -> dict[str, str]:
    return PACKED_CHECKS if kind == "packed" else CHECKS


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
    installed now (the ``drift`` check; ``rerender``: ``sftdata.prepare.rerender_records``,
    which this layer cannot import; without it the check is skipped). ``executor``: where each shard's data is read and checked
    (``sftdata.engine.verify_ray.ray_verify_executor``; default this process); the report is the same.
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


def _verify(path: Path, quick: bool, token_dtype, tokenizer: str | None, progress: ProgressFn | None,
            hash_threads: int, sources: bool, retokenize_episodes: int, executor: Engine | None,
            rerender: Callable | None) -> VerifyReport:
    t0 = time.perf_counter()
    scan = scan_dataset(path, token_dtype=token_dtype)
    ds, meta, root = scan.dataset, scan.dataset.metadata, scan.dataset.root
    if tokenizer is not None and scan.tokenizer_file:
        raise UsageError(f"--tokenizer is for older flat layouts; {root} records its tokenizer in {TOKENIZER_FILE}")
    if token_dtype is not None and scan.metadata_file:
        raise UsageError(f"--token-dtype is for older flat layouts; {root} records its token dtype in {METADATA_FILE}")
    packed, row_len = ds.kind == "packed", scan.row_len
    rows = packed and row_len is not None  # the packed checks can run
    notes: list[str] = []
    skipped: dict[str, str] = {}

    def skip(checks: tuple[str, ...], why: str) -> None:
        for c in checks:
            skipped.setdefault(c, why)

    if not scan.metadata_file:
        if ds.layout == "flat":
            notes.append(f"older flat layout without {METADATA_FILE}: counts, file sizes and checksums cannot be "
                         "checked against a record of what was written")
        skip(("counts", "checksums", "metadata_checksum", "ranges"), "no metadata")
    if packed and row_len is None:
        skip(("rows", "segments", "references", "mask_rule", "padding"), "no packing.row_len")
    tc = check_tokenizer(scan, tokenizer)
    notes += [tc.note] if tc.note else []
    found = check_tokenizer_identity(meta, ds.tokenizer_state, tc.vocab)
    vocab = recorded_vocab(tc.vocab, meta, ds.tokenizer_state)  # ids below every recorded vocabulary
    if meta is not None:
        sums, why = check_metadata_checksum(meta)
        found += sums
        meta_sealed = not sums and why is None
        if why:
            skip(("metadata_checksum",), why)
        if not any_ranges(meta, ds.shards):
            skip(("ranges",), NOT_RECORDED)
    if tc.unknown:
        skip(("vocab", "eos", "mask_rule"), "tokenizer unknown")
    if tc.unchecked:
        skip(("tokenizer",), tc.unchecked)
    if tc.vocab is not None and tc.vocab.rule.eos_id is None:
        skip(("eos",), "a chat template's episodes end as it writes them")
    if scan.dtype_guessed and meta is None and ds.layout == "flat":
        notes.append("no metadata: tokens read as uint32 (pass --token-dtype uint16 if they are not)")
    notes += [f"{s}/{TOKENS_FILE} has no {EPISODES_FILE}: a token stream, not episodes; not checked"
              for s in scan.token_streams]
    if quick:
        skip(("checksums",), "--quick")
    shards = ds.shards
    # the top-level files' sizes are checked on --quick too (the reader checks the shards')
    jobs, top_missing, top_resized = checksum_jobs(root, meta, shards) if meta is not None else ([], [], [])
    jobs = [] if quick else jobs
    in_sources = recorded_sources(meta) if sources else []
    total = sum(sh.data_bytes for sh in shards) + sum(j[1].stat().st_size for j in jobs) + \
        (source_bytes(meta) if sources else 0)
    done = [0]

    def tick(nbytes: int) -> None:
        done[0] += nbytes
        if progress:
            progress(done[0], total)

    report = VerifyReport(str(root), ds.layout, ds.kind, quick)
    pad_id = ((meta or {}).get("packing") or {}).get("pad_token_id")
    pad_id = pad_id if isinstance(pad_id, int) and not isinstance(pad_id, bool) else None
    serving, serving_error = _read_serving(root)
    stops = None
    if tc.vocab is not None:
        data_pad = pad_id if packed else tc.vocab.rule.pad_id
        accepted = bool((serving or {}).get("pad_is_stop")) and (serving or {}).get("pad_id") == data_pad
        stops = StopFindings(tc.vocab.rule, data_pad, token_strings(ds.tokenizer_state or {}), accepted,
                             "rows" if packed else "episodes")
        rule_found, stop_notes = stops.rule_problems()
        found += rule_found
        notes += stop_notes
    else:
        skip(("stops", "serving"), "tokenizer unknown")
    ctx = ShardContext(packed, row_len, vocab, pad_id, tokenizer is not None, frozenset(scan.bad_segments))
    meta_sealed = meta is not None and meta_sealed
    remote: list[ShardChecks] | None = None
    with ThreadPoolExecutor(max_workers=max(1, hash_threads)) as pool:
        here = jobs if executor is None else [j for j in jobs if j[3] is None]  # a task hashes its shard's files
        futures = {j[0]: pool.submit(sha256_file, j[1]) for j in here}  # runs beside the checks below
        src_futures = [pool.submit(check_source, rec) for rec in in_sources]
        if executor is None:
            for sh in shards:
                found += check_shard(sh, ctx, tick, stops)
            trained = [None if sh.mask is None else int(np.count_nonzero(sh.mask)) for sh in shards] \
                if meta is not None else []
        else:
            remote = []
            for r in check_shards(executor, shards, ctx, stops, [[j for j in jobs if j[3] == sh.rel] for sh in shards],
                                  meta, meta_sealed, quick):
                remote.append(r)
                found += r.problems
                if stops is not None:
                    stops.absorb(r.cannot_stop)
                tick(r.bytes_read)
            trained = [r.trained for r in remote]
        if meta is not None:  # the reader's counts, with the trained tokens measured here
            found += check_counts(meta, shards, packed=packed, trained=trained)
        if rows:
            refs, ref_notes = check_references([sh for sh in shards if sh.rel not in scan.bad_segments], meta,
                                               row_len, None if executor is None else partial(compare_tokens, executor))
            found += refs
            notes += ref_notes
        results = []
        hashed = {fn: h for r in remote or [] for fn, h in r.sha256.items()}
        for fn, p, rec, shard in jobs:
            results.append((fn, futures[fn].result() if fn in futures else hashed[fn], rec.get("sha256"), shard))
            report.bytes_hashed += p.stat().st_size
            tick(p.stat().st_size)
        if sources:
            report.sources = [f.result() for f in src_futures]
            report.reproducible = reproducible(report.sources)
            tick(source_bytes(meta))
            found += source_problems(report.sources)
            if not report.sources:
                notes.append(_no_sources_note(meta, ds.kind))
                skip(("sources",), "no input files recorded")
    if meta is not None:
        found += checksum_problems(results, meta, shards)
        # the recorded value ranges against the vocabulary, and (not --quick) the data's,
        # measured where no checksum already proves them equal
        proven = proven_shards(meta, shards, results, meta_sealed)
        measured = {sh.rel: r.ranges for sh, r in zip(shards, remote or []) if r.ranges is not None}
        data = None if quick else {sh.rel: measured[sh.rel] if sh.rel in measured else data_ranges(sh)
                                   for sh in shards if sh.rel not in proven}
        found += check_ranges(meta, shards, None if vocab is None else vocab.size, data)
    if not any(sh.mask is not None for sh in shards):
        skip(("mask_values", "mask_rule", "stops"), "no mask.bin")
    if stops is not None:
        report.cannot_stop = stops.cannot_stop
        served, why = serving_findings(root, serving_error, serving, ds.tokenizer_state, tc.vocab.rule,
                                       stops.pad_id, [sh for sh in shards if sh.rel not in scan.bad_segments],
                                       ds.token_dtype, packed, row_len)
        found += served
        if why:
            skip(("serving",), why)
            if why == ABSENT:
                notes.append(f"{SERVING_FILE}: {ABSENT} of sftdata (re-create the dataset to get one)")
    if retokenize_episodes > 0:
        if packed:
            retok = None
            skip(("retokenize", "drift"), "a packed dataset: retokenize its source dataset")
        else:
            retok = retokenize([sh for sh in shards if sh.rel not in scan.bad_segments], ds.tokenizer_state,
                               retokenize_episodes, run=None if executor is None else partial(retokenize_shards, executor))
            found += retok.problems
            report.retokenized = retok.as_dict()
            if retok.skipped:
                skip(("retokenize",), retok.skipped)
            drift = check_drift([sh for sh in shards if sh.rel not in scan.bad_segments], meta, ds.tokenizer_state,
                                retokenize_episodes, rerender=rerender)
            found += drift.problems
            report.drift = drift.as_dict()
            if drift.skipped:
                skip(("drift",), drift.skipped)
    # within a check, the problems keep the order they were found in: top-level file sizes
    # before the shards' sizes, the shards' missing files before the top-level ones
    problems = top_resized + [p for p in scan.problems if p.check != "counts"] + tc.problems + top_missing + found
    extra = {**(SOURCES_CHECK if sources else {}),
             **({**RETOKENIZE_CHECK, **DRIFT_CHECK} if retokenize_episodes > 0 else {})}
    report.problems, report.checks = check_results(ds.kind, problems, skipped, extra or None)
    report.notes = notes
    for split in SPLITS:
        mine = [sh for sh in shards if sh.split == split]
        if mine:
            report.splits[split] = {"rows" if rows else "episodes": sum(sh.num_items for sh in mine),
                                    "tokens": sum(sh.num_tokens for sh in mine), "shards": len(mine)}
    report.bytes_read = done[0]
    report.seconds = time.perf_counter() - t0
    return report


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
