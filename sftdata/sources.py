"""Reading input files as a stream of records, keeping where each came from.

* JSONL (one JSON value per line), streamed line by line: memory does not grow with
  the file. Blank lines are skipped.
* JSON arrays (a file whose first non-blank byte is ``[``), read whole.
* Either compressed with gzip (``.gz``), either starting with a UTF-8 byte order mark
  (skipped).

Record numbers are global and 0-based: for JSONL the record number of a line is its
0-based line index plus the record offset of its file; for arrays, the item index plus
the offset. With several inputs, file ``k`` starts at the sum of the earlier files'
record counts. ``where`` strings name the file and the 1-based line (or the 0-based
array item) for error messages.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import InputError
from .exact_json import InexactJSON, loads


@dataclass
class SourceInfo:
    path: str
    sha256: str
    bytes: int
    container: str  # "jsonl" | "json"
    compressed: bool
    first_record: int = 0
    records: int = 0  # record numbers used (lines incl. blank ones, or array items)

    def as_dict(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "container": self.container,
                "compressed": self.compressed, "first_record": self.first_record, "records": self.records}


@dataclass
class RawRecord:
    record: int  # global 0-based record number
    where: str  # "file:line N" / "file:item N"
    raw: Any  # bytes of one JSONL line, or an already decoded array item


def _open_binary(path: Path):
    """(stream of the file's bytes, gunzipped if need be, past a UTF-8 byte order mark;
    the raw file; compressed?)."""
    f = open(path, "rb")
    magic = f.read(2)
    f.seek(0)
    stream, compressed = (gzip.GzipFile(fileobj=f, mode="rb"), True) if magic == b"\x1f\x8b" else (f, False)
    try:
        if stream.peek(3)[:3] == codecs.BOM_UTF8:  # Windows tools write one; it is not JSON
            stream.read(3)
    except (OSError, EOFError):
        pass  # a damaged .gz: reading it says so with the file name
    return stream, f, compressed


def inspect_source(path: str | Path) -> SourceInfo:
    """Hash the file and sniff its container, failing early with a clear message."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"input file {p} does not exist")
    if not p.is_file():
        raise InputError(f"input {p} is not a file")
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            while True:
                b = f.read(8 << 20)
                if not b:
                    break
                h.update(b)
        stream, raw, compressed = _open_binary(p)
        with raw:
            try:
                head = stream.read(4096)
            except (OSError, EOFError) as e:
                raise InputError(f"{p}: cannot decompress ({e}); is it a complete .gz file?") from None
    except PermissionError:
        raise InputError(f"input file {p} is not readable (permission denied)") from None
    first = head.lstrip()[:1]
    container = "json" if first == b"[" else "jsonl"
    return SourceInfo(str(path), h.hexdigest(), p.stat().st_size, container, compressed)


def iter_records(info: SourceInfo) -> Iterator[tuple[RawRecord, int]]:
    """Yield (record, bytes of the file consumed so far) for one source."""
    p = Path(info.path)
    stream, raw, _ = _open_binary(p)
    with raw:
        if info.container == "json":
            try:
                data = loads(stream.read())  # integers beyond 64 bits stay exact (see exact_json)
            except (orjson.JSONDecodeError, InexactJSON) as e:
                raise InputError(f"{p}: not a valid JSON array ({e}); fix the file or convert it to "
                                 f"JSONL (one conversation per line) to skip bad records") from None
            except (OSError, EOFError) as e:
                raise InputError(f"{p}: cannot decompress ({e})") from None
            if not isinstance(data, list):
                raise InputError(f"{p}: top-level JSON is a {type(data).__name__}, expected an array of records")
            for i, item in enumerate(data):
                yield RawRecord(info.first_record + i, f"{p}:item {i}", item), info.bytes
            info.records = len(data)
            return
        lines = 0
        try:
            for line in stream:
                if line.strip():
                    yield RawRecord(info.first_record + lines, f"{p}:line {lines + 1}", line), raw.tell()
                lines += 1
        except (OSError, EOFError) as e:
            raise InputError(f"{p}: cannot decompress after line {lines} ({e}); the .gz file is "
                             f"truncated or damaged") from None
        info.records = lines


def iter_all(infos: list[SourceInfo]) -> Iterator[tuple[RawRecord, int]]:
    """Records of several sources in order, with cumulative bytes consumed."""
    done = 0
    offset = 0
    for info in infos:
        info.first_record = offset
        for rec, pos in iter_records(info):
            yield rec, done + pos
        done += info.bytes
        offset += info.records
