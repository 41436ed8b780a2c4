"""Inputs cut into partitions that separate tasks read on their own (``--engine ray``).

A partition is a whole input, or a byte range of a plain (uncompressed, UTF-8) local
JSON Lines file that starts at a line start::

    chats.jsonl   |line 0 .. line 9,812|line 9,813 .. line 19,540|line 19,541 .. EOF|
                   ^ byte 0             ^ first "\\n" after 64 MiB  ^ ... after 128 MiB

Records are numbered from the start of their input (``first_record`` 0), so a task
needs nothing but its own partition and the number of lines before it
(``line_counts``, or ``SequentialScan`` as the ranges are handed out in order;
``file_digest`` gives the input's sha256 and size); the driver adds the input's first record number, which the
record counts of the inputs before it decide. ``where`` strings (``file:line N``) are
relative to the input, so they are exactly those of a sequential read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import InputError
from ..util import hashing
from ..util.hashing import BlockHasher, combine_blocks, file_hashes
from .lines import LineReader
from .records import DEFAULT_MAX_RECORD_BYTES, RawRecord, SourceInfo, _parquet, _record, iter_records
from .streams import READ_BYTES, unreadable

PROBE_BYTES = 16 << 10  # read at a cut first, to find the next line start
PART_BYTES = 64 << 20  # the size a JSONL input is cut into (the last piece of an input may be smaller)
SCAN_BYTES = 8 << 20  # read at once by ``scan_range``


@dataclass(frozen=True)
class Partition:
    """Input ``source`` (its index among the inputs), bytes ``[start, end)``; ``end`` is
    None for a whole input read as ``iter_records`` reads it. A Parquet file's partition is
    its row groups ``groups = (first, stop, rows before them)``; its bytes (the ranges of
    a file's partitions cover it, from 0 to its size) are the ones its scan hashes."""

    index: int
    source: int
    info: SourceInfo
    start: int = 0
    end: int | None = None
    groups: tuple[int, int, int] | None = None

    @property
    def whole(self) -> bool:
        return self.end is None


WHOLE_SHA256_BYTES = 1 << 30  # a file read in partitions has its whole-file sha256 recorded up to this size


def records_sha256(info: SourceInfo, asked: bool = False) -> bool:
    """Whether the metadata records the input's whole-file sha256 (a property of the input,
    the same for any number of workers): always for an input one reader reads whole
    anyway (compressed, a JSON array, a URL, stdin); for a file that workers read in
    partitions, when it is at most ``WHOLE_SHA256_BYTES`` (hashing it whole takes about a
    second, in a task beside the others) or when ``asked`` (``--source-sha256``). Every
    input's block hash is recorded: its blocks are hashed by the tasks that read them."""
    return asked or not splittable(info) or info.bytes <= WHOLE_SHA256_BYTES


def first_where(part: Partition, lines_before: int) -> str:
    """Where the first record of ``part`` is (``file:line N``), for messages."""
    unit = {"json": "item 0", "parquet": f"row {lines_before}"}.get(part.info.container, f"line {lines_before + 1}")
    return f"{part.info.path}:{unit}"


def splittable(info: SourceInfo) -> bool:
    """A plain local JSONL file: its lines can be read from any line start."""
    return (info.kind == "file" and info.container == "jsonl" and not info.compressed
            and info.encoding in ("utf-8", "utf-8-sig") and info.size_known)


def in_row_groups(info: SourceInfo) -> bool:
    """A local Parquet file: its row groups can be read apart."""
    return info.kind == "file" and info.container == "parquet" and info.size_known


def partitionable(info: SourceInfo) -> bool:
    """An input workers read in partitions: plain JSONL in byte ranges, Parquet in row groups."""
    return splittable(info) or in_row_groups(info)


def _group_partitions(info: SourceInfo, size_at, done: int) -> list[tuple[int, int, tuple[int, int, int]]]:
    """(start, end, groups) of the partitions of a Parquet file: whole row groups of about
    ``size_at(bytes planned)`` bytes each; the byte ranges cover the file, in order."""
    with _parquet(info, DEFAULT_MAX_RECORD_BYTES) as reader:
        spans = reader.group_spans()
    starts, at = [], 0
    for _, s in spans:  # groups are written in order; held so even if a footer says otherwise
        at = min(max(at, s), info.bytes)
        starts.append(at)
    groups, g, rows = [], 0, 0
    while g < len(spans):
        first, first_rows, want = g, rows, size_at(done + starts[g])
        while True:
            rows += spans[g][0]
            g += 1
            if g >= len(spans) or starts[g] - starts[first] >= want:
                break
        groups.append((first, g, first_rows))
    bounds = [0] + [starts[a] for a, _, _ in groups[1:]] + [info.bytes]
    return [(bounds[k], bounds[k + 1], grp) for k, grp in enumerate(groups)]


def _next_line_start(f, offset: int, size: int) -> int:
    """The first line start at or after ``offset`` (``size`` at the end of the file). The
    coordinator runs it once per cut: it reads ``PROBE_BYTES`` (a few lines), then twice as
    much each time up to ``READ_BYTES``, so what it reads grows with the cuts, not the input."""
    if offset <= 0:
        return 0
    f.seek(offset - 1)
    pos, want = offset - 1, PROBE_BYTES
    while pos < size:
        block = f.read(want)
        if not block:
            return size
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(block)
        want = min(2 * want, READ_BYTES)
    return size


def plan_partitions(infos: list[SourceInfo], part_bytes: int = PART_BYTES,
                    shrink: tuple[int, int] | None = None) -> list[Partition]:
    """The partitions of ``infos`` in input order: byte ranges of about ``part_bytes``
    for each plain local JSONL file, whole row groups of about as many bytes for each
    local Parquet file, each other input whole.

    ``shrink=(ways, min_bytes)`` (guided sizes, for tasks taken in order by ``ways``-times
    fewer workers): each range is at most ``part_bytes`` and at most ``1/ways`` of the
    bytes left in the plain files from its start on, but not under ``min_bytes``; the
    last ranges are small, so the workers finish together::

        50 MB, part_bytes 4 MB, shrink (4, 256 KB):  4 4 4 4 4 4 4 4 4 3.5 2.6 2.0 ... 0.34 0.26 0.26
    """
    left = sum(i.bytes for i in infos if partitionable(i))

    def size_at(done: int) -> int:  # the next range's size, ``done`` bytes of the plain files planned
        if shrink is None:
            return part_bytes
        ways, min_bytes = shrink
        return max(1, min(part_bytes, max(min_bytes, (left - done) // ways)))

    out: list[Partition] = []
    done = 0  # bytes of the plain files planned so far
    for si, info in enumerate(infos):
        plain = dataclasses.replace(info, first_record=0, records=0, _opened=None)
        if not partitionable(info) or info.bytes <= size_at(done):
            out.append(Partition(len(out), si, plain))
            done += info.bytes if partitionable(info) else 0
            continue
        size = info.bytes
        if in_row_groups(info):
            groups = _group_partitions(info, size_at, done)
            if len(groups) == 1:
                out.append(Partition(len(out), si, plain))
            else:
                out.extend([Partition(len(out) + k, si, plain, a, b, g) for k, (a, b, g) in enumerate(groups)])
            done += size
            continue
        try:
            with open(info.path, "rb") as f:
                if shrink is None:  # cut near each multiple of part_bytes
                    cuts = sorted({_next_line_start(f, k, size) for k in range(part_bytes, size, part_bytes)} - {0, size})
                else:  # each cut one (shrinking) size after the one before
                    cuts, at = [], 0
                    while (at := _next_line_start(f, at + size_at(done + at), size)) < size:
                        cuts.append(at)
        except OSError as e:
            raise unreadable(info.path, e) from None
        starts = [0, *cuts]
        for a, b in zip(starts, [*cuts, size]):
            out.append(Partition(len(out), si, plain, a, b))
        done += size
    return out


@dataclass(frozen=True)
class RangeScan:
    """What one pass over a byte range found: the newlines in it (``lines``: the lines that
    start in it, for a range that starts and ends on line starts), and the digests of the
    input's hash blocks that start in it (``util.hashing``), the first being block
    ``first_block``."""

    lines: int
    first_block: int
    digests: tuple[bytes, ...]


def scan_range(path: str, start: int, end: int, size: int, count_lines: bool = True, hash_blocks: bool = True
               ) -> RangeScan:
    """One read of bytes ``[start, end)`` of the file at ``path`` (``size`` bytes): its
    newlines counted (at GB/s) and, with ``hash_blocks``, the hash blocks starting in it
    hashed (the last of them read on past ``end``). The task of every range runs it, so the
    lines before a range come from many readers at once, none reading the whole input. (A
    range of JSONL is hashed by the task that parses it, ``iter_partition``: the block hash
    recorded is of the bytes parsed; a Parquet file's row groups by their scans.)"""
    block = hashing.HASH_BLOCK_BYTES
    first = -(-start // block)
    hash_from = first * block
    hashed = hash_blocks and hash_from < end  # a block starts in the range
    stop = max(end, min(size, -(-end // block) * block)) if hashed else end
    blocks, lines, pos = BlockHasher(), 0, start
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(start)
            while pos < stop and (data := f.read(min(SCAN_BYTES, stop - pos))):
                mv = memoryview(data)
                if count_lines and pos < end:
                    lines += data.count(b"\n", 0, end - pos)
                if hashed and pos + len(data) > hash_from:
                    blocks.update(mv[max(0, hash_from - pos):])
                pos += len(data)
    except FileNotFoundError:
        raise InputError(f"input file {path} does not exist (it was there when the run started)") from None
    except OSError as e:
        raise unreadable(path, e) from None
    if pos < stop:
        raise _shorter(path, pos, size)
    return RangeScan(lines, first, tuple(blocks.finish()))


def file_digest(path: str) -> tuple[str, int, str]:
    """(sha256, size, block hash) of a file in one read: what a sequential read records of
    an input, and the block hash that says the sha256 is of the bytes the partitions read
    (``ReadCheck``)."""
    try:
        sha, blocks = file_hashes(path, whole=True)
        return sha, os.stat(path).st_size, blocks
    except OSError as e:
        raise unreadable(path, e) from None


def file_state(path: str) -> tuple[int, ...]:
    """What a write to the file at ``path`` changes: size, mtime_ns, ctime_ns, inode, device
    (the same fields as ``identity.look``). Compared before and after a partitioned read."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise unreadable(path, e) from None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev


@dataclass(frozen=True)
class RangeRead:
    """What a partition's reader read of its byte range: the digests of the input's hash
    blocks its bytes lie in (``util.hashing``; the first being block ``first_block``),
    hashed from the very bytes it parsed, the rest of those blocks read around them; and
    whether its last byte was a newline (the range still ends on a line start)."""

    first_block: int
    digests: tuple[bytes, ...]
    ends_line: bool


_STATE_FIELDS = ("size", "mtime_ns", "ctime_ns", "inode", "device")


def changed_while_read(path: str, what: str) -> InputError:
    """The error of an input that changed while a partitioned run read it."""
    return InputError(f"input file {path} changed while this run read it ({what}): its workers read different "
                      f"versions of it, so no dataset was written. Run again once nothing writes to the file (or "
                      f"prepare a copy of it)")


class ReadCheck:
    """The reads of a partitioned run's byte ranges, held against each other and against the
    file: each range's reader hashes the blocks its bytes lie in (``RangeRead``), a block
    two readers hashed must have the same digest, each range must still end on a line start
    and hold the lines its scan counted, the whole-file read (its sha256) must have found
    the same blocks, and the file's ``file_state`` must be the one taken when the run
    started. Then the block hash (``combine_blocks`` of the read blocks, the value a
    sequential read records) and the sha256 recorded are of the bytes the dataset was
    made from; anything else fails the run (``changed_while_read``)."""

    def __init__(self, infos: list[SourceInfo], parts: list[Partition]):
        self.states = {si: file_state(infos[si].path) for si in sorted({p.source for p in parts if not p.whole})}
        self.blocks: dict[int, dict[int, bytes]] = {}
        self.lines_after: dict[int, int] = {}  # the lines read through the last range of each input so far

    def add(self, p: Partition, lines_before: int, lines: int, read: RangeRead | None, last: bool) -> None:
        """A range's read: ``lines_before`` (from the scans), the ``lines`` it read."""
        if read is None:
            return
        path, block = p.info.path, hashing.HASH_BLOCK_BYTES
        counted = self.lines_after.get(p.source, 0)
        if counted != lines_before:
            raise changed_while_read(path, f"its first {p.start:,} bytes held {lines_before:,} lines when scanned "
                                           f"and {counted:,} when read")
        if not last and not read.ends_line:
            raise changed_while_read(path, f"byte {p.end - 1:,} is no longer the end of a line")
        have = self.blocks.setdefault(p.source, {})
        for i, digest in enumerate(read.digests, read.first_block):
            if have.get(i, digest) != digest:
                raise changed_while_read(path, f"bytes {i * block:,} to {(i + 1) * block:,} read differently by "
                                               f"two workers")
        have.update(enumerate(read.digests, read.first_block))
        self.lines_after[p.source] = lines_before + lines

    def block_hash(self, source: int, info: SourceInfo, scanned: str | None, whole: str | None) -> str | None:
        """The block hash of input ``source``, its last partition read: from its ranges'
        reads (JSONL) or else ``scanned`` (Parquet's row groups); ``whole``: the block
        hash of the read that took its sha256 (None: not taken)."""
        now = file_state(info.path)
        if now != self.states.get(source, now):
            what = ", ".join(f for f, a, b in zip(_STATE_FIELDS, self.states[source], now) if a != b)
            raise changed_while_read(info.path, f"its {what} changed")
        have = self.blocks.get(source)
        found = scanned
        if have is not None:
            n = -(-info.bytes // hashing.HASH_BLOCK_BYTES)
            if sorted(have) != list(range(n)):
                raise changed_while_read(info.path, f"its reads covered {len(have):,} of its {n:,} hash blocks")
            found = combine_blocks([have[i] for i in range(n)])
        if whole is not None and found is not None and whole != found:
            raise changed_while_read(info.path, "the read that took its sha256 found other bytes than its ranges' "
                                                "readers")
        return found


class _Range:
    """Bytes ``[start, end)`` of a file, read like a stream, each byte read fed to
    ``blocks`` (a ``BlockHasher`` of the blocks from the one ``start`` lies in)."""

    def __init__(self, f, start: int, end: int, blocks: BlockHasher):
        f.seek(start)
        self._f, self._left, self._blocks, self.last = f, end - start, blocks, b""

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        data = self._f.read(self._left if n is None or n < 0 else min(n, self._left))
        self._left -= len(data)
        if data:
            self._blocks.update(data)
            self.last = data[-1:]
        elif self._left > 0:
            self._left = -self._left  # the file ended early: ``short`` says so
        return data

    @property
    def short(self) -> bool:
        return self._left < 0


def _read_hashed(f, start: int, stop: int, blocks: BlockHasher) -> int:
    """Read bytes ``[start, stop)`` of ``f`` into ``blocks``; the position reached."""
    f.seek(start)
    pos = start
    while pos < stop and (data := f.read(min(SCAN_BYTES, stop - pos))):
        blocks.update(data)
        pos += len(data)
    return pos


def _shorter(path: str, pos: int, size: int) -> InputError:
    return InputError(f"input file {path} is shorter than when the run started ({pos:,} bytes, was {size:,}); "
                      f"it changed while it was read: run again on a file nothing writes to")


def _range_records(info: SourceInfo, start: int, end: int, lines_before: int, max_record_bytes: int,
                   read: list | None) -> Iterator[tuple[RawRecord | None, int]]:
    """The records of bytes ``[start, end)`` of a plain JSONL file, hashed as read: the
    blocks they lie in (from the block ``start`` is in to the one ``end - 1`` is in, the
    bytes around the range read for them) end up in ``read`` as a ``RangeRead``."""
    block = hashing.HASH_BLOCK_BYTES
    first = start // block
    stop = min(info.bytes, max(end, -(-end // block) * block))
    blocks, body = BlockHasher(), start + (3 if start == 0 and info.encoding == "utf-8-sig" else 0)
    with open(info.path, "rb") as f:
        if _read_hashed(f, first * block, body, blocks) < body:  # the head of the first block (a byte order mark)
            raise _shorter(info.path, body, info.bytes)
        rng = _Range(f, body, end, blocks)
        reader = LineReader(rng, max_record_bytes)
        for index, item in reader:
            yield _record(info, lines_before + index, item, "line", max_record_bytes), end - start
        if rng.short or (pos := _read_hashed(f, end, stop, blocks)) < stop:  # the tail of the last block
            raise _shorter(info.path, end if rng.short else pos, info.bytes)
    if read is not None:
        read.append(RangeRead(first, tuple(blocks.finish()), rng.last == b"\n" or end <= body))
    yield None, reader.lines


def iter_partition(part: Partition, lines_before: int, max_record_bytes: int, read: list | None = None
                   ) -> Iterator[tuple[RawRecord | None, int]]:
    """(record, bytes of the partition read) for each record of ``part``, numbered from
    the start of its input, then ``(None, record numbers the partition used)`` (lines,
    blank ones too, or rows; for a whole input also left in ``part.info.records`` with its
    ``sha256`` and ``bytes``). ``lines_before``: the lines (rows) of the input before it.
    A byte range of JSONL is hashed as it is read: its ``RangeRead`` is appended to
    ``read`` (when given) once the range is read through."""
    if part.whole:
        yield from iter_records(part.info, max_record_bytes)
        yield None, part.info.records
        return
    info, start = part.info, part.start
    if part.groups is not None:
        first, stop, before = part.groups
        n = 0
        with _parquet(info, max_record_bytes) as reader:
            for row, item in reader.rows_of(range(first, stop), before):
                yield _record(info, row, item, "row", max_record_bytes), part.end - part.start
                n += 1
        yield None, n
        return
    try:
        yield from _range_records(info, start, part.end, lines_before, max_record_bytes, read)
    except FileNotFoundError:
        raise InputError(f"input file {info.path} does not exist (it was there when the run started)") from None
    except OSError as e:
        raise unreadable(info.path, e) from None
