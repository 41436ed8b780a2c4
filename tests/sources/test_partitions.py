"""Inputs cut into partitions: byte ranges of JSONL on line starts, numbered exactly as a
sequential read numbers them."""

import dataclasses
import gzip

import pytest

from sftdata.errors import InputError
from sftdata.sources import inspect_source, iter_records
from sftdata.sources.partitions import (
    ReadCheck,
    file_digest,
    iter_partition,
    plan_partitions,
    records_sha256,
    scan_range,
    splittable,
)
from sftdata.util import hashing

MAX = 1 << 20


def sequential(path):
    info = inspect_source(path)
    return [(r.record, r.where, r.raw, r.reject) for r, _ in iter_records(info, MAX)], info


def lines_before(info, parts):
    """The lines before each partition, from the scans of the ranges before it."""
    out, before = [], 0
    for p in parts:
        out.append(before)
        if not p.whole:
            before += scan_range(info.path, p.start, p.end, info.bytes).lines
    return out


def by_partitions(path, part_bytes):
    """The records of the partitions, their lines, and the input's sha256, size and block
    hash as a partitioned run records them (the ranges' own reads held together)."""
    info = inspect_source(path)
    parts = plan_partitions([info], part_bytes)
    check = ReadCheck([info], parts)
    sha, size, whole_blocks = file_digest(info.path)
    out, lines = [], 0
    for p, before in zip(parts, lines_before(info, parts)):
        read, n = [], 0
        for rec, pos in iter_partition(p, before, MAX, read):
            if rec is None:
                n = pos
            else:
                out.append((rec.record, rec.where, rec.raw, rec.reject))
        check.add(p, before, n, read[0] if read else None, p is parts[-1])
        lines += n
    blocks = check.block_hash(0, info, None if len(parts) > 1 else whole_blocks, whole_blocks)
    return out, parts, lines, sha, size, blocks


@pytest.mark.parametrize("part_bytes", [1, 7, 40, 1000, 10**6])
@pytest.mark.parametrize("text", [
    b'{"a": 1}\n\n{"b": 2}\n   \n{"c": 3}\n',
    b'{"a": 1}\n{"b": 2}',  # the last line has no newline
    b'\xef\xbb\xbf{"a": 1}\n{"b": "\xc3\xa9"}\n\n\n',  # a byte order mark; UTF-8 beyond ASCII
    b'\n\n\n{"a": 1}\n' + b'{"x": "' + b"y" * 3000 + b'"}\n{"z": 0}\n',
])
def test_partitions_read_the_records_of_a_sequential_read(tmp_path, part_bytes, text):
    path = tmp_path / "in.jsonl"
    path.write_bytes(text)
    want, info = sequential(path)
    got, parts, lines, sha, size, blocks = by_partitions(path, part_bytes)
    assert got == want and lines == info.records and (sha, size, blocks) == (info.sha256, info.bytes,
                                                                             info.block_sha256)
    starts = [p.start for p in parts]
    assert all(text[s - 1:s] == b"\n" for s in starts if s)  # every range starts at a line start
    assert [p.end for p in parts[:-1]] == starts[1:] and parts[-1].end == len(text) or len(parts) == 1


def test_a_line_longer_than_the_record_bound_is_rejected_in_a_range_too(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b'{"x": "' + b"y" * 5000 + b'"}\n{"z": 0}\n')
    info = inspect_source(path)
    parts = plan_partitions([info], 100)
    recs = [r for p, before in zip(parts, lines_before(info, parts)) for r, _ in iter_partition(p, before, 1000)
            if r is not None]
    assert [(r.record, r.where.rsplit(":", 1)[1], r.reject and r.reject[0]) for r in recs] == [
        (0, "line 1", None), (1, "line 2", "record_too_large"), (2, "line 3", None)]


def test_only_plain_local_jsonl_is_cut(tmp_path):
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b'{"a": 1}\n' * 100)
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n' * 100))
    array = tmp_path / "c.json"
    array.write_bytes(b"[" + b",".join([b'{"a": 1}'] * 100) + b"]")
    infos = [inspect_source(p) for p in (plain, packed, array)]
    assert [splittable(i) for i in infos] == [True, False, False]
    parts = plan_partitions(infos, 100)
    assert [p.source for p in parts].count(0) == 9 and [(p.source, p.whole) for p in parts[-2:]] == [(1, True),
                                                                                                    (2, True)]
    assert all(p.info.first_record == 0 for p in parts) and [p.index for p in parts] == list(range(len(parts)))


@pytest.mark.parametrize("block", [1, 5, 16, 1 << 20])
@pytest.mark.parametrize("part_bytes", [1, 7, 40, 10**6])
def test_the_scans_of_the_ranges_count_their_lines_and_hash_every_block_once(tmp_path, monkeypatch, block,
                                                                            part_bytes):
    """Each range's scan counts its newlines and hashes the blocks that start in it (reading
    on past its end to finish the last): together, the lines and the block hash a sequential
    read of the whole input gives, whatever the cut and the block size."""
    monkeypatch.setattr(hashing, "HASH_BLOCK_BYTES", block)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"b": 2}\n' + b'{"x": "' + b"y" * 3000 + b'"}\n{"z": 0}')
    info = inspect_source(path)
    read = sequential(path)[1]  # what a sequential read of the input records
    parts = [p for p in plan_partitions([info], part_bytes) if not p.whole] or \
        plan_partitions([info], part_bytes, shrink=(1, 1))
    scans = [scan_range(info.path, p.start if not p.whole else 0, p.end or info.bytes, info.bytes) for p in parts]
    assert sum(s.lines for s in scans) == 4 and read.records == 5  # the last line has no newline
    firsts = [s.first_block for s in scans if s.digests]
    digests = [d for s in scans for d in s.digests]
    assert firsts == sorted(firsts) and len(digests) == -(-info.bytes // block)  # each block once, in order
    assert hashing.combine_blocks(digests) == read.block_sha256 == hashing.file_hashes(path)[1]
    assert file_digest(info.path) == (read.sha256, read.bytes, read.block_sha256)
    if part_bytes == 7:
        assert [s.lines for s in scans] == [1, 2, 1, 0]  # lines before the cuts: 1, 3, 4
    path.write_bytes(b"short")  # changed after the run planned it
    with pytest.raises(InputError, match=rf"input file {path} is shorter than when the run started \(5 bytes, was "
                                         rf"{info.bytes:,}\); it changed while it was read"):
        scan_range(info.path, 0, info.bytes, info.bytes)
    with pytest.raises(InputError, match=f"input file {tmp_path / 'gone.jsonl'} does not exist"):
        scan_range(str(tmp_path / "gone.jsonl"), 0, 10, 10)


def test_the_whole_file_sha256_is_recorded_where_cheap_or_asked(tmp_path, monkeypatch):
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b'{"a": 1}\n' * 100)
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n' * 100))
    a, b = inspect_source(plain), inspect_source(packed)
    assert records_sha256(a) and records_sha256(b)
    monkeypatch.setattr("sftdata.sources.partitions.WHOLE_SHA256_BYTES", 100)  # a.jsonl is "large" now
    assert not records_sha256(a) and records_sha256(a, asked=True)
    assert records_sha256(b)  # read whole by one reader anyway: hashed on the way


def test_guided_ranges_shrink_towards_the_end_and_read_the_records_of_a_sequential_read(tmp_path):
    lines = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * (i * 37 % 90)) for i in range(900)]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"\n".join(lines) + b"\n")
    b.write_bytes(b"\n".join(lines[:300]) + b"\n")
    infos = [inspect_source(p) for p in (a, b)]
    parts = plan_partitions(infos, 4000, shrink=(4, 500))
    total = a.stat().st_size + b.stat().st_size
    sizes = [p.end - p.start for p in parts]
    assert [p.source for p in parts].count(1) > 1 and all(not p.whole for p in parts)
    assert max(sizes) <= 4000 + 200 and sizes[0] > 3900  # a line past the size at most
    done = 0
    for p, size in zip(parts, sizes):  # each range: a quarter of what is left of both files, 500 bytes or more
        want = min(4000, max(500, (total - done) // 4))
        end = infos[p.source].bytes
        assert want <= size <= want + 200 or p.end == end, (p, size, want)
        done += size
    assert sizes[-3] < 600 and sizes.index(max(sizes)) < len(sizes) // 3
    for info in infos:  # per input: the records of a sequential read, numbered from its start
        own = [p for p in parts if p.source == infos.index(info)]
        got = [(r.record, r.where, r.raw) for p, before in zip(own, lines_before(info, own))
               for r, _ in iter_partition(p, before, MAX) if r is not None]
        want_records, _ = sequential(info.path)
        assert got == [(r, w, raw) for r, w, raw, _ in want_records]
    whole = plan_partitions([inspect_source(b)], 10**6, shrink=(4, 10**6))  # within the first range's size
    assert len(whole) == 1 and whole[0].whole


def test_cutting_reads_a_few_lines_per_cut_and_follows_a_long_line_to_its_end(tmp_path, monkeypatch):
    """The coordinator finds each cut's line start with a probe of PROBE_BYTES, doubled
    while no newline shows: what it reads grows with the cuts, not with the input."""
    import builtins

    from sftdata.sources import partitions

    path = tmp_path / "in.jsonl"
    short = b'{"messages": []}\n' * 20_000  # 340,000 bytes of 17-byte lines
    path.write_bytes(short + b'"' + b"x" * 100_000 + b'"\n' + short)
    read = []
    real_open = builtins.open

    class Counted:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def seek(self, pos):
            return self.f.seek(pos)

        def read(self, n):
            read.append(n)
            return self.f.read(n)

    info = inspect_source(path)
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: Counted(real_open(p, *a, **k)) if str(p) == str(path)
                        else real_open(p, *a, **k))
    parts = plan_partitions([info], 100_000)
    monkeypatch.undo()
    assert [(p.start, p.end) for p in parts] == [(0, 100_011), (100_011, 200_005), (200_005, 300_016),
                                                 (300_016, 440_003), (440_003, 500_013), (500_013, 600_007),
                                                 (600_007, 700_001), (700_001, 780_003)]
    probe = partitions.PROBE_BYTES  # the cut at 400,000 falls in the long line: a probe, then twice as much
    assert read == [probe, probe, probe, probe, 2 * probe, probe, probe, probe]


@pytest.mark.parametrize("block", [1, 5, 16, 1 << 20])
@pytest.mark.parametrize("part_bytes", [1, 7, 40, 10**6])
def test_the_ranges_readers_hash_the_bytes_they_parse_into_the_recorded_block_hash(tmp_path, monkeypatch, block,
                                                                                  part_bytes):
    """Each range's reader hashes the blocks its bytes lie in, from the bytes it parses (the
    rest of those blocks read around them): held together, the block hash a sequential
    read records, whatever the cut and the block size."""
    monkeypatch.setattr(hashing, "HASH_BLOCK_BYTES", block)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"b": 2}\n' + b'{"x": "' + b"y" * 3000 + b'"}\n{"z": 0}')
    want, info = sequential(path)
    got, parts, lines, sha, size, blocks = by_partitions(path, part_bytes)
    assert got == want and blocks == info.block_sha256 == hashing.file_hashes(path)[1] and lines == 5


def test_reads_that_disagree_fail_the_run_naming_the_input(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": 3}\n')
    info = inspect_source(path)
    parts = plan_partitions([info], 9)
    assert [(p.start, p.end) for p in parts] == [(0, 9), (9, 18), (18, 27)]
    reads = []
    for p in parts:
        read = []
        assert list(iter_partition(p, 0, MAX, read))[-1] == (None, 1)
        reads += read
    fail = rf"^input file {path} changed while this run read it \({{}}\): its workers read different versions of it"
    check = ReadCheck([info], parts)
    check.add(parts[0], 0, 1, reads[0], False)
    with pytest.raises(InputError, match=fail.format(r"its first 9 bytes held 2 lines when scanned and 1 when read")):
        check.add(parts[1], 2, 1, reads[1], False)
    with pytest.raises(InputError, match=fail.format("byte 17 is no longer the end of a line")):
        check.add(parts[1], 1, 1, dataclasses.replace(reads[1], ends_line=False), False)
    with pytest.raises(InputError, match=fail.format("bytes 0 to 4,194,304 read differently by two workers")):
        check.add(parts[1], 1, 1, dataclasses.replace(reads[1], digests=(b"x" * 32,)), False)
    check.add(parts[1], 1, 1, reads[1], False)
    check.add(parts[2], 2, 1, reads[2], True)
    assert check.block_hash(0, info, None, hashing.file_hashes(path)[1]) == sequential(path)[1].block_sha256
    with pytest.raises(InputError, match=fail.format("the read that took its sha256 found other bytes than its "
                                                     "ranges' readers")):
        check.block_hash(0, info, None, "0" * 64)
