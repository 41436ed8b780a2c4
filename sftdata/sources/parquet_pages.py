"""The largest page of a Parquet column chunk, from the page headers alone.

A Parquet reader decompresses one page at a time, so a page is the unit of memory: a
4 MB page that expands to 2 GB (one huge cell) would be held whole before any cell could
be measured. The page headers say each page's uncompressed size; they are read here
(Thrift compact protocol, a few hundred bytes each, nothing decompressed) so that such a
page is refused before it is read. Pure but for ``read_at(offset, n)``.
"""

from __future__ import annotations

from collections.abc import Callable

HEADER_WINDOW = 1 << 16  # bytes read for one page header (statistics can make it long)
MAX_HEADER = 16 << 20  # a header longer than this is not a page header


class PageHeaderError(ValueError):
    """What should be a page header is not one (a damaged file)."""


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift > 70:
            raise PageHeaderError("a varint longer than 10 bytes")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _skip(b: bytes, i: int, kind: int, depth: int = 0) -> int:
    """Position after one value of compact type ``kind`` at ``b[i]``."""
    if depth > 64:
        raise PageHeaderError("nested deeper than any page header")
    if kind in (1, 2):  # a boolean field: its value is in the field header
        return i
    if kind == 3:
        return i + 1
    if kind in (4, 5, 6):
        return _varint(b, i)[1]
    if kind == 7:
        return i + 8
    if kind == 8:
        n, i = _varint(b, i)
        return i + n
    if kind in (9, 10):  # list, set
        head = b[i]
        i += 1
        n, elem = head >> 4, head & 0x0F
        if n == 15:
            n, i = _varint(b, i)
        for _ in range(n):
            i = i + 1 if elem in (1, 2) else _skip(b, i, elem, depth + 1)
        return i
    if kind == 11:  # map
        n, i = _varint(b, i)
        if n:
            kinds = b[i]
            i += 1
            for _ in range(n):
                i = _skip(b, i, kinds >> 4, depth + 1)
                i = _skip(b, i, kinds & 0x0F, depth + 1)
        return i
    if kind == 12:
        return _struct(b, i, depth + 1)[1]
    raise PageHeaderError(f"unknown Thrift type {kind}")


def _struct(b: bytes, i: int, depth: int = 0) -> tuple[dict[int, int], int]:
    """The i32 fields of a compact-protocol struct at ``b[i]`` (others skipped), and the
    position after it."""
    fields: dict[int, int] = {}
    last = 0
    while True:
        head = b[i]
        i += 1
        if head == 0:
            return fields, i
        kind, delta = head & 0x0F, head >> 4
        if delta:
            fid = last + delta
        else:
            raw, i = _varint(b, i)
            fid = _zigzag(raw)
        last = fid
        if kind == 5 and depth == 0:
            raw, i = _varint(b, i)
            fields[fid] = _zigzag(raw)
        else:
            i = _skip(b, i, kind, depth)


def page_header(read_at: Callable[[int, int], bytes], offset: int) -> tuple[int, int, int]:
    """(uncompressed size, compressed size, header length) of the page at ``offset``."""
    window = HEADER_WINDOW
    while True:
        b = read_at(offset, window)
        try:
            fields, end = _struct(b, 0)
        except IndexError:
            if len(b) < window or window >= MAX_HEADER:
                raise PageHeaderError(f"the page header at byte {offset:,} is cut short") from None
            window *= 4
            continue
        if 2 not in fields or 3 not in fields or fields[2] < 0 or fields[3] < 0:
            raise PageHeaderError(f"no page sizes in the page header at byte {offset:,}")
        return fields[2], fields[3], end


def largest_page(read_at: Callable[[int, int], bytes], start: int, compressed_size: int) -> int:
    """The largest uncompressed page size of the column chunk whose pages (headers
    included) fill ``compressed_size`` bytes from ``start``."""
    largest = 0
    offset, end = start, start + compressed_size
    while offset < end:
        uncompressed, compressed, header = page_header(read_at, offset)
        largest = max(largest, uncompressed)
        offset += header + compressed
    return largest
