"""Inputs cut into partitions: byte ranges of JSONL on line starts, numbered exactly as a
sequential read numbers them."""

import gzip

import pytest

from sftdata.sources import inspect_source, iter_records
from sftdata.sources.partitions import file_digest, iter_partition, line_counts, plan_partitions, splittable

MAX = 1 << 20


def sequential(path):
    info = inspect_source(path)
    return [(r.record, r.where, r.raw, r.reject) for r, _ in iter_records(info, MAX)], info


def by_partitions(path, part_bytes):
    info = inspect_source(path)
    parts = plan_partitions([info], part_bytes)
    cuts = [p.start for p in parts if p.start]
    counts = line_counts(info.path, cuts)
    sha, size = file_digest(info.path)
    out, lines = [], 0
    for p in parts:
        before = counts[cuts.index(p.start)] if p.start else 0
        for rec, pos in iter_partition(p, before, MAX):
            if rec is None:
                lines += pos
            else:
                out.append((rec.record, rec.where, rec.raw, rec.reject))
    return out, parts, lines, sha, size


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
    got, parts, lines, sha, size = by_partitions(path, part_bytes)
    assert got == want and lines == info.records and (sha, size) == (info.sha256, info.bytes)
    starts = [p.start for p in parts]
    assert all(text[s - 1:s] == b"\n" for s in starts if s)  # every range starts at a line start
    assert [p.end for p in parts[:-1]] == starts[1:] and parts[-1].end == len(text) or len(parts) == 1


def test_a_line_longer_than_the_record_bound_is_rejected_in_a_range_too(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b'{"x": "' + b"y" * 5000 + b'"}\n{"z": 0}\n')
    info = inspect_source(path)
    parts = plan_partitions([info], 100)
    counts = line_counts(info.path, [p.start for p in parts if p.start])
    recs = [r for p in parts for r, _ in iter_partition(p, counts[0] if p.start else 0, 1000) if r is not None]
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
