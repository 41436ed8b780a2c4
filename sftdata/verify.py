"""Verify a dataset on disk: every check, every problem as data (the CLI draws the report).

    >>> report = verify("data/chat_sft")          # all checks, checksums included
    >>> report.ok, [str(p) for p in report.problems]

The checks (``CHECKS``; ``PACKED_CHECKS`` for packed datasets) and what each catches:

* metadata, tokenizer: the description files are there, readable, of a known version,
  and the tokenizer rebuilds with the ranks hash recorded at prepare time;
* files, sizes, counts: every file present; whole tokens, tokens and mask of equal count,
  ``episodes.idx`` a multiple of 16 bytes, one ``sources.idx`` entry per episode, file
  sizes and episode/token/trained counts equal to what the metadata recorded;
* index, eos: episodes in bounds, sorted, contiguous, non-overlapping; each ends with EOS;
* vocab, mask_values, mask_rule: ids below the vocabulary size, mask values 0/1, and the
  mask equal to the one ``masking.loss_mask`` derives from the tokens (a mask that trains
  on user text is caught whatever produced it);
* packed: rows, segments, padding, references (``verify_packed``) instead of index/eos;
* checksums: sha256 of every file equals the metadata (skipped by ``quick``).

Each ``Problem`` names the check, the file (relative to the dataset), where (episode or
row id, byte offset), what is wrong and what to do. ``check_structure(ds)`` runs the
cheap checks on an opened dataset and raises ``DatasetError`` with the first problem:
the loader calls it before it trains. Opening and file checks live in ``verify_files``,
array checks in ``verify_checks`` and ``verify_packed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import DatasetError, UsageError
from .store import METADATA_FILE, SPLITS, TOKENIZER_FILE, Dataset, detect_layout, open_dataset, sha256_file
from .verify_checks import RECREATE, Problem, check_counts, check_eos, check_index, check_shard_list, check_sizes
from .verify_content import check_content
from .verify_files import (
    check_metadata,
    check_tokenizer,
    checksum_problems,
    discover,
    hash_jobs,
    parts_from_dataset,
    pick_token_dtype,
    vocab_from_state,
)
from .verify_packed import check_packed_content, check_references, check_rows, check_segments

_COMMON_HEAD = {
    "metadata": "metadata present, sftdata format, known version",
    "tokenizer": "tokenizer rebuilds with the recorded ranks hash",
    "files": "every file and shard present, none unlisted",
    "sizes": "file sizes agree with each other and with the metadata",
}
_COMMON_TAIL = {
    "vocab": "token ids below the vocabulary size",
    "mask_values": "mask values are 0 or 1",
}
# ordered so that the most specific problem comes first (counts are often a consequence)
CHECKS: dict[str, str] = {
    **_COMMON_HEAD,
    "index": "episodes in bounds, sorted, contiguous, non-overlapping",
    "eos": "every episode ends with <|EOS|>",
    "counts": "episode, token, trained-token counts equal the metadata",
    **_COMMON_TAIL,
    "mask_rule": "the mask is the mask rule's, re-derived from the tokens",
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
    "checksums": "sha256 of every file equals the metadata",
}
# index problems an older flat layout may have by design (its specification asks only for
# (start, length) records): verify reports them, check_structure lets the loader train
HARMLESS_IN_FLAT = ("unsorted", "gap", "leading_gap", "trailing_tokens")


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

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "layout": self.layout, "kind": self.kind, "quick": self.quick,
                "checks": [asdict(c) for c in self.checks], "problems": [p.as_dict() for p in self.problems],
                "notes": self.notes, "splits": self.splits, "bytes_read": self.bytes_read,
                "bytes_hashed": self.bytes_hashed, "seconds": round(self.seconds, 3)}


ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total)


# ------------------------------------------------------------------------- verify
class _Run:
    """One verification: the problems found and the checks skipped, check by check."""

    def __init__(self, root: Path, quick: bool):
        self.root = root
        self.problems: list[Problem] = []
        self.skipped: dict[str, str] = {}
        self.report = VerifyReport(str(root), None, None, quick)

    def skip(self, check: str, why: str) -> None:
        self.skipped.setdefault(check, why)

    def finish(self, t0: float) -> VerifyReport:
        rep = self.report
        checks = checks_for(rep.kind)
        order = list(checks)
        rep.problems = sorted(self.problems, key=lambda p: order.index(p.check))
        for name, desc in checks.items():
            n = sum(p.check == name for p in rep.problems)
            status = "failed" if n else ("skipped" if name in self.skipped else "ok")
            rep.checks.append(CheckResult(name, desc, status, n, self.skipped.get(name, "")))
        rep.seconds = time.perf_counter() - t0
        return rep


def verify(path: str | Path, *, quick: bool = False, token_dtype=None, tokenizer: str | None = None,
           progress: ProgressFn | None = None, hash_threads: int = 1) -> VerifyReport:
    """Run every check on the dataset at ``path``; never stops at the first problem.

    ``quick`` skips the checksums. ``token_dtype`` and ``tokenizer`` matter only for the
    older flat layout, which records neither. Raises ``DatasetError`` only when ``path``
    holds no dataset at all.
    """
    t0 = time.perf_counter()
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root} does not exist")
    layout = detect_layout(root)
    if layout is None:
        raise DatasetError(f"{root} holds no dataset: expected train/shard_*/ folders or train/tokens.bin")
    if tokenizer is not None and (root / TOKENIZER_FILE).is_file():
        raise UsageError(f"--tokenizer is for older flat layouts; {root} records its tokenizer in {TOKENIZER_FILE}")
    if token_dtype is not None and (root / METADATA_FILE).is_file():
        raise UsageError(f"--token-dtype is for older flat layouts; {root} records its token dtype in {METADATA_FILE}")
    run = _Run(root, quick)
    run.report.layout = layout
    meta = check_metadata(run, layout)
    run.report.kind = (meta or {}).get("kind", "episodes")
    packing = _packing(run, meta)
    state, vocab = check_tokenizer(run, tokenizer)
    dtype = pick_token_dtype(run, meta, state, token_dtype)
    parts = discover(run, meta, dtype)
    if quick:
        run.skip("checksums", "--quick")
    jobs = hash_jobs(run, meta, parts) if meta is not None and not quick else []
    total = sum(p.data_bytes for p in parts) + sum(j[1].stat().st_size for j in jobs)
    done = [0]

    def tick(nbytes: int) -> None:
        done[0] += nbytes
        if progress:
            progress(done[0], total)

    with ThreadPoolExecutor(max_workers=max(1, hash_threads)) as pool:
        futures = [(j, pool.submit(sha256_file, j[1])) for j in jobs]  # runs beside the checks below
        for part in parts:
            run.problems += check_sizes(part)
            if packing is not None:
                row_len, pad_id = packing
                run.problems += check_rows(part, row_len)
                run.problems += check_segments(part, row_len)
                run.problems += check_packed_content(part, vocab, pad_id, row_len, tick)
            elif run.report.kind != "packed":
                run.problems += check_index(part)
                if vocab is not None:
                    run.problems += check_eos(part, vocab)
                run.problems += check_content(part, vocab, tick)
        if meta is not None:
            run.problems += check_counts(meta, parts, packed=run.report.kind == "packed")
        if packing is not None:
            run.problems += check_references(parts, meta, root, run.report.notes)
        results = []
        for (fn, p, rec, shard), fut in futures:
            results.append((fn, fut.result(), rec.get("sha256"), shard))
            run.report.bytes_hashed += p.stat().st_size
            tick(p.stat().st_size)
    run.problems += checksum_problems(results, parts)
    if not any(p.mask is not None for p in parts):
        for c in ("mask_values", "mask_rule"):
            run.skip(c, "no mask.bin")
    run.report.notes += [n for p in parts for n in p.notes]
    for split in SPLITS:
        mine = [p for p in parts if p.split == split]
        if mine:
            run.report.splits[split] = {"rows" if packing else "episodes": sum(p.num_episodes for p in mine),
                                        "tokens": sum(p.num_tokens for p in mine), "shards": len(mine)}
    run.report.bytes_read = done[0]
    return run.finish(t0)


def _packing(run: _Run, meta: dict | None) -> tuple[int, int | None] | None:
    """(row_len, pad id) of a packed dataset, or None (not packed, or unusable metadata:
    then the packed checks are skipped and a metadata problem says why)."""
    if run.report.kind != "packed":
        return None
    packing = (meta or {}).get("packing") or {}
    row_len, pad_id = packing.get("row_len"), packing.get("pad_token_id")
    if not isinstance(row_len, int) or row_len < 2:
        run.problems.append(Problem("metadata", METADATA_FILE, "packing.row_len", f"a packed dataset needs "
                                    f"packing.row_len, an integer >= 2; got {row_len!r}",
                                    "re-create it with `sftdata pack`"))
        for c in ("rows", "segments", "references", "mask_rule", "padding"):
            run.skip(c, "no packing.row_len")
        return None
    return row_len, pad_id if isinstance(pad_id, int) else None


# ------------------------------------------------------------------------- structure
def structure_problems(ds: Dataset) -> list[Problem]:
    """The cheap checks (metadata, files, sizes, counts, index and EOS endings; packed:
    rows and segments) on an opened dataset: no checksums, no pass over the token data
    beyond one token per episode. For the older flat layout, unsorted episodes and tokens
    outside any episode pass."""
    problems: list[Problem] = []
    parts = parts_from_dataset(ds)
    if ds.metadata is not None and ds.layout == "sharded":
        on_disk: dict[str, list[str]] = {}
        for part in parts:
            on_disk.setdefault(part.split, []).append(part.name)
        problems += check_shard_list(ds.metadata, on_disk)
    row_len = ((ds.metadata or {}).get("packing") or {}).get("row_len") if ds.kind == "packed" else None
    vocab = vocab_from_state(ds.tokenizer_state)
    for part in parts:
        for fn in (part.meta or {}).get("files") or {}:
            if not (part.dir / fn).is_file():
                problems.append(Problem("files", f"{part.rel}/{fn}", "", f"{part.rel}/{fn} is missing",
                                        "restore the file, or " + RECREATE))
        problems += check_sizes(part)
        if ds.kind == "packed":
            problems += check_rows(part, row_len) + check_segments(part, row_len)  # store checked row_len
            continue
        problems += check_index(part)
        if vocab is not None:
            problems += check_eos(part, vocab)
    if ds.metadata is not None:
        problems += check_counts(ds.metadata, parts, trained=False, packed=ds.kind == "packed")
    if ds.layout == "flat":  # older layouts: refuse only what breaks training
        problems = [p for p in problems if p.code not in HARMLESS_IN_FLAT]
    order = list(checks_for(ds.kind))
    return sorted(problems, key=lambda p: order.index(p.check))


def check_structure(ds: Dataset | str | Path) -> None:
    """Refuse a structurally broken dataset: raise ``DatasetError`` with the first problem
    (and how many more there are). Cheap: index-sized work, no checksums."""
    if not isinstance(ds, Dataset):
        ds = open_dataset(ds)
    problems = structure_problems(ds)
    if problems:
        more = f" ({len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise DatasetError(f"{ds.root}: {problems[0]}{more}. Run `sftdata verify {ds.root}` for the full report")
