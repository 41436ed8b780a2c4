"""A JSON array, streamed item by item with bounded memory.

``ArrayReader(stream, max_bytes)`` yields ``(index, item)`` where ``item`` is the raw
JSON text of one element of the top-level array (decoded later, like a JSONL line), or a
``TooLarge`` for an element longer than ``max_bytes`` (its bytes from its first one up to
the comma that ends it, as a JSONL line's are up to its newline), which is read past and
never held whole. A 1 GB array needs one chunk plus one element of memory, not 1 GB.

Only the structure is scanned (``scan``, vectorised over a chunk with numpy): which
quotes are escaped, so which bytes are inside strings; brackets outside strings, for the
depth; commas at the top level, which end items. Whether an item is valid JSON is for the
decoder to say, per item (a bad item is one rejected record). What breaks the structure
itself (an input that ends before its closing ``]``, text after it, an empty item as in
``[1,,2]``) is an ``ArrayError`` with its byte offset: the items after it cannot be found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .lines import TooLarge
from .streams import READ_BYTES

_NONWS = re.compile(rb"[^ \t\r\n]")
_WS = b" \t\r\n"
_BACKSLASH, _QUOTE, _COMMA, _CLOSE_ARRAY, _CLOSE_OBJECT = 92, 34, 44, 93, 125
_STRUCT = np.zeros(256, bool)
_STRUCT[list(b"[]{},")] = True
_DEPTH = np.zeros(256, np.int64)  # what a byte outside strings does to the depth
_DEPTH[list(b"[{")] = 1
_DEPTH[list(b"]}")] = -1


class ArrayError(ValueError):
    """The top-level array's structure is broken at byte ``offset`` of the text."""

    def __init__(self, what: str, offset: int):
        super().__init__(f"{what}, at byte {offset:,}")
        self.offset = offset


@dataclass
class ScanState:
    """Where a scan stands between chunks: inside a string? is the next byte escaped?
    how deep below the item level?"""

    in_str: bool = False
    escaped: bool = False
    depth: int = 0


def scan(data: bytes, state: ScanState) -> tuple[np.ndarray, np.ndarray]:
    """The positions in ``data`` of the commas and ``]`` at item level (depth 0, outside
    strings) and of any ``}`` there (which closes nothing), in order; ``state`` is
    advanced to the end of ``data`` (pure but for ``state``)."""
    a = np.frombuffer(data, np.uint8)
    quotes = np.flatnonzero(a == _QUOTE)
    backslashes = a == _BACKSLASH
    carried = int(state.escaped)  # an odd run of backslashes ended the previous chunk
    if quotes.size and (carried or backslashes.any()):
        # a quote is escaped when an odd run of backslashes stands right before it
        others = np.flatnonzero(~backslashes)
        i = np.searchsorted(others, quotes)
        before = np.where(i > 0, others[np.maximum(i - 1, 0)], -1)
        run = quotes - 1 - before + np.where(before < 0, carried, 0)
        quotes = quotes[run % 2 == 0]
    if backslashes[-1:].any():  # the run at the end escapes the next chunk's first byte, if odd
        last = np.flatnonzero(~backslashes[::-1])
        run = int(last[0]) if last.size else len(a) + carried
        state.escaped = run % 2 == 1
    else:
        state.escaped = False
    marks = np.flatnonzero(_STRUCT[a])
    marks = marks[(np.searchsorted(quotes, marks) + state.in_str) % 2 == 0]  # outside strings only
    state.in_str = bool((state.in_str + quotes.size) % 2)
    delta = _DEPTH[a[marks]]
    after = np.cumsum(delta) + state.depth
    level = (after - delta) == 0  # the depth before each mark
    state.depth = int(after[-1]) if after.size else state.depth
    found = marks[level & (delta <= 0)]  # commas, ] and } at item level
    return found, a[found]


class ArrayReader:
    """Items of the JSON array a UTF-8 byte stream holds; ``items`` counts those read."""

    def __init__(self, stream, max_bytes: int, read_bytes: int = READ_BYTES):
        # read1: what is decompressed before a damaged part of the input is still returned
        self._read_fn = getattr(stream, "read1", None) or stream.read
        self._max = max_bytes
        self._read = read_bytes
        self.items = 0

    def __iter__(self) -> Iterator[tuple[int, bytes | TooLarge]]:
        base = 0  # offset of the current chunk in the text
        state = ScanState()
        started = ended = False
        pieces: list[bytes] = []  # the current item so far (from its first non-blank byte)
        held = -1  # its bytes so far; -1 before its first non-blank byte
        skipping = False  # too long: counted, not kept
        while True:
            data = self._read_fn(self._read)
            if not data:
                break
            pos = 0
            if ended or not started:
                m = _NONWS.search(data)
                if m is None:
                    base += len(data)
                    continue
                if ended:
                    raise ArrayError(f"text after the closing ] of the array ({self.items:,} items)", base + m.start())
                if data[m.start()] != 0x5B:
                    raise ArrayError("the input does not start with [", base + m.start())
                started, pos = True, m.start() + 1
            chunk = data[pos:]
            found, kinds = scan(chunk, state)
            start = 0
            for p, kind in zip(found.tolist(), kinds.tolist()):
                if kind == _CLOSE_OBJECT:
                    raise ArrayError(f"a }} that closes nothing in item {self.items:,}", base + pos + p)
                held, skipping = self._add(pieces, chunk[start:p], held, skipping)
                at = base + pos + p
                if held < 0:  # nothing but blanks since the last comma (or the [)
                    if kind == _CLOSE_ARRAY and self.items == 0:  # []
                        ended, start = True, p + 1
                        break
                    if kind == _CLOSE_ARRAY:
                        raise ArrayError(f"a comma before the closing ] (after item {self.items - 1:,})", at)
                    raise ArrayError(f"an empty item (two commas, or a comma after [) where item {self.items:,} "
                                     f"should be", at)
                item = TooLarge(held) if skipping or held > self._max else b"".join(pieces).rstrip(_WS)
                yield self.items, item
                self.items += 1
                pieces, held, skipping = [], -1, False
                start = p + 1
                if kind == _CLOSE_ARRAY:
                    ended = True
                    break
            if ended:
                rest = _NONWS.search(chunk, start)
                if rest is not None:
                    raise ArrayError(f"text after the closing ] of the array ({self.items:,} items)",
                                     base + pos + rest.start())
            else:
                held, skipping = self._add(pieces, chunk[start:], held, skipping)
            base += len(data)
        if not started:
            raise ArrayError("the input holds no JSON array", base)
        if not ended:
            where = f"inside item {self.items:,}" if held >= 0 else f"after {self.items:,} items"
            raise ArrayError(f"the array ends before its closing ] ({where})", base)

    def _add(self, pieces: list[bytes], part: bytes, held: int, skipping: bool) -> tuple[int, bool]:
        """Add ``part`` to the current item: (its bytes so far, whether it is being skipped)."""
        if held < 0:
            kept = part.lstrip(_WS)
            if not kept:
                return -1, skipping
            part, held = kept, 0
        held += len(part)
        if skipping:
            return held, True
        if held > self._max:  # from here on the item is counted, not kept
            pieces.clear()
            return held, True
        pieces.append(part)
        return held, False
