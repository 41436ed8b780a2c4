"""JSON Lines, read in bounded chunks: no line is ever held longer than the record bound.

``LineReader(stream, max_bytes)`` yields ``(index, line)`` for each line that is not
blank, ``index`` 0-based and counting blank lines too. A line longer than ``max_bytes``
(its newline not counted) is read past in chunks, never held whole, and yields a
``TooLarge`` with its size instead. Runs of blank lines cost C-speed scans, not one
Python step per line, so a file of a billion empty lines is read at the speed of its
decompression.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from .streams import READ_BYTES

# what bytes.strip() removes: a line of only these is blank
_NONBLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")


@dataclass(frozen=True)
class TooLarge:
    """A record longer than the bound: only its size is kept."""

    size: int


class LineReader:
    """Lines of a UTF-8 byte stream; ``lines`` counts the complete lines read so far
    (what a damaged input reports as the last complete line)."""

    def __init__(self, stream, max_bytes: int, read_bytes: int = READ_BYTES):
        # read1: what is decompressed before a damaged part of the input is still returned
        self._stream_read = getattr(stream, "read1", None) or stream.read
        self._max = max_bytes
        self._read = read_bytes
        self.lines = 0

    def __iter__(self) -> Iterator[tuple[int, bytes | TooLarge]]:
        pending: list[bytes] = []  # the start of the current line, from earlier chunks
        held = 0  # bytes in pending
        skipped = -1  # >= 0 while reading past a line that is too long: its bytes so far
        blank = True  # ... and whether all of them were blank (then it is no record at all)
        max_bytes = self._max
        while True:
            data = self._stream_read(self._read)
            if not data:
                break
            pos, end = 0, data.rfind(b"\n") + 1  # data[pos:end] holds complete lines
            if skipped >= 0 or pending:
                nl = data.find(b"\n")
                stop = len(data) if nl < 0 else nl
                if skipped < 0 and held + stop > max_bytes:  # from here on the line is counted, not kept
                    blank = not any(_NONBLANK.search(p) for p in pending)
                    skipped, pending, held = held, [], 0
                if skipped >= 0:
                    skipped += stop
                    blank = blank and not _NONBLANK.search(data, 0, stop)
                    if nl < 0:
                        continue
                    if not blank:
                        yield self.lines, TooLarge(skipped)
                    skipped = -1
                else:
                    if nl < 0:
                        pending.append(data)
                        held += len(data)
                        continue
                    line = b"".join(pending) + data[:nl]
                    pending, held = [], 0
                    if _NONBLANK.search(line):
                        yield self.lines, line
                self.lines += 1
                pos = nl + 1
            if pos == 0 and data.isspace():  # a chunk of blank lines (the fast path)
                self.lines += data.count(b"\n")
                pos = end
            while pos < end:
                m = _NONBLANK.search(data, pos, end)
                if m is None:
                    self.lines += data.count(b"\n", pos, end)
                    break
                start = data.rfind(b"\n", pos, m.start()) + 1 or pos
                if start > pos:
                    self.lines += data.count(b"\n", pos, start)
                nl = data.find(b"\n", m.start(), end)
                yield self.lines, (data[start:nl] if nl - start <= max_bytes else TooLarge(nl - start))
                self.lines += 1
                pos = nl + 1
            tail = len(data) - end
            if tail > max_bytes:
                skipped, blank = tail, not _NONBLANK.search(data, end)
            elif tail:
                pending, held = [data[end:]], tail
        if skipped >= 0:  # the last line, without a newline
            if not blank:
                yield self.lines, TooLarge(skipped)
            self.lines += 1
        elif pending:
            line = b"".join(pending)
            if _NONBLANK.search(line):
                yield self.lines, line
            self.lines += 1
