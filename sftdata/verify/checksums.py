"""The checksums of ``verify``: sha256 of every file the metadata records, compared
with the record (hashing runs in threads beside the content checks)."""

from __future__ import annotations

from pathlib import Path

from ..store import METADATA_FILE, RECREATE, Problem, Shard
from ..store.format import recorded_files, shard_record

Job = tuple[str, Path, dict, str | None]  # (file relative to the dataset, path, its record, shard rel or None)


def checksum_jobs(root: Path, meta: dict, shards: list[Shard]) -> tuple[list[Job], list[Problem], list[Problem]]:
    """The files to hash: those whose size matches the record (a size mismatch is
    already a problem: no need to hash). Also the problems of the top-level files (the
    reader checks the shards' files): missing (``files``) and resized (``sizes``)."""
    jobs, missing, resized = [], [], []
    for fn, p, rec, shard in recorded_files(root, meta, shards):
        if shard is not None:
            if p.is_file() and p.stat().st_size == rec.get("bytes", p.stat().st_size):
                jobs.append((fn, p, rec, shard))
        elif not p.is_file():
            missing.append(Problem("files", fn, "", f"{fn} is missing", "restore it, or " + RECREATE))
        elif rec.get("bytes") not in (None, p.stat().st_size):
            resized.append(Problem("sizes", fn, "", f"{fn} is {p.stat().st_size:,} bytes; {METADATA_FILE} "
                                   f"recorded {rec['bytes']:,}: it changed after prepare", RECREATE))
        else:
            jobs.append((fn, p, rec, None))
    return jobs, missing, resized


def checksum_problems(results: list[tuple[str, str, str, str | None]], meta: dict,
                      shards: list[Shard]) -> list[Problem]:
    """One problem per changed file, or one per shard when every file of it changed.
    ``results``: (file, sha256 found, sha256 recorded, shard rel or None)."""
    bad = [r for r in results if r[1] != r[2]]
    out = []
    for sh in shards:
        recorded = list((shard_record(meta, sh.split, sh.name) or {}).get("files") or {})
        mine = [r for r in bad if r[3] == sh.rel]
        if len(recorded) >= 2 and len(mine) == len(recorded):
            out.append(Problem("checksums", sh.rel, "", f"every file of {sh.rel} ({', '.join(recorded)}) differs "
                               f"from the sha256 recorded in {METADATA_FILE}: the shard was replaced, e.g. by a "
                               "shard of another dataset", "restore this shard from this dataset's copy, or "
                               + RECREATE))
            bad = [r for r in bad if r[3] != sh.rel]
    for fn, got, want, _ in bad:
        out.append(Problem("checksums", fn, "", f"sha256 is {got[:16]}..., {METADATA_FILE} recorded "
                           f"{str(want)[:16]}...: the file changed after prepare (a flipped bit, a partial "
                           "copy or an edit)", "restore the file from a good copy, or " + RECREATE))
    return out
