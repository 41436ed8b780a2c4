"""What INPUT arguments can name (files, folders, globs, stdin, URLs), the record bound
on JSONL lines and JSON array items, and one conversation given every way making the same
dataset byte for byte."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import sys

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import InputError, UsageError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.sources import Input, expand_inputs, inspect_source, iter_records, record_where, select_inputs
from sftdata.store import open_dataset
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()
RECORDS = [chat(f"question {i} — ✓", f"answer {i}", f"and {i}?", "yes") for i in range(12)]
RECORDS += [chat("Who are you?", "A helper.", system="Be brief."),
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]
JSONL = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS).encode()


def dataset_bytes(path) -> dict:
    """Every file of a dataset but its metadata (which names the inputs)."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != "dataset_metadata.json"}


def run(tmp_path, *args, input=None):
    r = runner.invoke(app, ["prepare-chat", *map(str, args), "-j", "1", "-q"], input=input)
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def rejects(ds) -> list[dict]:
    return [json.loads(x) for x in (ds / "rejects.jsonl").read_text().splitlines()]


# -- one conversation, every way of giving it: the same dataset ---------------------------------
def test_every_way_of_giving_the_records_makes_the_same_dataset(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("fsspec")
    (tmp_path / "in").mkdir()
    jsonl = tmp_path / "in" / "all.jsonl"
    jsonl.write_bytes(JSONL)
    (tmp_path / "all.json").write_text(json.dumps(RECORDS, indent=2, ensure_ascii=False))
    openai = [r for r in RECORDS if "messages" in r]  # one Parquet column per format
    pq.write_table(pa.table({"messages": [r["messages"] for r in openai]}), tmp_path / "all.parquet")
    pq.write_table(pa.table({"conversations": [RECORDS[-1]["conversations"]]}), tmp_path / "last.parquet")
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "a.jsonl.gz").write_bytes(gzip.compress(JSONL[:JSONL.index(b"\n", 500) + 1]))
    (tmp_path / "gz" / "b.jsonl.xz").write_bytes(lzma.compress(JSONL[JSONL.index(b"\n", 500) + 1:]))
    ways = {
        "jsonl": [jsonl],
        "json": [tmp_path / "all.json"],
        "parquet": [tmp_path / "all.parquet", tmp_path / "last.parquet"],
        "url": [f"file://{jsonl}"],
        "parquet_url": [f"file://{tmp_path / 'all.parquet'}", f"file://{tmp_path / 'last.parquet'}"],
        "folder": [tmp_path / "in"],
        "compressed_folder": [tmp_path / "gz"],
        "glob": [str(tmp_path / "g*" / "*.jsonl.*")],
    }
    for name, inputs in ways.items():
        assert run(tmp_path, *inputs, "-o", tmp_path / name, "--val-split", "0.25") == (0, ""), name
    assert run(tmp_path, "-", "-o", tmp_path / "stdin", "--val-split", "0.25", input=JSONL) == (0, "")
    want = dataset_bytes(tmp_path / "jsonl")
    assert len(want) == 11  # tokenizer state, serving.json, rejects, 2 splits x 4 files
    for name in [*ways, "stdin"]:
        assert dataset_bytes(tmp_path / name) == want, name
    meta = open_dataset(tmp_path / "stdin").metadata["sources"]
    assert [(m["path"], m["bytes"], m["records"]) for m in meta] == [("<stdin>", len(JSONL), len(RECORDS))]
    assert meta[0]["sha256"] == open_dataset(tmp_path / "jsonl").metadata["sources"][0]["sha256"]


# -- folders and globs ---------------------------------------------------------------------------
def test_a_folder_gives_its_input_files_sorted_and_skips_the_rest(tmp_path):
    root = tmp_path / "data"
    files = ["b.jsonl", "a/z.json", "a/y.parquet", "c.ndjson.gz", "d.JSONL.ZST", "notes.md", "x.csv", ".hidden.jsonl",
             ".cache/e.jsonl", "out/dataset_metadata.json", "out/train/rejects.jsonl", "run.rejects.jsonl",
             "run.rejects-2.jsonl", "sub/deeper/f.jsonl.bz2", "aa.jsonl"]
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("{}\n")
    got = [(i.name, i.kind) for i in expand_inputs([root])]
    assert got == [(str(root / p), "file") for p in ["a/y.parquet", "a/z.json", "aa.jsonl", "b.jsonl", "c.ndjson.gz",
                                                      "d.JSONL.ZST", "sub/deeper/f.jsonl.bz2"]]


def test_select_inputs_is_a_pure_rule_over_a_listing():
    assert select_inputs(["b.jsonl", "ds/dataset_metadata.json", "ds/x.jsonl", "ds2/x.jsonl", ".git/a.jsonl",
                          "a/.b/c.json", "my.rejects.jsonl", "myrejects.jsonl", "t.parquet.gz"]) == [
        "b.jsonl", "ds2/x.jsonl", "myrejects.jsonl", "t.parquet.gz"]


def test_a_folder_without_input_files_says_what_it_holds(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("a.txt", "b.csv", ".x.jsonl"):
        (tmp_path / "d" / name).write_text("x")
    assert run(tmp_path, tmp_path / "d", "-o", tmp_path / "ds") == (
        1, f"error: folder {tmp_path / 'd'} holds no input file (.jsonl, .ndjson, .json or .parquet, optionally "
           f".gz/.bz2/.xz/.zst); it holds: a.txt, b.csv\n")


def test_a_dataset_given_as_input_is_refused(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", RECORDS)
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    assert run(tmp_path, tmp_path / "ds", "-o", tmp_path / "ds2") == (
        1, f"error: {tmp_path / 'ds'} is an sftdata dataset, not a folder of inputs; give the files of conversations "
           f"it was prepared from\n")


def test_a_dataset_inside_the_input_folder_is_not_read(tmp_path):
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", RECORDS)
    assert run(tmp_path, tmp_path / "in", "-o", tmp_path / "in" / "ds") == (0, "")
    assert run(tmp_path, tmp_path / "in", "-o", tmp_path / "ds2") == (0, "")  # in/ds and its rejects.jsonl: skipped
    assert dataset_bytes(tmp_path / "in" / "ds") == dataset_bytes(tmp_path / "ds2")


def test_globs_expand_sorted_and_a_glob_matching_nothing_is_an_error(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.json", "sub/d.jsonl"):
        write_jsonl((tmp_path / name).parent.mkdir(exist_ok=True) or tmp_path / name, RECORDS[:1])
    assert [i.name for i in expand_inputs([str(tmp_path / "*.jsonl")])] == [str(tmp_path / "a.jsonl"),
                                                                          str(tmp_path / "b.jsonl")]
    assert [i.name for i in expand_inputs([str(tmp_path / "**" / "*.jsonl")])] == [
        str(tmp_path / p) for p in ("a.jsonl", "b.jsonl", "sub/d.jsonl")]
    assert run(tmp_path, tmp_path / "*.parquet", "-o", tmp_path / "ds") == (
        1, f"error: no file matches {tmp_path / '*.parquet'} (a pattern: * ? and [...] match file names, ** "
           f"folders)\n")
    literal = write_jsonl(tmp_path / "x[1].jsonl", RECORDS[:1])  # an existing name is not a pattern
    assert [i.name for i in expand_inputs([literal])] == [str(literal)]


def test_a_missing_input_file_is_named(tmp_path):
    assert run(tmp_path, tmp_path / "nope.jsonl", "-o", tmp_path / "ds") == (
        1, f"error: input file {tmp_path / 'nope.jsonl'} does not exist\n")


# -- stdin and pipes ---------------------------------------------------------------------------
def test_stdin_compressed_and_named_in_rejects(tmp_path):
    data = gzip.compress(JSONL + b'{"messages": 1}\n')
    assert run(tmp_path, "-", "-o", tmp_path / "ds", input=data) == (0, "")
    (rej,) = rejects(tmp_path / "ds")
    assert (rej["record"], rej["source"], rej["where"]) == (len(RECORDS), "<stdin>", f"<stdin>:line {len(RECORDS) + 1}")
    meta = open_dataset(tmp_path / "ds").metadata["sources"]
    assert [(m["path"], m["container"], m["compressed"], m["bytes"]) for m in meta] == [
        ("<stdin>", "jsonl", True, len(data))]


def test_stdin_twice_is_a_usage_error():
    with pytest.raises(UsageError, match=r"^'-' \(standard input\) is given twice; it can be read once$"):
        expand_inputs(["-", "a.jsonl", "-"])


def test_a_pipe_is_read_once_like_stdin(tmp_path):
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(bz2.compress(JSONL)))
    writer.start()
    try:
        s = prepare([fifo], tmp_path / "ds", PrepareOptions(workers=1))
    finally:
        writer.join()
    assert s.episodes == {"train": len(RECORDS)}


# -- URLs -------------------------------------------------------------------------------------------
def test_memory_urls_folders_and_globs(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe({"/sft/b/2.jsonl": JSONL[:200], "/sft/a.jsonl": JSONL, "/sft/.x.jsonl": b"[]", "/sft/readme.md": b"#"})
    try:
        assert [(i.name, i.kind, i.size) for i in expand_inputs(["memory://sft"])] == [
            ("memory:///sft/a.jsonl", "url", len(JSONL)), ("memory:///sft/b/2.jsonl", "url", 200)]
        assert [i.name for i in expand_inputs(["memory://sft/*.jsonl"])] == ["memory:///sft/a.jsonl"]
        assert [i.name for i in expand_inputs(["memory://sft/a.jsonl"])] == ["memory://sft/a.jsonl"]
        s = prepare(["memory://sft/a.jsonl"], tmp_path / "ds", PrepareOptions(workers=1))
        assert s.episodes == {"train": len(RECORDS)} and s.input_bytes == len(JSONL)
        with pytest.raises(InputError, match=r"^input memory://sft/nope.jsonl does not exist$"):
            expand_inputs(["memory://sft/nope.jsonl"])
        with pytest.raises(InputError, match=r"^no file matches memory://sft/\*\.parquet$"):
            expand_inputs(["memory://sft/*.parquet"])
    finally:
        fs.rm("/sft", recursive=True)


def test_a_url_is_streamed_not_downloaded_first(tmp_path):
    """The first record is ready after the first block: the input is not read whole first."""
    fsspec = pytest.importorskip("fsspec")
    big = JSONL * 4000  # about 3 MB
    fs = fsspec.filesystem("memory")
    fs.pipe("/stream/big.jsonl", big)
    try:
        info = inspect_source(Input("memory://stream/big.jsonl", "url", len(big)))
        records = iter_records(info)
        first, read = next(records)
        assert first.where == "memory://stream/big.jsonl:line 1" and read == 4096  # the bytes read to sniff it
        assert sum(1 for _ in records) + 1 == 4000 * len(RECORDS) and info.sha256 is not None
    finally:
        fs.rm("/stream", recursive=True)


def test_without_fsspec_a_url_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    assert run(tmp_path, "s3://bucket/chats.jsonl", "-o", tmp_path / "ds") == (
        1, "error: s3://bucket/chats.jsonl: reading URLs needs fsspec: pip install 'sftdata[cloud]' (or pip install "
           "fsspec)\n")


@pytest.mark.parametrize("url, package", [("s3://bucket/chats.jsonl", "s3fs"), ("gs://bucket/x/", "gcsfs"),
                                          ("https://example.com/chats.jsonl", "aiohttp")])
def test_a_protocol_without_its_package_names_the_extra(tmp_path, monkeypatch, url, package):
    pytest.importorskip("fsspec")
    monkeypatch.setitem(sys.modules, package, None)
    # a protocol used earlier in this process keeps its class in fsspec's registry
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, url.split(":")[0], raising=False)
    assert run(tmp_path, url, "-o", tmp_path / "ds") == (
        1, f"error: {url}: reading {url.split(':')[0]}:// URLs needs {package}: pip install 'sftdata[cloud]' (or pip "
           f"install {package})\n")


def test_an_unknown_protocol_is_one_line(tmp_path):
    pytest.importorskip("fsspec")
    code, out = run(tmp_path, "nosuch://x/y.jsonl", "-o", tmp_path / "ds")
    assert code == 1 and out.startswith("error: nosuch://x/y.jsonl: nosuch:// is not a protocol fsspec knows (")
    assert out.endswith("); give a local path or an s3://, gs://, hf://, https:// or file:// URL\n")


# -- the record bound ------------------------------------------------------------------------------
def test_a_line_beyond_max_record_bytes_is_rejected_and_read_past(tmp_path):
    long = json.dumps(chat("x" * 3000, "a")).encode()
    src = tmp_path / "in.jsonl"
    src.write_bytes(JSONL[:JSONL.index(b"\n") + 1] + long + b"\n\n" + JSONL)
    s = prepare([src], tmp_path / "ds", PrepareOptions(workers=1, max_record_bytes=2048))
    assert s.rejected == {"record_too_large": 1} and s.max_record_bytes == 2048
    assert open_dataset(tmp_path / "ds").split("train").sources.tolist()[:3] == [0, 3, 4]
    (rej,) = rejects(tmp_path / "ds")
    assert rej == {"record": 1, "source": str(src), "where": f"{src}:line 2", "reason": "record_too_large",
                   "message": f"the record is {len(long):,} bytes, longer than --max-record-bytes (2,048); it was "
                              f"read past, never held whole. Shorten or split it, or raise --max-record-bytes"}
    meta = open_dataset(tmp_path / "ds").metadata
    assert meta["options"]["max_record_bytes"] == 2048 and meta["counts"]["rejected"] == {"record_too_large": 1}


def test_an_array_item_beyond_max_record_bytes_is_rejected_with_its_item(tmp_path):
    items = RECORDS[:3] + [chat("y" * 3000, "b")] + RECORDS[3:5]
    src = tmp_path / "in.json.gz"
    src.write_bytes(gzip.compress(json.dumps(items).encode()))
    s = prepare([src], tmp_path / "ds", PrepareOptions(workers=1, max_record_bytes=2048))
    assert s.rejected == {"record_too_large": 1} and s.episodes == {"train": 5}
    assert [(r["record"], r["where"]) for r in rejects(tmp_path / "ds")] == [(3, f"{src}:item 3")]


def test_strict_stops_at_a_record_too_large(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"z" * 5000 + b"\n" + JSONL)
    code, out = run(tmp_path, src, "-o", tmp_path / "ds", "--max-record-bytes", "4K", "--strict")
    assert (code, out) == (1, f"error: {src}:line 1: the record is 5,000 bytes, longer than --max-record-bytes "
                              f"(4,096); it was read past, never held whole. Shorten or split it, or raise "
                              f"--max-record-bytes (--strict stops at the first bad record; drop --strict to skip "
                              f"and count bad records)\n")


@pytest.mark.parametrize("given, value", [("2048", 2048), ("4K", 4096), ("64M", 64 << 20), ("1g", 1 << 30),
                                          ("64MiB", 64 << 20), ("3kb", 3072)])
def test_max_record_bytes_takes_sizes(tmp_path, given, value):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-q", "--json",
                            "--max-record-bytes", given])
    assert r.exit_code == 0 and json.loads(r.stdout)["max_record_bytes"] == value


@pytest.mark.parametrize("given, message", [
    ("lots", "Invalid value for '--max-record-bytes': 'lots' is not a size: give bytes (67108864) or a number with "
             "K, M or G (64M, 1G; powers of 1024)"),
    ("0", "--max-record-bytes must be positive, got 0")])
def test_max_record_bytes_refuses_what_is_not_a_size(tmp_path, given, message):
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-q", "--max-record-bytes", given])
    assert r.exit_code == 2 and message in " ".join(r.output.replace("│", " ").split())


def test_the_script_takes_max_record_bytes(tmp_path):
    import subprocess

    src = tmp_path / "in.jsonl"
    src.write_bytes(b"q" * 3000 + b"\n" + JSONL)
    out = subprocess.run([sys.executable, "scripts/prepare_chat_sft.py", "--input", str(src), "--output_dir",
                          str(tmp_path / "ds"), "--max_record_bytes", "2K", "--json", "--workers", "1"],
                         capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout)
    assert summary["rejected"] == {"record_too_large": 1} and summary["max_record_bytes"] == 2048


# -- (file, line) from a record number -----------------------------------------------------------
def test_record_numbers_turn_back_into_file_and_line(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", RECORDS[:3] + [""])
    b = tmp_path / "b.json"
    b.write_text(json.dumps(RECORDS[:2]))
    prepare([a, b], tmp_path / "ds", PrepareOptions(workers=1))
    sources = open_dataset(tmp_path / "ds").metadata["sources"]
    assert [record_where(sources, n) for n in range(7)] == [
        f"{a}:line 1", f"{a}:line 2", f"{a}:line 3", f"{a}:line 4", f"{b}:item 0", f"{b}:item 1", None]
    assert record_where([{"path": "t.parquet", "container": "parquet", "first_record": 10, "records": 5}], 12) == \
        "t.parquet:row 2"


def test_zstd_is_read_with_the_module(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(zstandard.ZstdCompressor().compress(JSONL[:300]) + zstandard.ZstdCompressor().compress(JSONL[300:]))
    prepare([src], tmp_path / "z", PrepareOptions(workers=1))
    prepare([write_jsonl(tmp_path / "in.jsonl", RECORDS)], tmp_path / "j", PrepareOptions(workers=1))
    assert dataset_bytes(tmp_path / "z") == dataset_bytes(tmp_path / "j")
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(zstandard.ZstdCompressor().compress(JSONL * 3000)[:-7])
    with pytest.raises(InputError, match=rf"^{cut} is a truncated or damaged zstd file \(the compressed data ends "
                                         rf"inside a zstd frame\); the last complete line is line \d+\. Stopped"):
        prepare([cut], tmp_path / "c", PrepareOptions(workers=1))
