"""Where the rejected records of a run go, and naming the path of a failed write.

A run that keeps at least one record writes ``rejects.jsonl`` inside the dataset. A run
that keeps none creates no dataset, so its rejects are kept beside the output folder
(``keep_rejects``), never over a file sftdata did not write. Either is bounded: a
reject's message is cut at ``MAX_MESSAGE_CHARS``, the file at ``MAX_STORED_BYTES`` (the
counts stay whole), each saying so (``reject_line``, ``RejectsFile``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import orjson

from ..errors import NoUsableRecordsError
from ..util.oserrors import naming

REJECT_KEYS = ("record", "source", "where", "reason", "message")  # one line of rejects.jsonl
MAX_MESSAGE_CHARS = 1_000  # a reject's message is cut past this (a role or key of a megabyte echoed in it)
MAX_STORED_BYTES = 16 << 20  # rejects.jsonl lists rejects up to this size (~100,000 of them); past it, counted only
CUT_REASON = "rejects_cut"  # the last line when rejects were left out of the file
SEAL_REASON = "sftdata_seal"  # the last line of DIR.rejects.jsonl kept beside an output: the sha256 of the rest
NOT_A_RECORD = 2**63  # the "record" of those lines: after every record, when lines are merged in record order


def reject_line(record: int, where: str, reason: str, message: str) -> bytes:
    """One line of rejects.jsonl (without its newline): the record number, its source and
    place (``file:line N``), the reason code and the message, cut to
    ``MAX_MESSAGE_CHARS`` saying how much was left out."""
    if len(message) > MAX_MESSAGE_CHARS:
        message = f"{message[:MAX_MESSAGE_CHARS]}... (cut: {len(message) - MAX_MESSAGE_CHARS:,} more characters)"
    return orjson.dumps(dict(zip(REJECT_KEYS, (record, where.rsplit(":", 1)[0], where, reason, message))))


def line_record(line: bytes) -> int:
    """The record number of a line of rejects.jsonl (``NOT_A_RECORD`` for a closing line)."""
    record = orjson.loads(line)["record"]
    return record if isinstance(record, int) else NOT_A_RECORD


class RejectsFile:
    """``rejects.jsonl`` as a run writes it: lines up to ``MAX_STORED_BYTES``, then only
    counted (the metadata counts every reject by reason), and ``close`` adds one line
    saying how many were left out. A gzip of short bad lines would otherwise write a
    file a hundred times its input."""

    def __init__(self, f, limit: int | None = None):
        self.f, self.limit = f, MAX_STORED_BYTES if limit is None else limit
        self.stored = 0
        self.left_out = 0

    def write(self, data: bytes) -> None:
        """Write whole lines (``data`` ends with a newline) while they fit."""
        if self.stored + len(data) <= self.limit and not self.left_out:
            self.f.write(data)
            self.stored += len(data)
            return
        for line in data.splitlines(keepends=True):
            if self.stored + len(line) <= self.limit and not self.left_out:
                self.f.write(line)
                self.stored += len(line)
            else:
                self.left_out += 1

    def close(self) -> None:
        """The closing line when rejects were left out (nothing otherwise)."""
        if self.left_out:
            self.f.write(_note(CUT_REASON, f"{self.left_out:,} more rejected records are not listed: rejects.jsonl "
                                           f"lists {self.limit:,} bytes of rejects at most; "
                                           "dataset_metadata.json counts every one by reason (counts.rejected)")
                         + b"\n")

    def flush(self) -> None:
        self.f.flush()


def _note(reason: str, message: str) -> bytes:
    return orjson.dumps(dict(zip(REJECT_KEYS, (None, None, None, reason, message))))


def writing(path: Path, target: str | Path):
    """An OSError while writing (a full disk: ``write`` errors carry no file name) names
    the path being written and the output folder it is for."""
    return naming(path, f"while preparing {target}")


def seal(path: Path) -> None:
    """Append the line that proves ``path`` (a rejects file this run wrote) is sftdata's:
    the sha256 of every byte before it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    with open(path, "ab") as f:
        f.write(_note(SEAL_REASON, h.hexdigest()) + b"\n")


def is_rejects_file(path: Path) -> bool:
    """True when ``path`` is a rejects file sftdata kept beside an output, unchanged since:
    a regular file whose last line records the sha256 of every byte before it
    (``seal``). A file whose lines merely look like rejects is not one."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        size = path.stat().st_size
        if size > MAX_STORED_BYTES + (1 << 20):
            return False
        data = path.read_bytes()
        body, _, last = data[:-1].rpartition(b"\n")
        body = body + b"\n" if body else b""
        obj = orjson.loads(last)
    except (OSError, orjson.JSONDecodeError):
        return False
    return (data.endswith(b"\n") and isinstance(obj, dict) and tuple(obj) == REJECT_KEYS
            and obj["reason"] == SEAL_REASON and obj["message"] == hashlib.sha256(body).hexdigest())


def lists_every_reject(path: Path) -> bool:
    """False when the rejects file at ``path`` ends with the note that its size bound left
    rejects out (its last lines: the cut note, then a seal where it is kept beside an output)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            tail = f.read().splitlines()[-2:]
    except OSError:
        return True
    return not any(orjson.loads(line).get("reason") == CUT_REASON for line in tail if line.startswith(b"{"))


def keep_rejects(src: Path, output_dir: str | Path) -> Path:
    """Put the rejects of a run that kept no record beside the output folder (which is not
    created): ``DIR.rejects.jsonl``, or ``DIR.rejects-2.jsonl`` (-3, ...) when that name
    holds anything sftdata did not write there. Its last line seals it (``seal``): a file
    is never overwritten unless it is such a sealed rejects file, unchanged; a new name is
    claimed with a hard link, which fails rather than replace a file that appeared meanwhile."""
    out = Path(output_dir)
    name = out.name or out.resolve().name
    with writing(src, output_dir):
        seal(src)
    for k in range(1, 1000):
        dest = out.parent / (f"{name}.rejects.jsonl" if k == 1 else f"{name}.rejects-{k}.jsonl")
        with writing(dest, output_dir):
            if dest.is_symlink() or dest.exists():
                if is_rejects_file(dest):  # an earlier run's: replaced
                    os.replace(src, dest)
                    return dest
                continue
            try:
                os.link(src, dest)
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links
                os.replace(src, dest)
            return dest
    raise NoUsableRecordsError(f"every record was rejected, and {out.parent} already holds 999 files named "
                               f"{name}.rejects*.jsonl that sftdata did not write; remove some of them")
