"""Parquet inputs: one record per row, read row group by row group in small batches.

The record of a row is a JSON object made of the columns the record parsers read
(``RECORD_COLUMNS``); other columns (ids, scores, images) are never read:

* ``messages`` / ``conversations`` as a list of structs (the hub's usual layout): each
  struct is a message; a field that is null is left out (Parquet cannot tell a null
  from an absent key), so ``{"role": "user", "content": "hi", "name": null}`` is read
  as ``{"role": "user", "content": "hi"}``;
* ``messages`` / ``conversations`` as text: JSON text of the list, used as it is;
* ``system``, ``tools``, ``functions``: as stored (a string stays a string: the tool
  parser reads JSON text of tool schemas);
* a file whose only column is text: each cell is one whole record as JSON text.

Record numbers are row numbers (0-based, as pyarrow and pandas count them). Memory is
bounded: a batch holds about ``BATCH_BYTES`` of rows, a column chunk is streamed page by
page (``BUFFER_BYTES``), and before a row group is read the headers of its pages are
checked (``parquet_pages``): a page that would expand beyond twice the record bound is
refused, as no cell in it could be measured without holding it whole. A cell (the record
built from a row) longer than the bound is a ``TooLarge``.

The reader is pyarrow's own (``pyarrow._parquet.ParquetReader``, the class that
``pyarrow.parquet.ParquetFile`` wraps), imported alone: ``pyarrow.parquet`` also imports
``pyarrow.fs`` and its S3, GCS, HDFS and Azure modules, about 5 MiB of resident memory a
run never uses. A pyarrow whose reader class opens differently gets ``ParquetFile``.

Memory given back: Arrow allocates through the C allocator (``ARROW_DEFAULT_MEMORY_POOL=
system`` unless the user chose a pool) and frees each decompressed page once its rows
are read. glibc would keep those pages: after a large block is freed it raises its mmap
threshold to that size, so later pages come from the heap and stay there. When a Parquet
file is opened, the threshold is fixed at 256 KiB (``mallopt``, unless the user set
``MALLOC_MMAP_THRESHOLD_``), so every page is its own mapping, returned when freed; and
after every ``TRIM_BYTES`` of row groups the heap's free pages are returned
(``malloc_trim``). Batches of 128 KiB stay below that threshold and in the caches: against
1 MiB batches they took 2-3 MiB off the peak and a third off the reading time. What
remains over a JSONL run is pyarrow itself: 28.5 MiB of its libraries' pages (19 touched
by loading them, 3.5 by its modules' set-up, 6 by the decoding code:
benchmarks/bench_parquet_pages.py), and the pages Arrow holds while it decodes a column
chunk (its dictionary and one data page, decompressed: about 4 MiB with ``datasets``'
pages, 26 MiB with pyarrow's default 11 MB pages). Reading with ``pre_buffer`` or
``memory_map`` would add the row group or the file's pages (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from ..errors import InputError
from .lines import TooLarge
from .parquet_pages import PageHeaderError, largest_page

MESSAGE_COLUMNS = ("messages", "conversations")
RECORD_COLUMNS = ("messages", "conversations", "system", "tools", "functions")
BATCH_BYTES = 128 << 10  # uncompressed bytes of rows converted to records at once
BUFFER_BYTES = 64 << 10  # read buffer of a column chunk (a page larger than this is read whole, as it must)
MAX_BATCH_ROWS = 4096
PAGE_FLOOR = 16 << 20  # pages up to this size are always read (writers make them ~1 MiB)
MMAP_THRESHOLD = 256 << 10  # blocks from this size up are mappings of their own (given back when freed)
TRIM_BYTES = 16 << 20  # uncompressed row-group bytes read between two returns of the heap's free pages
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _glibc():
    """The C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


_LIBC = None
_TUNED = False


def _tune_malloc():
    """Fix glibc's mmap threshold once (see the module's docstring); the C library or None."""
    global _LIBC, _TUNED
    if not _TUNED:
        _TUNED = True
        _LIBC = _glibc()
        if _LIBC is not None and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            _LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return _LIBC


@dataclass(frozen=True)
class BadValue:
    """A row whose values cannot become a JSON record (reason code, message)."""

    reason: str
    message: str


def pyarrow_parquet(name: str):
    """``pyarrow._parquet`` (see the module's docstring), or an error naming the extra
    that installs pyarrow."""
    if "pyarrow" not in sys.modules:  # unless told otherwise: Arrow's default allocator (mimalloc) keeps what a
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # stream of small batches frees (~30 MiB)
    try:
        import pyarrow._parquet as pqlib
    except ImportError:
        raise InputError(f"{name} is a Parquet file; reading it needs pyarrow: pip install 'sftdata[parquet]' "
                         f"(or pip install pyarrow)") from None
    return pqlib


def open_file(pqlib, source):
    """(reader, the path of each leaf column): pyarrow's reader class opened on ``source``;
    where that class is missing or opens differently, ``pyarrow.parquet.ParquetFile`` and
    None. Either way a column chunk is streamed page by page and nothing is read ahead."""
    try:
        reader = pqlib.ParquetReader()
        reader.open(source, buffer_size=BUFFER_BYTES, pre_buffer=False)
        return reader, list(reader.column_paths)
    except (AttributeError, TypeError):
        import pyarrow.parquet as pq

        return pq.ParquetFile(source, buffer_size=BUFFER_BYTES, pre_buffer=False), None


def _is_text(t) -> bool:
    import pyarrow as pa

    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or getattr(pa.types, "is_string_view", lambda _: False)(t))


def record_columns(schema, name: str) -> tuple[list[tuple[str, str]], bool]:
    """([(column, how)], whole_record) for an Arrow schema: ``how`` is ``json`` (JSON text
    used as it is), ``value`` (converted) or ``string`` (kept a string)."""
    names = schema.names
    if any(c in names for c in MESSAGE_COLUMNS):
        cols = []
        for c in RECORD_COLUMNS:
            if c in names:
                text = _is_text(schema.field(c).type)
                cols.append((c, ("json" if c in MESSAGE_COLUMNS else "string") if text else "value"))
        if "messages" in names and "conversations" in names:  # the parsers read "messages" first
            cols = [x for x in cols if x[0] != "conversations"]
        return cols, False
    if len(names) == 1 and _is_text(schema.field(0).type):
        return [(names[0], "json")], True
    listed = ", ".join(f"{f.name} ({f.type})" for f in schema)
    raise InputError(f"{name} has no column sftdata can read: a Parquet input needs a 'messages' or "
                     f"'conversations' column (a list of message structs, or JSON text), or a single text column "
                     f"holding each record as JSON; its columns: {listed or 'none'}")


def _without_nulls(v):
    if isinstance(v, dict):
        return {k: _without_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_without_nulls(x) for x in v]
    return v


def _default(v):
    if isinstance(v, (bytes, bytearray)):
        return v.decode("utf-8")
    raise TypeError(f"a {type(v).__name__} value")


def _encoded(v) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


def row_record(values: list, cols: list[tuple[str, str]], whole: bool) -> bytes | BadValue:
    """The JSON text of one row's record (pure)."""
    if whole:
        return b"null" if values[0] is None else _encoded(values[0])
    parts = []
    for (col, how), v in zip(cols, values):
        if v is None:
            continue
        try:
            if how == "json":
                text = _encoded(v)
            else:
                text = orjson.dumps(_without_nulls(v) if how == "value" else v, default=_default)
        except (TypeError, UnicodeDecodeError, orjson.JSONEncodeError) as e:
            bad = e if isinstance(e, UnicodeDecodeError) else e.__cause__  # orjson wraps what default raised
            if isinstance(bad, UnicodeDecodeError):
                return BadValue("invalid_utf8", f"column {col!r} holds bytes that are not UTF-8 text (byte "
                                                f"{bad.start})")
            return BadValue("invalid_json", f"column {col!r} holds a value JSON cannot hold ({e})")
        parts.append(b'"' + col.encode() + b'":' + text)
    return b"{" + b",".join(parts) + b"}"


class ParquetReader:
    """The records of a Parquet file, one per row: ``(row, text | TooLarge | BadValue)``.

    ``source`` is a path or a seekable binary file object (a URL's)."""

    def __init__(self, source, name: str, max_bytes: int):
        pqlib = pyarrow_parquet(name)
        import pyarrow as pa

        self._name = name
        self._max = max_bytes
        self._source = source
        self._errors = (pa.ArrowException, OSError, ValueError)
        try:
            self._file, paths = open_file(pqlib, source)
            self.cols, self.whole = record_columns(self._file.schema_arrow, name)
        except self._errors as e:
            raise InputError(f"{name} is not a readable Parquet file ({e}); re-create or re-download it") from None
        self.rows = self._file.metadata.num_rows
        names = {c for c, _ in self.cols}
        self._leaves = None if paths is None else [i for i, path in enumerate(paths) if path[0] in names]
        self._headers = None  # the file object page headers are read through
        self._libc = _tune_malloc()

    def close(self) -> None:
        if self._headers is not None and self._headers is not self._source:
            self._headers.close()
        self._headers = None

    def _read_at(self, offset: int, n: int) -> bytes:
        if self._headers is None:  # a path: pyarrow reads it natively, headers through a handle of ours
            self._headers = open(self._source, "rb") if isinstance(self._source, str) else self._source
        self._headers.seek(offset)
        return self._headers.read(n)

    def _batch_rows(self, group) -> int:
        """Rows per batch for a row group, from its stored sizes: about BATCH_BYTES."""
        names = {c for c, _ in self.cols}
        size = sum(group.column(j).total_uncompressed_size for j in range(group.num_columns)
                   if group.column(j).path_in_schema.split(".")[0] in names)
        per_row = max(1, size // max(1, group.num_rows))
        return max(1, min(MAX_BATCH_ROWS, BATCH_BYTES // per_row))

    def _check_pages(self, index: int, group) -> None:
        names = {c for c, _ in self.cols}
        limit = max(PAGE_FLOOR, 2 * self._max)
        for j in range(group.num_columns):
            col = group.column(j)
            if col.path_in_schema.split(".")[0] not in names or col.total_uncompressed_size <= limit:
                continue  # no page can be larger than its whole column chunk
            start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
            try:
                largest = largest_page(self._read_at, start, col.total_compressed_size)
            except PageHeaderError as e:
                raise InputError(f"{self._name}: row group {index} is damaged ({e}); re-create the file") from None
            if largest > limit:
                raise InputError(
                    f"{self._name}: row group {index}, column {col.path_in_schema}, holds a page of {largest:,} bytes "
                    f"uncompressed; reading it would hold it whole, past twice --max-record-bytes ({self._max:,}). "
                    f"Rewrite the file with smaller pages (pyarrow: data_page_size) or raise --max-record-bytes")

    def __iter__(self) -> Iterator[tuple[int, bytes | TooLarge | BadValue]]:
        return self.rows_of(range(self._file.metadata.num_row_groups), 0)

    def group_spans(self) -> list[tuple[int, int]]:
        """(rows, first byte) of each row group, the byte its first column chunk starts at:
        what a partition of row groups is planned from (the footer alone is read)."""
        meta = self._file.metadata
        out = []
        for index in range(meta.num_row_groups):
            group = meta.row_group(index)
            starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
                      for c in (group.column(j) for j in range(group.num_columns))]
            out.append((group.num_rows, min(starts, default=0)))
        return out

    def rows_of(self, groups: range, first_row: int) -> Iterator[tuple[int, bytes | TooLarge | BadValue]]:
        """The records of row groups ``groups``, numbered from ``first_row`` (the rows of
        the groups before them)."""
        meta = self._file.metadata
        names = [c for c, _ in self.cols]
        row = first_row
        unreturned = 0  # row-group bytes read since the heap's free pages were last returned
        for index in groups:
            group = meta.row_group(index)
            self._check_pages(index, group)
            try:
                rows = self._batch_rows(group)
                batches = (self._file.iter_batches(batch_size=rows, row_groups=[index], columns=names,
                                                   use_threads=False) if self._leaves is None else
                           self._file.iter_batches(rows, [index], self._leaves, use_threads=False))
                for batch in batches:
                    columns = [batch.column(c).to_pylist() for c in names]
                    del batch  # its Arrow buffers go now, not when the next batch replaces it
                    for values in zip(*columns):
                        rec = row_record(list(values), self.cols, self.whole)
                        if isinstance(rec, bytes) and len(rec) > self._max:
                            rec = TooLarge(len(rec))
                        yield row, rec
                        row += 1
                del batches  # the reader's pages go before the next row group's are read
            except self._errors as e:
                raise InputError(f"{self._name}: row group {index} cannot be read ({e}); re-create or "
                                 f"re-download the file") from None
            unreturned += group.total_byte_size
            if self._libc is not None and unreturned >= TRIM_BYTES:
                self._libc.malloc_trim(0)
                unreturned = 0
