"""``verify``: every check on a dataset, every problem as data (the CLI draws the report).

The reader opens the dataset tolerantly and runs the structural checks
(``store.scan_dataset``); this adds the tokenizer check, the content checks (one read
of every shard), the trained-token counts, the packed references and the checksums
(hashed in threads beside the content checks).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..store import EPISODES_FILE, METADATA_FILE, SPLITS, TOKENIZER_FILE, TOKENS_FILE, scan_dataset, sha256_file
from ..store.structure import check_counts, check_eos, episode_bounds
from .checksums import checksum_jobs, checksum_problems
from .content import check_content
from .description import check_tokenizer
from .packed import check_packed_content
from .references import check_references
from .report import ProgressFn, VerifyReport, check_results


def verify(path: str | Path, *, quick: bool = False, token_dtype=None, tokenizer: str | None = None,
           progress: ProgressFn | None = None, hash_threads: int = 1) -> VerifyReport:
    """Run every check on the dataset at ``path``; never stops at the first problem.

    ``quick`` skips the checksums. ``token_dtype`` and ``tokenizer`` matter only for the
    older flat layout, which records neither. Raises ``DatasetError`` only when ``path``
    holds no dataset at all.
    """
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
        skip(("counts", "checksums"), "no metadata")
    if packed and row_len is None:
        skip(("rows", "segments", "references", "mask_rule", "padding"), "no packing.row_len")
    tc = check_tokenizer(scan, tokenizer)
    notes += [tc.note] if tc.note else []
    if tc.unknown:
        skip(("vocab", "eos", "mask_rule"), "tokenizer unknown")
    if scan.dtype_guessed and meta is None and ds.layout == "flat":
        notes.append("no metadata: tokens read as uint32 (pass --token-dtype uint16 if they are not)")
    notes += [f"{s}/{TOKENS_FILE} has no {EPISODES_FILE}: a token stream, not episodes; not checked"
              for s in scan.token_streams]
    if quick:
        skip(("checksums",), "--quick")
    shards = ds.shards
    jobs, top_missing, top_resized = checksum_jobs(root, meta, shards) if meta is not None and not quick else \
        ([], [], [])
    total = sum(sh.data_bytes for sh in shards) + sum(j[1].stat().st_size for j in jobs)
    done = [0]

    def tick(nbytes: int) -> None:
        done[0] += nbytes
        if progress:
            progress(done[0], total)

    found = []
    report = VerifyReport(str(root), ds.layout, ds.kind, quick)
    pad_id = ((meta or {}).get("packing") or {}).get("pad_token_id")
    with ThreadPoolExecutor(max_workers=max(1, hash_threads)) as pool:
        futures = [(j, pool.submit(sha256_file, j[1])) for j in jobs]  # runs beside the checks below
        for sh in shards:
            if rows:
                found += check_packed_content(sh, tc.vocab, pad_id if isinstance(pad_id, int) else None, row_len,
                                              sh.rel not in scan.bad_segments, tick)
            elif not packed:
                bounds = episode_bounds(sh)
                if tokenizer is not None:  # the reader knew no tokenizer to check the EOS endings with
                    found += check_eos(sh, bounds, tc.vocab.markers)
                found += check_content(sh, bounds, tc.vocab, tick)
        if meta is not None:  # the reader's counts, with the trained tokens measured here
            trained = [None if sh.mask is None else int(np.count_nonzero(sh.mask)) for sh in shards]
            found += check_counts(meta, shards, packed=packed, trained=trained)
        if rows:
            refs, ref_notes = check_references([sh for sh in shards if sh.rel not in scan.bad_segments], meta,
                                               row_len)
            found += refs
            notes += ref_notes
        results = []
        for (fn, p, rec, shard), fut in futures:
            results.append((fn, fut.result(), rec.get("sha256"), shard))
            report.bytes_hashed += p.stat().st_size
            tick(p.stat().st_size)
    found += checksum_problems(results, meta, shards) if meta is not None else []
    if not any(sh.mask is not None for sh in shards):
        skip(("mask_values", "mask_rule"), "no mask.bin")
    # within a check, the problems keep the order they were found in: top-level file sizes
    # before the shards' sizes, the shards' missing files before the top-level ones
    problems = top_resized + [p for p in scan.problems if p.check != "counts"] + tc.problems + top_missing + found
    report.problems, report.checks = check_results(ds.kind, problems, skipped)
    report.notes = notes
    for split in SPLITS:
        mine = [sh for sh in shards if sh.split == split]
        if mine:
            report.splits[split] = {"rows" if rows else "episodes": sum(sh.num_episodes for sh in mine),
                                    "tokens": sum(sh.num_tokens for sh in mine), "shards": len(mine)}
    report.bytes_read = done[0]
    report.seconds = time.perf_counter() - t0
    return report
