"""Inputs as a stream of records, each with its record number and where it came from.

Record numbers are global and 0-based: a record's index in its input (the 0-based line
of a JSONL file, blank lines keeping their numbers; the item of a JSON array; the row
of a Parquet file) plus the records of the inputs before it (``first_record``, kept in
the metadata so that a record number can be turned back into (file, line)). ``where``
strings say it the way people count: ``file:line N`` (1-based), ``file:item N`` and
``file:row N`` (0-based, as JSON and pyarrow count them).

No record is ever held longer than ``max_record_bytes``: a longer line, array item or
Parquet row is read past in bounded chunks and becomes a ``RawRecord`` with a
``record_too_large`` reject instead of its text.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..util.hashing import block_record, combine_blocks, file_hashes
from .hub import HubPin
from .inputs import Input
from .json_array import ArrayError, ArrayReader
from .lines import LineReader, TooLarge
from .parquet import BadValue, ParquetReader
from .remote import open_url, remote_error
from .sniff import compression_of, container_of, encoding_of, refusal
from .streams import (
    READ_BYTES,
    BadText,
    Counted,
    Prefixed,
    as_utf8,
    damage_errors,
    decompressed,
    not_text,
    read_head,
    truncated,
    unreadable,
)

DEFAULT_MAX_RECORD_BYTES = 64 << 20


@dataclass
class SourceInfo:
    path: str  # the input's name: a path, a URL or "<stdin>"
    sha256: str | None  # of the bytes read (None for a Parquet URL, of which only the needed parts are read)
    bytes: int  # the input's size (for a stream: known once it is read)
    container: str  # "jsonl" | "json" | "parquet"
    compressed: bool
    first_record: int = 0
    records: int = 0  # record numbers used (lines incl. blank ones, array items, or rows)
    # how the bytes are read (sniffed again, so not recorded in the metadata)
    compression: str | None = None  # "gzip" | "bzip2" | "xz" | "zstd"
    encoding: str = "utf-8"  # the codec reading the text: "utf-8", "utf-8-sig", "utf-16", "utf-32"
    kind: str = "file"  # "file" | "url" | "stdin"
    size_known: bool = True
    hub: HubPin | None = None  # a Hub dataset's revision and the commit ``path`` is pinned to
    _opened: Any = field(default=None, repr=False)  # a stream's state after sniffing (it cannot be opened twice)
    block_sha256: str | None = None  # the block hash of the bytes read (util.hashing.combine_blocks)

    def as_dict(self) -> dict:
        out = {"path": self.path, "sha256": self.sha256, "bytes": self.bytes, "container": self.container,
               "compressed": self.compressed, "first_record": self.first_record, "records": self.records}
        if self.block_sha256 is not None:
            out["block_sha256"] = block_record(self.block_sha256)
        return out if self.hub is None else {**out, **self.hub.as_dict()}


@dataclass
class RawRecord:
    record: int  # global 0-based record number
    where: str  # "file:line N" / "file:item N" / "file:row N"
    raw: Any  # the JSON text of one record (bytes); b"" when ``reject`` is set
    reject: tuple[str, str] | None = None  # (reason, message) decided while reading


def too_large(size: int, max_bytes: int) -> tuple[str, str]:
    return ("record_too_large", f"the record is {size:,} bytes, longer than --max-record-bytes ({max_bytes:,}); it "
                                f"was read past, never held whole. Shorten or split it, or raise --max-record-bytes")


# -- opening ---------------------------------------------------------------------------------
def _open_raw(src: Input) -> Counted:
    if src.kind == "stdin":
        return Counted(sys.stdin.buffer)
    if src.kind == "url":
        return Counted(open_url(src.name), remote=True)
    try:
        return Counted(open(src.name, "rb"))
    except FileNotFoundError:
        raise InputError(f"input file {src.name} does not exist") from None
    except PermissionError:
        raise InputError(f"input file {src.name} is not readable (permission denied)") from None
    except IsADirectoryError:
        raise InputError(f"input {src.name} is not a file") from None
    except OSError as e:
        raise unreadable(src.name, e) from None


def _sniffed(name: str, raw: Counted):
    """(compression, encoding, container, the stream of the decompressed bytes from the
    start): the first bytes are read once, and put back in front of the stream."""
    try:
        head = read_head(raw)
    except OSError as e:
        raise unreadable(name, e) from None
    compression = compression_of(head)
    stream = Prefixed(head, raw)
    if compression:
        inner = decompressed(stream, compression, name)
        try:  # damaged after some bytes: reading on says where
            head = read_head(inner, damaged=damage_errors())
        except damage_errors() as e:
            raise truncated(name, compression, e, None) from None
        stream = Prefixed(head, inner)
    why = refusal(head, name, compression)
    if why:
        raise InputError(why)
    encoding = encoding_of(head)
    return compression, encoding, container_of(head, encoding), stream


def inspect_source(src: Input | str | os.PathLike) -> SourceInfo:
    """Sniff what an input holds, failing early with a one-line message. A file or URL
    is opened again to be read; a stream (stdin, a pipe) is read on from where sniffing
    stopped."""
    if not isinstance(src, Input):
        src = Input(os.fspath(src), "file", None)
    size, streamed = src.size, src.kind == "stdin"
    if src.kind == "file":
        p = Path(src.name)
        try:
            st = p.stat()
        except FileNotFoundError:
            raise InputError(f"input file {p} does not exist") from None
        except OSError as e:
            raise unreadable(src.name, e) from None
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"input {p} is not a file")
        streamed = not stat.S_ISREG(st.st_mode)  # a pipe (<(zcat ...)) can be read once
        size = None if streamed else st.st_size
    raw = _open_raw(src)
    try:
        compression, encoding, container, stream = _sniffed(src.name, raw)
        if container == "parquet" and streamed:
            raise InputError(f"{src.name} holds a Parquet file, which is read in place (it needs random access), not "
                             f"as a stream: save it to a file and give its path")
    except BaseException:
        raw.close()
        raise
    info = SourceInfo(src.name, None, size or 0, container, compression is not None, compression=compression,
                      encoding=encoding, kind=src.kind, size_known=size is not None, hub=src.hub)
    if container == "parquet":  # its footer and columns are checked now, before any input is read
        with _parquet(info, DEFAULT_MAX_RECORD_BYTES):
            pass
    if streamed:
        info._opened = (raw, stream)
    else:
        raw.close()
    return info


# -- reading -----------------------------------------------------------------------------------
def _record(info: SourceInfo, index: int, item, unit: str, max_bytes: int) -> RawRecord:
    number = info.first_record + index
    where = f"{info.path}:{unit} {index + 1 if unit == 'line' else index}"
    if isinstance(item, TooLarge):
        return RawRecord(number, where, b"", too_large(item.size, max_bytes))
    if isinstance(item, BadValue):
        return RawRecord(number, where, b"", (item.reason, item.message))
    return RawRecord(number, where, item)


@contextmanager
def _parquet(info: SourceInfo, max_bytes: int) -> Iterator[ParquetReader]:
    source = open_url(info.path) if info.kind == "url" else info.path
    try:
        reader = ParquetReader(source, info.path, max_bytes)
        try:
            yield reader
        finally:
            reader.close()
    finally:
        if info.kind == "url":
            source.close()


def _parquet_records(info: SourceInfo, max_bytes: int) -> Iterator[tuple[RawRecord, int]]:
    with _parquet(info, max_bytes) as reader:
        for row, item in reader:
            yield _record(info, row, item, "row", max_bytes), info.bytes * (row + 1) // max(1, reader.rows)
    info.records = reader.rows
    if info.kind == "file":
        try:
            info.sha256, info.block_sha256 = file_hashes(info.path)
        except OSError as e:
            raise unreadable(info.path, e) from None


def iter_records(info: SourceInfo, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
                 ) -> Iterator[tuple[RawRecord, int]]:
    """Yield (record, bytes of the input read so far) for one source; when it ends,
    ``info`` holds the input's record count, size and sha256."""
    if info.container == "parquet":
        yield from _parquet_records(info, max_record_bytes)
        return
    if info._opened is not None:
        (raw, stream), info._opened = info._opened, None
    else:
        raw = _open_raw(Input(info.path, info.kind))
        stream = _sniffed(info.path, raw)[3]
    damaged = damage_errors() if info.compression else ()
    is_array = info.container == "json"
    reader: ArrayReader | LineReader | None = None
    try:
        text = as_utf8(stream, info.encoding)
        reader = ArrayReader(text, max_record_bytes) if is_array else LineReader(text, max_record_bytes)
        unit = "item" if is_array else "line"
        for index, item in reader:
            yield _record(info, index, item, unit, max_record_bytes), raw.bytes
        raw.drain()
    except ArrayError as e:
        raise InputError(f"{info.path}: not a valid JSON array ({e}); fix the file, or convert it to JSONL (one "
                         f"conversation per line) to skip bad records") from None
    except BadText as e:
        raise not_text(info.path, info.encoding, e) from None
    except damaged as e:
        at = (f"{reader.items:,} items of the JSON array could be read" if isinstance(reader, ArrayReader) else
              _last_line(reader.lines if reader is not None else 0))
        raise truncated(info.path, info.compression, e, at) from None
    except OSError as e:
        raise (remote_error(info.path, e) if info.kind == "url" else unreadable(info.path, e)) from None
    finally:
        raw.close()
    info.records = reader.items if is_array else reader.lines
    info.sha256 = raw.hash.hexdigest()
    info.block_sha256 = combine_blocks(raw.blocks.finish())
    info.bytes = raw.bytes


def _last_line(lines: int) -> str:
    return f"the last complete line is line {lines}" if lines else "it ends before its first complete line"


def record_where(sources: list[dict], record: int) -> str | None:
    """``file:line N`` / ``file:item N`` / ``file:row N`` of global record number
    ``record``, from the metadata's ``sources`` list (its ``first_record``, ``records``
    and ``container``); None when no source holds it (pure)."""
    for s in sources:
        first, n = s.get("first_record"), s.get("records")
        if isinstance(first, int) and isinstance(n, int) and first <= record < first + n:
            index = record - first
            unit = {"json": "item", "parquet": "row"}.get(s.get("container"), "line")
            return f"{s.get('path')}:{unit} {index + 1 if unit == 'line' else index}"
    return None


def iter_all(infos: list[SourceInfo], max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
             ) -> Iterator[tuple[RawRecord, int]]:
    """Records of several sources in order, with cumulative bytes read."""
    done = 0
    offset = 0
    for info in infos:
        info.first_record = offset
        for rec, pos in iter_records(info, max_record_bytes):
            yield rec, done + pos
        done += info.bytes
        offset += info.records


__all__ = ["DEFAULT_MAX_RECORD_BYTES", "READ_BYTES", "RawRecord", "SourceInfo", "inspect_source", "iter_all",
           "iter_records", "record_where", "too_large"]
