"""Verify a dataset on disk: every check, every problem as data (the CLI draws the report).

    >>> report = verify("data/chat_sft")          # all checks, checksums included
    >>> report.ok, [str(p) for p in report.problems]

The checks (``CHECKS``, in this order) and what each catches:

* metadata, tokenizer: the description files are there, readable, of a known version,
  and the tokenizer rebuilds with the ranks hash recorded at prepare time;
* files, sizes, counts: every file present; whole tokens, tokens and mask of equal count,
  ``episodes.idx`` a multiple of 16 bytes, one ``sources.idx`` entry per episode, file
  sizes and episode/token/trained counts equal to what the metadata recorded;
* index, eos: episodes in bounds, sorted, contiguous, non-overlapping; each ends with EOS;
* vocab, mask_values, mask_rule: ids below the vocabulary size, mask values 0/1, and the
  mask equal to the one ``masking.loss_mask`` derives from the tokens (a mask that trains
  on user text is caught whatever produced it);
* checksums: sha256 of every file equals the metadata (skipped by ``quick``).

Each ``Problem`` names the check, the file (relative to the dataset), where (episode id,
byte offset), what is wrong and what to do. ``check_structure(ds)`` runs the cheap checks
on an opened dataset and raises ``DatasetError`` with the first problem: the loader calls
it before it trains. The array-level checks live in ``verify_checks``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import DatasetError, SftDataError, UsageError
from .store import (EPISODES_FILE, FORMAT_NAME, FORMAT_VERSION, IDX_DTYPE, MASK_FILE, METADATA_FILE, SOURCES_FILE,
                    SPLITS, TOKENIZER_FILE, TOKENS_FILE, Dataset, detect_layout, list_shards, open_dataset,
                    read_json, sha256_file, token_dtype_for)
from .tokenizer import MarkerIds, load_tokenizer, tokenizer_from_state
from .verify_checks import (RECREATE, Part, Problem, Vocab, check_content, check_counts, check_eos,
                            check_index, check_shard_list, check_sizes)

CHECKS: dict[str, str] = {
    "metadata": "metadata present, sftdata format, known version",
    "tokenizer": "tokenizer rebuilds with the recorded ranks hash",
    "files": "every file and shard present, none unlisted",
    "sizes": "file sizes agree with each other and with the metadata",
    "counts": "episode, token, trained-token counts equal the metadata",
    "index": "episodes in bounds, sorted, contiguous, non-overlapping",
    "eos": "every episode ends with <|EOS|>",
    "vocab": "token ids below the vocabulary size",
    "mask_values": "mask values are 0 or 1",
    "mask_rule": "the mask is the mask rule's, re-derived from the tokens",
    "checksums": "sha256 of every file equals the metadata",
}
# index problems an older flat layout may have by design (its specification asks only for
# (start, length) records): verify reports them, check_structure lets the loader train
HARMLESS_IN_FLAT = ("unsorted", "gap", "leading_gap", "trailing_tokens")


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


# ------------------------------------------------------------------------- opening
def _read(path: Path, dtype) -> np.ndarray:
    """Read-only map of the whole values in ``path`` (a truncated tail is ignored here:
    the sizes check reports it)."""
    dtype = np.dtype(dtype)
    n = path.stat().st_size // dtype.itemsize
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.empty(0, dtype)


def _open_part(root: Path, split: str, name: str, d: Path, dtype: np.dtype, first_gid: int,
               meta: dict | None, problems: list[Problem]) -> Part:
    """A shard (or a flat split folder) opened tolerantly: what exists is mapped, what is
    missing or malformed is recorded as a problem and left None."""
    rel = d.relative_to(root).as_posix()
    part = Part(split=split, name=name, rel=rel, dir=d, first_gid=first_gid, token_dtype=dtype, meta=meta)
    flat = name == split
    required = (TOKENS_FILE, EPISODES_FILE) if flat else (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SOURCES_FILE)
    listed = tuple((meta or {}).get("files", {}))
    for fn in dict.fromkeys(required + listed):
        if not (d / fn).is_file():
            problems.append(Problem("files", f"{rel}/{fn}", "", f"{rel}/{fn} is missing",
                                    "restore the file from a good copy of the dataset, or " + RECREATE))
    if (d / TOKENS_FILE).is_file():
        part.tokens = _read(d / TOKENS_FILE, dtype)
    if (d / EPISODES_FILE).is_file():
        part.episodes = _read(d / EPISODES_FILE, IDX_DTYPE).reshape(-1, 2)
    if (d / MASK_FILE).is_file():
        n = 0 if part.tokens is None else part.tokens.shape[0]
        size = (d / MASK_FILE).stat().st_size
        part.mask = _read(d / MASK_FILE, "<f4" if size == 4 * n and n else np.uint8)
    if (d / SOURCES_FILE).is_file():
        part.sources = _read(d / SOURCES_FILE, IDX_DTYPE)
    return part


def _parts_from_dataset(ds: Dataset) -> list[Part]:
    """Parts over an already opened dataset (store did the opening and its own checks)."""
    parts = []
    for split, sp in ds.splits.items():
        metas = _shard_metas(ds.metadata, split)
        for i, sh in enumerate(sp.shards):
            first = int(sp.episode_offsets[i])
            parts.append(Part(split=split, name=sh.name, rel=sh.path.relative_to(ds.root).as_posix(),
                              dir=sh.path, first_gid=first, token_dtype=ds.token_dtype,
                              meta=metas.get(sh.name), tokens=sh.tokens, mask=sh.mask,
                              episodes=sh.episodes, sources=sh.sources))
    return parts


def _shard_metas(meta: dict | None, split: str) -> dict:
    shards = ((meta or {}).get("splits", {}).get(split) or {}).get("shards") or []
    return {s.get("name"): s for s in shards if isinstance(s, dict)}


def _vocab_from_state(state: dict | None) -> Vocab | None:
    try:
        return Vocab(MarkerIds.from_special_tokens(state["special_tokens"]), int(state["vocab_size"]))
    except (SftDataError, KeyError, TypeError, ValueError):
        return None


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
        order = list(CHECKS)
        rep.problems = sorted(self.problems, key=lambda p: order.index(p.check))
        for name, desc in CHECKS.items():
            n = sum(p.check == name for p in rep.problems)
            status = "failed" if n else ("skipped" if name in self.skipped else "ok")
            rep.checks.append(CheckResult(name, desc, status, n, self.skipped.get(name, "")))
        rep.seconds = time.perf_counter() - t0
        return rep


def _check_metadata(run: _Run, layout: str) -> dict | None:
    root, meta = run.root, None
    path = root / METADATA_FILE
    if not path.is_file():
        if layout == "sharded":
            run.problems.append(Problem("metadata", METADATA_FILE, "", f"{METADATA_FILE} is missing: the "
                                        "dataset was never completed (prepare writes it last) or it was deleted",
                                        "re-create the dataset; without it counts and checksums cannot be checked"))
        else:
            run.report.notes.append(f"older flat layout without {METADATA_FILE}: counts, file sizes and "
                                    "checksums cannot be checked against a record of what was written")
        run.skip("counts", "no metadata")
        run.skip("checksums", "no metadata")
        return None
    try:
        meta = read_json(path)
    except DatasetError as e:
        run.problems.append(Problem("metadata", METADATA_FILE, "", str(e), RECREATE))
        return None
    if meta.get("format") != FORMAT_NAME:
        run.problems.append(Problem("metadata", METADATA_FILE, "", f"format is {meta.get('format')!r}, "
                                    f"not {FORMAT_NAME!r}", "this folder was not written by sftdata; " + RECREATE))
    elif meta.get("format_version") != FORMAT_VERSION:
        run.problems.append(Problem("metadata", METADATA_FILE, "", f"format_version "
                                    f"{meta.get('format_version')!r} is not known (this sftdata reads "
                                    f"{FORMAT_VERSION})", "upgrade sftdata, or re-create the dataset with this one"))
    return meta


def _check_tokenizer(run: _Run, tokenizer: str | None) -> tuple[dict | None, Vocab | None]:
    path = run.root / TOKENIZER_FILE
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        run.report.notes.append(f"token ids, EOS endings and the mask rule checked with --tokenizer {tokenizer}")
        return None, Vocab(tok.ids, tok.vocab_size)
    if not path.is_file():
        if run.report.layout == "sharded":
            run.problems.append(Problem("tokenizer", TOKENIZER_FILE, "", f"{TOKENIZER_FILE} is missing: the "
                                        "tokenizer the ids were made with is unknown", RECREATE))
        else:
            run.report.notes.append(f"no {TOKENIZER_FILE}: token ids, EOS endings and the loss mask cannot be "
                                    "checked (pass --tokenizer NAME to check them with a known tokenizer)")
        for c in ("vocab", "eos", "mask_rule"):
            run.skip(c, "tokenizer unknown")
        return None, None
    try:
        state = read_json(path)
    except DatasetError as e:
        run.problems.append(Problem("tokenizer", TOKENIZER_FILE, "", str(e), RECREATE))
        return None, None
    try:
        tok = tokenizer_from_state(state, TOKENIZER_FILE)
        return state, Vocab(tok.ids, tok.vocab_size)
    except SftDataError as e:
        run.problems.append(Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                                    "use the encoding or ranks file the dataset was prepared with"))
        return state, _vocab_from_state(state)  # the recorded ids still allow the other checks


def _token_dtype(run: _Run, meta: dict | None, state: dict | None, token_dtype) -> np.dtype:
    if meta is not None and "token_dtype" in meta:
        try:
            dt = np.dtype(meta["token_dtype"]).newbyteorder("<")
        except TypeError:
            run.problems.append(Problem("metadata", METADATA_FILE, "", f"token_dtype {meta['token_dtype']!r} "
                                        "is not a numpy dtype", RECREATE))
            return np.dtype("<u4")
        vocab = (state or {}).get("vocab_size")
        if isinstance(vocab, int) and dt.itemsize < token_dtype_for(vocab).itemsize:
            run.problems.append(Problem("metadata", METADATA_FILE, "", f"token_dtype {dt.name} cannot hold the "
                                        f"{vocab:,} ids of the tokenizer", RECREATE))
        return dt
    if token_dtype is not None:
        return np.dtype(token_dtype).newbyteorder("<")
    if isinstance((state or {}).get("vocab_size"), int):  # metadata lost: the tokenizer still says
        return token_dtype_for(state["vocab_size"])
    if meta is None and run.report.layout == "flat":
        run.report.notes.append("no metadata: tokens read as uint32 (pass --token-dtype uint16 if they are not)")
    return np.dtype("<u4")


def _discover(run: _Run, meta: dict | None, dtype: np.dtype) -> list[Part]:
    root, parts = run.root, []
    on_disk: dict[str, list[str]] = {}
    for split in SPLITS:
        if run.report.layout == "flat":
            d = root / split
            if (d / TOKENS_FILE).is_file() and not (d / EPISODES_FILE).is_file():
                run.report.notes.append(f"{split}/{TOKENS_FILE} has no {EPISODES_FILE}: a token stream, not "
                                        "episodes; not checked")
            elif (d / TOKENS_FILE).is_file():
                parts.append(_open_part(root, split, split, d, dtype, 0, None, run.problems))
            continue
        metas = _shard_metas(meta, split)
        first = 0
        for d in list_shards(root, split):
            on_disk.setdefault(split, []).append(d.name)
            part = _open_part(root, split, d.name, d, dtype, first, metas.get(d.name), run.problems)
            first += part.num_episodes
            parts.append(part)
    if meta is not None and run.report.layout == "sharded":
        run.problems += check_shard_list(meta, on_disk)
    return parts


def _hash_jobs(run: _Run, meta: dict, parts: list[Part]) -> list[tuple[str, Path, dict, str | None]]:
    """(relative file, path, recorded {bytes, sha256}, shard rel) of every file whose size
    matches the record (a size mismatch is already a sizes problem: no need to hash)."""
    jobs = []
    for fn, rec in (meta.get("files") or {}).items():
        p = run.root / fn
        if not p.is_file():
            run.problems.append(Problem("files", fn, "", f"{fn} is missing", "restore it, or " + RECREATE))
        elif rec.get("bytes") not in (None, p.stat().st_size):
            run.problems.append(Problem("sizes", fn, "", f"{fn} is {p.stat().st_size:,} bytes; {METADATA_FILE} "
                                        f"recorded {rec['bytes']:,}: it changed after prepare", RECREATE))
        else:
            jobs.append((fn, p, rec, None))
    for part in parts:
        for fn, rec in ((part.meta or {}).get("files") or {}).items():
            p = part.dir / fn
            if p.is_file() and p.stat().st_size == rec.get("bytes", p.stat().st_size):
                jobs.append((f"{part.rel}/{fn}", p, rec, part.rel))
    return jobs


def _checksum_problems(results: list[tuple[str, str, str, str | None]], parts: list[Part]) -> list[Problem]:
    """One problem per changed file, or one per shard when every file of it changed."""
    bad = [r for r in results if r[1] != r[2]]
    out = []
    by_shard = {p.rel: p for p in parts}
    for rel, part in by_shard.items():
        recorded = list((part.meta or {}).get("files") or {})
        mine = [r for r in bad if r[3] == rel]
        if len(recorded) >= 2 and len(mine) == len(recorded):
            out.append(Problem("checksums", rel, "", f"every file of {rel} ({', '.join(recorded)}) differs from "
                               f"the sha256 recorded in {METADATA_FILE}: the shard was replaced, e.g. by a "
                               "shard of another dataset", "restore this shard from this dataset's copy, or "
                               + RECREATE))
            bad = [r for r in bad if r[3] != rel]
    for fn, got, want, _ in bad:
        out.append(Problem("checksums", fn, "", f"sha256 is {got[:16]}..., {METADATA_FILE} recorded "
                           f"{str(want)[:16]}...: the file changed after prepare (a flipped bit, a partial "
                           "copy or an edit)", "restore the file from a good copy, or " + RECREATE))
    return out


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
    meta = _check_metadata(run, layout)
    run.report.kind = (meta or {}).get("kind", "episodes")
    state, vocab = _check_tokenizer(run, tokenizer)
    dtype = _token_dtype(run, meta, state, token_dtype)
    parts = _discover(run, meta, dtype)
    if quick:
        run.skip("checksums", "--quick")
    jobs = _hash_jobs(run, meta, parts) if meta is not None and not quick else []
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
            run.problems += check_index(part)
            if vocab is not None:
                run.problems += check_eos(part, vocab)
            run.problems += check_content(part, vocab, tick)
        if meta is not None:
            run.problems += check_counts(meta, parts)
        results = []
        for (fn, p, rec, shard), fut in futures:
            results.append((fn, fut.result(), rec.get("sha256"), shard))
            run.report.bytes_hashed += p.stat().st_size
            tick(p.stat().st_size)
    run.problems += _checksum_problems(results, parts)
    if not any(p.mask is not None for p in parts):
        for c in ("mask_values", "mask_rule"):
            run.skip(c, "no mask.bin")
    run.report.notes += [n for p in parts for n in p.notes]
    for split in SPLITS:
        mine = [p for p in parts if p.split == split]
        if mine:
            run.report.splits[split] = {"episodes": sum(p.num_episodes for p in mine),
                                        "tokens": sum(p.num_tokens for p in mine), "shards": len(mine)}
    run.report.bytes_read = done[0]
    return run.finish(t0)


# ------------------------------------------------------------------------- structure
def structure_problems(ds: Dataset) -> list[Problem]:
    """The cheap checks (metadata, files, sizes, counts, index, EOS endings) on an opened
    dataset: no checksums, no pass over the token data beyond one token per episode.
    For the older flat layout, unsorted episodes and tokens outside any episode pass."""
    problems: list[Problem] = []
    parts = _parts_from_dataset(ds)
    if ds.metadata is not None and ds.layout == "sharded":
        on_disk: dict[str, list[str]] = {}
        for part in parts:
            on_disk.setdefault(part.split, []).append(part.name)
        problems += check_shard_list(ds.metadata, on_disk)
    for part in parts:
        for fn in (part.meta or {}).get("files") or {}:
            if not (part.dir / fn).is_file():
                problems.append(Problem("files", f"{part.rel}/{fn}", "", f"{part.rel}/{fn} is missing",
                                        "restore the file, or " + RECREATE))
        problems += check_sizes(part)
        problems += check_index(part)
    vocab = _vocab_from_state(ds.tokenizer_state)
    if vocab is not None:
        for part in parts:
            problems += check_eos(part, vocab)
    if ds.metadata is not None:
        problems += check_counts(ds.metadata, parts, trained=False)
    if ds.layout == "flat":  # older layouts: refuse only what breaks training
        problems = [p for p in problems if p.code not in HARMLESS_IN_FLAT]
    order = list(CHECKS)
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
