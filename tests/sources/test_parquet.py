"""Parquet inputs: the columns read, nulls, row numbers, the record bound for cells and
pages, and the errors (no usable column, a damaged file, pyarrow missing)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import string
import subprocess
import sys
import types

import pytest
from typer.testing import CliRunner

import sftdata.sources.parquet as pqsrc
from sftdata.cli import app
from sftdata.errors import InputError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.sources import inspect_source
from sftdata.sources.parquet import BadValue, record_columns, row_record
from sftdata.sources.parquet_pages import largest_page
from sftdata.store import open_dataset
from tests.helpers.data import chat, write_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
runner = CliRunner()
RECORDS = [chat(f"question {i}", f"answer {i}") for i in range(30)]


def dataset_bytes(path) -> dict:
    """Every file of a dataset but its metadata (which names the inputs)."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != "dataset_metadata.json"}


def rejects(ds) -> list[dict]:
    return [json.loads(x) for x in (ds / "rejects.jsonl").read_text().splitlines()]


def test_a_messages_column_of_structs_is_read_like_jsonl(tmp_path):
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "a.parquet", row_group_size=7)
    src = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    s = prepare([tmp_path / "a.parquet"], tmp_path / "p", PrepareOptions(workers=1))
    prepare([src], tmp_path / "j", PrepareOptions(workers=1))
    assert s.episodes == {"train": 30} and s.rejected == {}
    assert dataset_bytes(tmp_path / "p") == dataset_bytes(tmp_path / "j")
    meta = open_dataset(tmp_path / "p").metadata["sources"]
    assert [(m["container"], m["records"], m["first_record"], m["compressed"]) for m in meta] == [
        ("parquet", 30, 0, False)]
    assert inspect_source(tmp_path / "a.parquet").container == "parquet"


def test_json_text_columns_and_a_single_record_column(tmp_path):
    pq.write_table(pa.table({"id": list(range(30)), "messages": [json.dumps(r["messages"]) for r in RECORDS]}),
                   tmp_path / "text.parquet")
    pq.write_table(pa.table({"record": [json.dumps(r) for r in RECORDS]}), tmp_path / "whole.parquet")
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "ref.parquet")
    for name in ("text", "whole", "ref"):
        prepare([tmp_path / f"{name}.parquet"], tmp_path / name, PrepareOptions(workers=1))
    assert dataset_bytes(tmp_path / "text") == dataset_bytes(tmp_path / "ref") == dataset_bytes(tmp_path / "whole")


def test_record_columns_choose_what_the_parsers_read():
    schema = pa.schema([("id", pa.int64()), ("messages", pa.list_(pa.struct([("role", pa.string())]))),
                        ("tools", pa.string()), ("system", pa.string()), ("image", pa.binary())])
    assert record_columns(schema, "f") == ([("messages", "value"), ("system", "string"), ("tools", "string")], False)
    both = pa.schema([("conversations", pa.string()), ("messages", pa.string())])
    assert record_columns(both, "f") == ([("messages", "json")], False)
    assert record_columns(pa.schema([("text", pa.large_string())]), "f") == ([("text", "json")], True)


def test_row_records_leave_nulls_out_of_structs_and_keep_text_as_given():
    cols = [("messages", "value"), ("system", "string"), ("tools", "json")]
    msgs = [{"role": "user", "content": "hi", "name": None}, {"role": "assistant", "content": None}]
    assert row_record([msgs, "Be brief.", None], cols, False) == (
        b'{"messages":[{"role":"user","content":"hi"},{"role":"assistant"}],"system":"Be brief."}')
    assert row_record([None, None, '[{"name": "f"}]'], cols, False) == b'{"tools":[{"name": "f"}]}'
    assert row_record([[{"content": b"\xff"}], None, None], cols, False) == BadValue(
        "invalid_utf8", "column 'messages' holds bytes that are not UTF-8 text (byte 0)")
    assert row_record([None], [("rec", "json")], True) == b"null"


def test_rows_are_numbered_and_bad_rows_say_file_and_row(tmp_path):
    msgs = [r["messages"] for r in RECORDS[:5]]
    msgs[1] = [{"role": "user", "content": "no answer"}]
    msgs[3] = None
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"messages": msgs}), path, row_group_size=2)
    first = write_jsonl(tmp_path / "first.jsonl", RECORDS[:2])
    s = prepare([first, path], tmp_path / "ds", PrepareOptions(workers=1))
    assert s.rejected == {"no_assistant_turn": 1, "no_messages": 1}
    assert open_dataset(tmp_path / "ds").split("train").sources.tolist() == [0, 1, 2, 4, 6]
    assert [(r["record"], r["source"], r["where"], r["reason"]) for r in rejects(tmp_path / "ds")] == [
        (3, str(path), f"{path}:row 1", "no_assistant_turn"), (5, str(path), f"{path}:row 3", "no_messages")]


def test_a_cell_beyond_the_record_bound_is_rejected_with_its_row(tmp_path):
    msgs = [r["messages"] for r in RECORDS[:4]]
    msgs[2] = [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "a"}]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"messages": msgs}), path)
    s = prepare([path], tmp_path / "ds", PrepareOptions(workers=1, max_record_bytes=4096))
    assert s.rejected == {"record_too_large": 1} and s.episodes == {"train": 3}
    (rej,) = rejects(tmp_path / "ds")
    size = len(b'{"messages":[{"role":"user","content":"' + b"x" * 5000 + b'"},{"role":"assistant","content":"a"}]}')
    assert (rej["where"], rej["message"]) == (f"{path}:row 2", f"the record is {size:,} bytes, longer than "
                                              f"--max-record-bytes (4,096); it was read past, never held whole. "
                                              f"Shorten or split it, or raise --max-record-bytes")


def test_a_page_that_would_expand_past_the_bound_is_refused_before_it_is_read(tmp_path):
    msgs = [r["messages"] for r in RECORDS[:3]]
    msgs[1] = [{"role": "user", "content": "y" * (20 << 20)}, {"role": "assistant", "content": "a"}]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"messages": msgs}), path, compression="zstd", use_dictionary=False)
    assert path.stat().st_size < 100_000  # a 20 MB cell, compressed to almost nothing
    with pytest.raises(InputError, match=r"^" + str(path) + r": row group 0, column messages\.list\.element\.content, "
                       r"holds a page of 20,97\d,\d{3} bytes uncompressed; reading it would hold it whole, past twice "
                       r"--max-record-bytes \(1,048,576\)\. Rewrite the file with smaller pages \(pyarrow: "
                       r"data_page_size\) or raise --max-record-bytes$"):
        prepare([path], tmp_path / "ds", PrepareOptions(workers=1, max_record_bytes=1 << 20))
    s = prepare([path], tmp_path / "ds", PrepareOptions(workers=1, max_record_bytes=16 << 20))
    assert s.rejected == {"record_too_large": 1}  # read (the page fits twice the bound), then rejected


def test_page_headers_are_walked_to_the_end_of_each_column_chunk(tmp_path):
    msgs = [[{"role": "user", "content": "q" * (i % 50)}, {"role": "assistant", "content": "a" * 100}]
            for i in range(5000)]
    msgs[777][0]["content"] = "x" * (3 << 20)
    path = tmp_path / "pages.parquet"
    for version in ("1.0", "2.0"):
        pq.write_table(pa.table({"messages": msgs}), path, data_page_size=1 << 14, row_group_size=2000,
                       data_page_version=version)
        meta = pq.ParquetFile(path).metadata
        with open(path, "rb") as f:
            def read_at(offset, n):
                f.seek(offset)
                return f.read(n)

            found = {}
            for g in range(meta.num_row_groups):
                for c in range(meta.num_columns):
                    col = meta.row_group(g).column(c)
                    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
                    found[g, col.path_in_schema] = largest_page(read_at, start, col.total_compressed_size)
        big = found[0, "messages.list.element.content"]
        assert 3 << 20 < big < (3 << 20) + (1 << 16)
        assert all(v < 1 << 16 for k, v in found.items() if k != (0, "messages.list.element.content"))


def test_a_parquet_file_without_a_usable_column_is_one_error(tmp_path):
    path = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"prompt": ["q"], "score": [0.5], "tags": [["a"]]}), path)
    r = runner.invoke(app, ["prepare-chat", str(path), "-o", str(tmp_path / "ds"), "-q"])
    assert (r.exit_code, r.output) == (1, f"error: {path} has no column sftdata can read: a Parquet input needs a "
                                          f"'messages' or 'conversations' column (a list of message structs, or JSON "
                                          f"text), or a single text column holding each record as JSON; its "
                                          f"columns: prompt (string), score (double), tags (list<element: string>)\n")
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("data", [b"PAR1" + b"\x15\x04" * 100 + b"PAR1", b"PAR1" + b"\x00" * 64])
def test_a_damaged_parquet_file_is_one_line(tmp_path, data):
    path = tmp_path / "train.jsonl"  # the name does not matter: the bytes say Parquet
    path.write_bytes(data)
    r = runner.invoke(app, ["prepare-chat", str(path), "-o", str(tmp_path / "ds"), "-q"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.startswith(f"error: {path} is not a readable Parquet file (")
    assert r.output.endswith("); re-create or re-download it\n") and r.output.count("\n") == 1


def test_a_cut_parquet_file_is_refused_before_any_input_is_read(tmp_path):
    good = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    path = tmp_path / "cut.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(InputError, match=rf"^{path} is not a readable Parquet file \(.+\); re-create or re-download it$"):
        prepare([good, path], tmp_path / "ds", PrepareOptions(workers=1))


def test_without_pyarrow_a_parquet_input_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path)
    for name in ("pyarrow._parquet", "pyarrow.parquet"):  # importing either raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    r = runner.invoke(app, ["prepare-chat", str(path), "-o", str(tmp_path / "ds"), "-q"])
    assert (r.exit_code, r.output) == (1, f"error: {path} is a Parquet file; reading it needs pyarrow: pip install "
                                          f"'sftdata[parquet]' (or pip install pyarrow)\n")


def test_parquet_on_stdin_is_refused(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path)
    r = runner.invoke(app, ["prepare-chat", "-", "-o", str(tmp_path / "ds"), "-q"], input=path.read_bytes())
    assert (r.exit_code, r.output) == (1, "error: <stdin> holds a Parquet file, which is read in place (it needs "
                                          "random access), not as a stream: save it to a file and give its path\n")


def test_prepare_tool_reads_tool_columns(tmp_path):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {
                                                   "city": {"type": "string"}}, "required": ["city"]}}}]
    rec = {"messages": [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
                        {"role": "assistant", "content": "18C in Paris."}],
           "tools": tools}
    rows = [rec, {**rec, "messages": rec["messages"][:1] + [{"role": "assistant", "content": "Sunny."}]}]
    write_jsonl(tmp_path / "t.jsonl", rows)
    table = pa.table({"messages": [r["messages"] for r in rows], "tools": [json.dumps(r["tools"]) for r in rows]})
    pq.write_table(table, tmp_path / "t.parquet")
    a = prepare([tmp_path / "t.jsonl"], tmp_path / "a", PrepareOptions(mode="tool", workers=1))
    b = prepare([tmp_path / "t.parquet"], tmp_path / "b", PrepareOptions(mode="tool", workers=1))
    assert a.episodes == b.episodes == {"train": 2} and a.rejected == b.rejected == {}
    assert dataset_bytes(tmp_path / "a") == dataset_bytes(tmp_path / "b")


class FakeLibc:
    """Records the allocator calls the reader makes."""

    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad):
        self.calls.append(("malloc_trim", pad))
        return 1


def test_the_reader_fixes_the_mmap_threshold_once_and_returns_free_pages_per_row_groups(tmp_path, monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(pqsrc, "_glibc", lambda: fake)
    monkeypatch.setattr(pqsrc, "_TUNED", False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "a.parquet", row_group_size=7)  # 5 row groups
    size = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(0).total_byte_size
    monkeypatch.setattr(pqsrc, "TRIM_BYTES", 2 * size)  # about every second row group
    for _ in range(2):
        rows = [row for row, _ in pqsrc.ParquetReader(str(tmp_path / "a.parquet"), "a.parquet", 1 << 20)]
        assert rows == list(range(30))
    trims = fake.calls.count(("malloc_trim", 0))
    assert fake.calls[0] == ("mallopt", -3, 256 << 10) and fake.calls.count(fake.calls[0]) == 1  # once a process
    assert 2 * 2 <= trims <= 2 * 3


def test_a_users_mmap_threshold_is_left_alone(tmp_path, monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(pqsrc, "_glibc", lambda: fake)
    monkeypatch.setattr(pqsrc, "_TUNED", False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "a.parquet")
    assert len(list(pqsrc.ParquetReader(str(tmp_path / "a.parquet"), "a.parquet", 1 << 20))) == 30
    assert not [c for c in fake.calls if c[0] == "mallopt"]


def test_only_pyarrows_reader_is_imported_not_pyarrow_parquet_and_its_filesystems(tmp_path):
    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "a.parquet")
    code = ("import sys; from sftdata.sources.parquet import ParquetReader; "
            f"n = len(list(ParquetReader({str(tmp_path / 'a.parquet')!r}, 'a.parquet', 1 << 20))); "
            "print(n, sorted(m for m in ('pyarrow.parquet', 'pyarrow.fs', 'pyarrow._s3fs') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "30 []\n"


class ReaderOfAnotherRelease:
    """A pyarrow reader class whose ``open`` takes other arguments."""

    def open(self, source):
        raise AssertionError("not called: open_file passes keywords this class does not take")


def test_a_pyarrow_whose_reader_class_differs_is_read_through_parquet_file(tmp_path, monkeypatch):
    rows = [{**r, "id": i, "system": f"system {i}" if i % 3 else None} for i, r in enumerate(RECORDS)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=7)
    direct = pqsrc.ParquetReader(str(tmp_path / "a.parquet"), "a.parquet", 1 << 20)
    assert direct._leaves == [0, 1, 3]  # messages' role and content, system; never id
    monkeypatch.setattr(pqsrc, "pyarrow_parquet", lambda name: types.SimpleNamespace(ParquetReader=ReaderOfAnotherRelease))
    wrapped = pqsrc.ParquetReader(str(tmp_path / "a.parquet"), "a.parquet", 1 << 20)
    assert isinstance(wrapped._file, pq.ParquetFile) and wrapped._leaves is None
    records = list(direct)
    assert records == list(wrapped) and len(records) == 30
    assert records[1] == (1, json.dumps({"messages": RECORDS[1]["messages"], "system": "system 1"},
                                        separators=(",", ":")).encode())


def test_a_parquet_sources_sha256_is_of_its_bytes_read_a_buffer_at_a_time(tmp_path):
    from sftdata.util.hashing import file_hashes

    pq.write_table(pa.Table.from_pylist(RECORDS), tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    # many reads, the last one short
    assert len(data) % 1000 and file_hashes(tmp_path / "a.parquet", read_bytes=1000)[0] == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_hashes(tmp_path / "empty")[0] == hashlib.sha256(b"").hexdigest()
    s = prepare([tmp_path / "a.parquet"], tmp_path / "ds", PrepareOptions(workers=1))
    assert s.episodes == {"train": 30}
    assert open_dataset(tmp_path / "ds").metadata["sources"][0]["sha256"] == hashlib.sha256(data).hexdigest()


def test_arrows_memory_while_reading_is_about_a_batch_and_a_page_not_a_column_chunk(tmp_path):
    # one row group whose text column chunk is ~2.9 MB in pages of 32 KiB: read page by page,
    # Arrow's pool peaks near a batch of rows and a page; a reader that buffers the whole
    # column chunk (pre_buffer, or buffer_size=0) peaks above the chunk: 3.3 MB
    rng = random.Random(0)
    rows = [{"messages": [{"role": "user", "content": "".join(rng.choices(string.ascii_letters, k=4000))},
                          {"role": "assistant", "content": "a"}]} for _ in range(600)]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=600, data_page_size=32 << 10, write_batch_size=4,
                   use_dictionary=False)
    assert pq.ParquetFile(path).metadata.row_group(0).column(1).total_compressed_size > 2_500_000
    code = ("from sftdata.sources.parquet import ParquetReader; "  # pyarrow imported by the reader, as in prepare
            f"n = sum(1 for _ in ParquetReader({str(path)!r}, 'a.parquet', 1 << 20)); import pyarrow as pa; "
            "print(n, pa.default_memory_pool().backend_name, pa.default_memory_pool().max_memory())")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    n, pool, peak = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env=env).stdout.split()
    assert (n, pool) == ("600", "system") and int(peak) < 1 << 20


def files_of(path) -> dict:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_row_groups_are_partitions_read_as_a_sequential_read_reads_them(tmp_path):
    """A local Parquet file is cut into whole row groups (the footer's offsets); each
    partition's rows are numbered from the rows before it, its bytes cover the file, and
    the scans of its ranges give the block hash a sequential read records."""
    from sftdata.sources import iter_records
    from sftdata.sources.partitions import iter_partition, plan_partitions, scan_range
    from sftdata.util.hashing import combine_blocks, file_hashes

    bad = ["not json"] * 1 + [None]
    rows = [json.dumps(r) for r in RECORDS[:12]] + bad + [json.dumps(r) for r in RECORDS[12:]]
    pq.write_table(pa.table({"record": rows}), tmp_path / "a.parquet", row_group_size=5)
    info = inspect_source(tmp_path / "a.parquet")
    parts = plan_partitions([info], 1)  # every row group a partition
    assert [p.groups for p in parts] == [(g, g + 1, 5 * g) for g in range(7)]
    assert parts[0].start == 0 and parts[-1].end == info.bytes
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    seq = [(r.record, r.where, r.raw, r.reject) for r, _ in iter_records(inspect_source(tmp_path / "a.parquet"))]
    got, used = [], 0
    for p in parts:
        for rec, pos in iter_partition(p, p.groups[2], 1 << 20):
            if rec is None:
                used += pos
            else:
                got.append((rec.record, rec.where, rec.raw, rec.reject))
    assert got == seq and used == 32 and got[13][1] == f"{tmp_path / 'a.parquet'}:row 13"
    digests = [d for p in parts for d in scan_range(str(tmp_path / "a.parquet"), p.start, p.end, info.bytes,
                                                     count_lines=False).digests]
    assert combine_blocks(digests) == file_hashes(tmp_path / "a.parquet")[1]
    two = plan_partitions([info], parts[2].start - parts[1].start + 1)  # a little over a row group: two each
    assert two[0].groups == (0, 2, 0) and [p.index for p in two] == list(range(len(two)))
    assert [p.groups[1] for p in two[:-1]] == [p.groups[0] for p in two[1:]] and two[-1].groups[1] == 7


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_reading_row_groups_write_the_one_process_dataset(tmp_path, monkeypatch, workers):
    import sftdata.prepare.pool as pool

    monkeypatch.setattr(pool, "MAX_PART_BYTES", 1)  # a partition per row group
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 1)
    rows = [json.dumps(r) for r in RECORDS] + ["{oops"] + [json.dumps(r) for r in RECORDS[:4]]
    pq.write_table(pa.table({"record": rows}), tmp_path / "a.parquet", row_group_size=4)
    src = write_jsonl(tmp_path / "b.jsonl", RECORDS[3:9])
    opts = dict(val_split=0.2, shard_tokens=300, dedup="exact")
    one = prepare([tmp_path / "a.parquet", src], tmp_path / "one", PrepareOptions(workers=1, **opts))
    many = prepare([tmp_path / "a.parquet", src], tmp_path / "many", PrepareOptions(workers=workers, **opts))
    assert files_of(tmp_path / "one") == files_of(tmp_path / "many")
    assert one.rejected == many.rejected == {"duplicate": 10, "invalid_json": 1}
