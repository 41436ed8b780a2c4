"""A JSON array, streamed item by item with bounded memory.

``ArrayReader(stream, max_bytes)`` yields ``(index, item)`` where ``item`` is the raw
JSON text of one element of the top-level array (decoded later, like a JSONL line), or
a ``TooLarge`` for an element longer than ``max_bytes`` (its bytes up to the comma that
ends it, as a JSONL line's are up to its newline), which is read past in chunks and never
held whole. A 1 GB array needs one chunk plus one element of memory, not 1 GB.

Only the structure is scanned here (strings, brackets, the commas between items): that
is what finds where an item ends. Whether an item is valid JSON is for the decoder to say,
per item (a bad item is one rejected record). What breaks the structure itself (a file
that ends before its closing ``]``, text after it, an empty item as in ``[1,,2]``) is an
``ArrayError`` with its byte offset: the items after it cannot be found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .lines import TooLarge
from .streams import READ_BYTES

_TOP = re.compile(rb'[\[\]{}",]')  # between items: what starts or ends one
# inside an item: a whole string (group 1 is its closing quote, empty when the string goes on
# past what is read), or a bracket; commas and everything else do not matter there
_INSIDE = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+("?)|[\[\]{}]', re.S)
# inside a string: up to and including its closing quote (group 1), or to the end of what is
# read; a backslash at the very end is left unmatched (it escapes the next byte, not yet read)
_STRING_REST = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+(")?', re.S)
_NONWS = re.compile(rb"[^ \t\r\n]")
_QUOTE, _COMMA = 0x22, 0x2C
_OPEN = (0x5B, 0x7B)  # [ {
_CLOSE_ARRAY, _CLOSE_OBJECT = 0x5D, 0x7D
_WS = b" \t\r\n"


class ArrayError(ValueError):
    """The top-level array's structure is broken at byte ``offset`` of the text."""

    def __init__(self, what: str, offset: int):
        super().__init__(f"{what}, at byte {offset:,}")
        self.offset = offset


class ArrayReader:
    """Items of the JSON array a UTF-8 byte stream holds; ``items`` counts those read."""

    def __init__(self, stream, max_bytes: int, read_bytes: int = READ_BYTES):
        # read1: what is decompressed before a damaged part of the input is still returned
        self._stream_read = getattr(stream, "read1", None) or stream.read
        self._max = max_bytes
        self._read = read_bytes
        self._buf = bytearray()
        self._base = 0  # offset of _buf[0] in the text
        self.items = 0

    def _more(self) -> bool:
        chunk = self._stream_read(self._read)
        self._buf += chunk
        return bool(chunk)

    def _drop(self, n: int) -> None:
        del self._buf[:n]  # O(1) at the front of a bytearray
        self._base += n

    def _next_nonblank(self, i: int, what: str) -> int:
        """Position of the next byte that is not whitespace, reading on as needed."""
        while True:
            m = _NONWS.search(self._buf, i)
            if m:
                return m.start()
            self._drop(len(self._buf))
            i = 0
            if not self._more():
                raise ArrayError(what, self._base)

    def __iter__(self) -> Iterator[tuple[int, bytes | TooLarge]]:
        buf = self._buf
        s = self._next_nonblank(0, "the input holds no JSON array")
        if buf[s] != 0x5B:
            raise ArrayError("the input does not start with [", self._base + s)
        i = s + 1
        while True:
            s = self._next_nonblank(i, f"the array ends before its closing ] (after {self.items:,} items)")
            c = buf[s]
            if c == _CLOSE_ARRAY:
                if self.items:
                    raise ArrayError(f"a comma before the closing ] (after item {self.items - 1:,})", self._base + s)
                i = s + 1
                break
            if c == _COMMA:
                raise ArrayError(f"an empty item (two commas, or a comma after [) where item {self.items:,} should "
                                 f"be", self._base + s)
            self._drop(s)
            end, closing, item = self._item()
            yield self.items, item
            self.items += 1
            i = end + 1
            if closing:
                break
        self._after(i)

    def _item(self) -> tuple[int, bool, bytes | TooLarge]:
        """Scan the item starting at ``_buf[0]``: (position of the comma or ``]`` that ends
        it, whether that is the closing ``]``, its text or size). Inside the item only
        strings and brackets matter (one C-speed regex step each); at the top level, commas."""
        buf = self._buf
        depth = 0
        in_str = False
        skipped = -1  # >= 0 once the item is longer than the bound: the bytes dropped so far
        j = 0
        while True:
            more = False
            if in_str:  # the rest of a string read in pieces
                m = _STRING_REST.match(buf, j)
                j = m.end()
                in_str = more = m.group(1) is None
            if depth and not more:
                for m in _INSIDE.finditer(buf, j):
                    c = buf[m.start()]
                    if c == _QUOTE:
                        if not m.group(1):  # the string goes on past what is read
                            in_str = more = True
                            j = m.end()
                            break
                    elif c in _OPEN:
                        depth += 1
                    else:
                        depth -= 1
                        if not depth:
                            j = m.end()
                            break
                else:
                    j = len(buf)
                    more = True
            if not more:
                m = _TOP.search(buf, j)
                if m is None:
                    j = len(buf)
                else:
                    p = m.start()
                    c = buf[p]
                    j = p + 1
                    if c == _QUOTE:
                        in_str = True
                    elif c in _OPEN:
                        depth = 1
                    elif c == _CLOSE_OBJECT:
                        raise ArrayError(f"a }} that closes nothing in item {self.items:,}", self._base + p)
                    else:  # a comma or ] at the top level ends the item
                        size = p if skipped < 0 else skipped + p  # what was held: up to the comma
                        return p, c == _CLOSE_ARRAY, (bytes(buf[:p]).rstrip(_WS) if size <= self._max else
                                                      TooLarge(size))
                    continue
            # the item goes on past what is read: keep it, or (too long) drop what is scanned
            if skipped < 0 and len(buf) > self._max:
                skipped = 0
            if skipped >= 0:  # a string's trailing backslash is not scanned yet: it stays
                skipped += j
                self._drop(j)
                j = 0
            if not self._more():
                raise self._unfinished()

    def _unfinished(self) -> ArrayError:
        return ArrayError(f"the array ends before its closing ] (inside item {self.items:,})",
                          self._base + len(self._buf))

    def _after(self, i: int) -> None:
        """Only whitespace may follow the closing ``]``."""
        buf = self._buf
        while True:
            m = _NONWS.search(buf, i)
            if m:
                raise ArrayError(f"text after the closing ] of the array ({self.items:,} items)", self._base + m.start())
            self._drop(len(buf))
            i = 0
            if not self._more():
                return
