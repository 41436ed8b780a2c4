"""``verify --sources``: are the input files the metadata records (``sources``: path,
bytes, sha256 as prepare read them) still there and unchanged? Only then can the dataset
be reproduced from them. Without ``--sources`` no input file is read. An input that
records no whole-file sha256 (a large file read in ranges: ``sources.records_sha256``)
is compared by its block hash (``block_sha256``, ``util.hashing.combine_blocks``).

A relative path is resolved against the current folder, as prepare was given it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..storage import METADATA_FILE
from ..store.format import Problem
from ..util.hashing import HASH_BLOCK_BYTES, file_hashes, sha256_file

MATCHES, MISSING, CHANGED, UNREADABLE = "matches", "missing", "changed", "unreadable"


@dataclass
class SourceCheck:
    """One recorded input file and what was found at its path."""

    path: str  # as recorded
    resolved: str  # the path read (absolute)
    status: str  # "matches" | "missing" | "changed" | "unreadable"
    bytes: int | None  # recorded
    sha256: str | None  # recorded
    found_bytes: int | None = None
    found_sha256: str | None = None  # None when not hashed (missing, or another size)
    reason: str = ""  # for a status other than "matches": what was found

    def as_dict(self) -> dict:
        return asdict(self)


def recorded_sources(meta: dict | None) -> list[dict]:
    """The metadata's ``sources`` entries (objects only)."""
    sources = (meta or {}).get("sources")
    return [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []


def check_source(rec: dict, hash_file: Callable[[Path], str] = sha256_file) -> SourceCheck:
    """Compare one recorded input file with the file at its path (hashed only when its
    size is the recorded one)."""
    path = str(rec.get("path"))
    p = Path(path).absolute()
    want_bytes, want_sha = rec.get("bytes"), rec.get("sha256")
    out = SourceCheck(path, str(p), MISSING, want_bytes if isinstance(want_bytes, int) else None,
                      want_sha if isinstance(want_sha, str) else None)
    if not p.is_file():
        out.reason = "is not a file" if p.exists() else "does not exist"
        return out
    try:
        out.found_bytes = p.stat().st_size
        if out.bytes is not None and out.found_bytes != out.bytes:
            out.status, out.reason = CHANGED, f"is {out.found_bytes:,} bytes; {METADATA_FILE} recorded {out.bytes:,}"
            return out
        block = rec.get("block_sha256")
        if out.sha256 is None and isinstance(block, dict) and block.get("block_bytes") == HASH_BLOCK_BYTES \
                and isinstance(block.get("sha256"), str):
            return _by_blocks(out, block["sha256"], file_hashes(p, whole=False)[1])
        out.found_sha256 = hash_file(p)
    except OSError as e:
        out.status, out.reason = UNREADABLE, f"cannot be read ({e.strerror or e})"
        return out
    if out.sha256 is None or out.found_sha256 != out.sha256:
        out.status = CHANGED
        out.reason = (f"has sha256 {out.found_sha256[:16]}..., {METADATA_FILE} recorded "
                      f"{(out.sha256 or 'none')[:16]}...")
    else:
        out.status = MATCHES
    return out


def _by_blocks(out: SourceCheck, recorded: str, found: str) -> SourceCheck:
    if found == recorded:
        out.status = MATCHES
    else:
        out.status = CHANGED
        out.reason = f"has block hash {found[:16]}..., {METADATA_FILE} recorded {recorded[:16]}... (block_sha256)"
    return out


def source_bytes(meta: dict | None) -> int:
    """Bytes ``--sources`` will hash at most (for progress)."""
    return sum(s["bytes"] for s in recorded_sources(meta) if isinstance(s.get("bytes"), int))


def reproducible(checks: list[SourceCheck]) -> bool | None:
    """True when every recorded input file matches; None when none is recorded."""
    return all(c.status == MATCHES for c in checks) if checks else None


def source_problems(checks: list[SourceCheck]) -> list[Problem]:
    """One ``sources`` problem per input file that does not match."""
    out = []
    for c in checks:
        if c.status == MATCHES:
            continue
        where = "" if c.resolved == c.path else f"read as {c.resolved}"
        if c.status == MISSING:
            out.append(Problem("sources", c.path, where, f"input file {c.path} {c.reason}: the dataset cannot be "
                               "reproduced from its inputs", "run verify from the folder prepare ran in (a relative "
                               "path is resolved against the current folder), or restore the file"))
        elif c.status == CHANGED:
            out.append(Problem("sources", c.path, where, f"input file {c.path} {c.reason}: it changed since prepare "
                               "read it, so the dataset cannot be reproduced from it", "restore the input as it was, "
                               "or re-create the dataset from the file as it is now"))
        else:
            out.append(Problem("sources", c.path, where, f"input file {c.path} {c.reason}",
                               "give this user read access to it, then run verify --sources again"))
    return out
