"""Hostile inputs, each with its expected outcome; the large ones run in a child process
whose peak resident memory is checked (``resource.getrusage(RUSAGE_CHILDREN)``).

Covered elsewhere, not repeated here (tests/safety/test_inputs.py): a truncated or damaged
gzip / bzip2 / xz / zstd file (an error naming the last complete line), archives and
binary files (refused in one line), a NUL byte in a file's first KiB (a binary file),
UTF-16 without a byte order mark, invalid UTF-16, hostile configs. Speeds (the blank-line
gzip is read at well over 50 MB/s) are measured by benchmarks/bench_inputs.py: tests
assert outcomes and memory, never time.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from sftdata.chat.tokenizer import recorded_tokenizer
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store import open_dataset
from tests.helpers.hostile import gzip_repeated, record, run_measured

PEAK_MIB = 300  # a run's whole resident memory, interpreter, numpy and tokenizer included
GIB = 1 << 30


def prepare_measured(tmp_path, src, *args) -> dict:
    res = run_measured(["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "-j", "1", "-q", "--json", *args])
    assert "Traceback" not in res["stderr"], res["stderr"]
    return res


def rejects(ds) -> list[dict]:
    return [json.loads(x) for x in (ds / "rejects.jsonl").read_text().splitlines()]


def test_a_gzip_bomb_of_one_line_is_one_rejected_record_in_bounded_memory(tmp_path):
    """4 MB of gzip per 4 GB of text would do; 1 GiB proves the bound (the line is never held)."""
    src = tmp_path / "bomb.jsonl.gz"
    head = record(0) + b'\n{"messages": [{"role": "user", "content": "'
    tail = b'"}, {"role": "assistant", "content": "a"}]}\n' + record(2) + b"\n"
    size = gzip_repeated(src, head, b"a" * (1 << 20), 1024, tail)
    assert src.stat().st_size < 1_200_000 and size > GIB
    res = prepare_measured(tmp_path, src)
    assert res["code"] == 0, res["stderr"]
    summary = json.loads(res["stdout"])
    assert (summary["records_read"], summary["episodes"], summary["rejected"]) == (
        3, {"train": 2}, {"record_too_large": 1})
    (rej,) = rejects(tmp_path / "ds")
    line = size - len(record(0)) - len(record(2)) - 3  # the bomb's line, without its newline
    assert (rej["record"], rej["where"], rej["message"]) == (
        1, f"{src}:line 2", f"the record is {line:,} bytes, longer than --max-record-bytes (67,108,864); it was read "
                            f"past, never held whole. Shorten or split it, or raise --max-record-bytes")
    assert res["peak_mib"] < PEAK_MIB, res


def test_a_gzip_of_half_a_billion_blank_lines_keeps_every_line_number(tmp_path):
    src = tmp_path / "blank.jsonl.gz"
    gzip_repeated(src, record(0) + b"\n", b"\n" * (1 << 20), 512, record(1) + b"\n")
    res = prepare_measured(tmp_path, src)
    assert res["code"] == 0, res["stderr"]
    assert json.loads(res["stdout"])["episodes"] == {"train": 2}
    # record numbers are line numbers: the last record is on line 512 Mi + 2
    assert open_dataset(tmp_path / "ds").split("train").sources.tolist() == [0, 512 * (1 << 20) + 1]
    assert res["peak_mib"] < PEAK_MIB, res


def test_a_large_json_array_is_streamed_item_by_item(tmp_path):
    """512 MiB of JSON array in a gzip of half a megabyte: read whole, it would need its size
    twice over (text and objects); streamed, one item at a time."""
    pad = b"p" * ((1 << 20) - 200)
    item = b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "pad": "'
    src = tmp_path / "big.json.gz"
    size = gzip_repeated(src, b"[", item + pad + b'"},\n', 512, record(9) + b"]")
    assert size > 500 << 20
    res = prepare_measured(tmp_path, src)
    assert res["code"] == 0, res["stderr"]
    assert json.loads(res["stdout"])["episodes"] == {"train": 513}
    assert res["peak_mib"] < PEAK_MIB, res


def test_the_record_bound_caps_memory(tmp_path):
    """A lower --max-record-bytes rejects a record a higher one would hold: the bound is the
    user's, and what a run holds follows it."""
    src = tmp_path / "big.jsonl.gz"
    gzip_repeated(src, b'{"messages": [{"role": "user", "content": "', b"b" * (1 << 20), 48,
                  b'"}, {"role": "assistant", "content": "ok"}]}\n' + record(1) + b"\n")
    res = prepare_measured(tmp_path, src, "--max-record-bytes", "8M")
    assert res["code"] == 0 and json.loads(res["stdout"])["rejected"] == {"record_too_large": 1}
    assert res["peak_mib"] < PEAK_MIB - 64, res


# -- small hostile records: each one rejected (or kept) with its reason -------------------------------
def _msgs(user: str) -> str:
    return '{"messages": [{"role": "user", "content": ' + user + '}, {"role": "assistant", "content": "a"}]}'


CASES = [
    ("nested 100,000 deep", ('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}").encode(),
     "invalid_json", "the record is nested deeper than 1024 levels, which sftdata does not read; flatten the record"),
    ("an integer of 10,000 digits", ('{"n": ' + "9" * 10_000 + ', "messages": []}').encode(),
     "invalid_json", "not valid JSON (number is infinity when parsed as double: line 1 column 7 (char 6)); each line "
                     "must hold one JSON object"),
    ("a raw NUL byte in a string", _msgs('"q@"').encode().replace(b"@", b"\x00"),
     "invalid_json", "not valid JSON (unexpected control character in string: line 1 column 45 (char 44)); each "
                     "line must hold one JSON object"),
    ("invalid UTF-8", _msgs('"q@"').encode().replace(b"@", b"\xff"),
     "invalid_utf8", "invalid UTF-8 at byte 44 of the record; re-encode the file as UTF-8"),
    ("a lone high surrogate escaped", _msgs('"q\\ud800"').encode(),
     "invalid_json", "not valid JSON (no low surrogate in string: line 1 column 45 (char 44)); each line must hold "
                     "one JSON object"),
    ("a lone low surrogate escaped", _msgs('"q\\udc00"').encode(),
     "invalid_json", "not valid JSON (invalid high surrogate in string: line 1 column 45 (char 44)); each line must "
                     "hold one JSON object"),
    ("a surrogate encoded as UTF-8 bytes (CESU-8)", _msgs('"q@"').encode().replace(b"@", b"\xed\xa0\x80"),
     "invalid_utf8", "invalid UTF-8 at byte 44 of the record; re-encode the file as UTF-8"),
]


@pytest.mark.parametrize("container", ["jsonl", "json"])
def test_hostile_records_are_each_one_rejected_record(tmp_path, container):
    good = [record(i) for i in range(3)]
    lines = [good[0]] + [raw for _, raw, _, _ in CASES] + good[1:]
    src = tmp_path / f"in.{container}"
    # after 1 KiB of text: a NUL byte in the first KiB makes the whole file binary (refused, tested elsewhere)
    src.write_bytes(b"\n" * 1100 + b"\n".join(lines) + b"\n" if container == "jsonl" else
                    b"[" + b" " * 1100 + b",\n".join(lines) + b"]")
    s = prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    assert s.episodes == {"train": 3}
    unit = (lambda i: f"line {1101 + i}") if container == "jsonl" else (lambda i: f"item {i}")
    said = (lambda i, m: m) if container == "jsonl" else _as_item
    assert [(r["where"], r["reason"], r["message"]) for r in rejects(tmp_path / "ds")] == [
        (f"{src}:{unit(i + 1)}", reason, said(i + 1, message)) for i, (_, _, reason, message) in enumerate(CASES)]


def _as_item(item: int, message: str) -> str:
    """A JSONL line's "not valid JSON" message as the same text gets it as item ``item`` of a
    JSON array: that item named, orjson's position said to be in the item's text."""
    m = re.fullmatch(r"not valid JSON \((.*): line (\d+) column (\d+) \(char \d+\)\); each line must hold one JSON "
                     r"object", message)
    return message if m is None else (f"item {item} of the JSON array is not valid JSON: {m[1]} (line {m[2]}, column "
                                      f"{m[3]} of the item's text); each item of the array must be one JSON object "
                                      f"(one record): fix that item, or remove it")


def test_an_escaped_nul_is_text_and_is_kept(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(_msgs('"q\\u0000r"').encode() + b"\n")
    s = prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    assert s.episodes == {"train": 1} and s.rejected == {}
    ds = open_dataset(tmp_path / "ds")
    tok = recorded_tokenizer(ds.root, ds.tokenizer_state)
    assert "q\x00r" in tok.decode(np.asarray(ds.split("train").shards[0].tokens).tolist())


# -- issue 45: one record never ends a run; a model folder's FIFO never hangs its load ---------------
SPACED = "x" + " " * 1_000_000 + "y"  # a run of whitespace past tiktoken's regex stack (a million entries)


@pytest.mark.parametrize("command,line", [
    ("prepare-chat", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SPACED}]}),
    ("prepare-tool", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": SPACED}],
                      "tools": [{"name": "f", "parameters": {"type": "object"}}]}),
    ("prepare-pref", {"prompt": "hi", "chosen": SPACED, "rejected": "no"}),
])
def test_a_million_spaces_in_a_reply_are_encoded_as_tiktoken_would(tmp_path, command, line):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(line) + "\n" + json.dumps(
        {"prompt": "a", "chosen": "b", "rejected": "c"} if command == "prepare-pref" else
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}) + "\n")
    res = run_measured([command, str(src), "-o", str(tmp_path / "ds"), "-j", "1", "-q", "--json"])
    assert (res["code"], res["stderr"]) == (0, ""), res["stderr"]
    out = json.loads(res["stdout"])
    assert out["rejected"] == {} and out["records_read"] == 2
    ds = open_dataset(tmp_path / "ds")
    tok = recorded_tokenizer(ds.root, ds.tokenizer_state)
    ids = np.concatenate([np.asarray(s.tokens) for s in ds.split("train").shards]).tolist()
    reply = tok.encode(SPACED)
    assert reply[0] == tok.encode("x")[0] and tok.decode(reply) == SPACED
    assert any(ids[i:i + len(reply)] == reply for i in range(len(ids) - len(reply) + 1))


def test_a_fifo_among_a_model_folders_templates_is_refused_in_one_line(tmp_path):
    pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")
    from tests.helpers.hostile_tokenizers import big_tokenizer

    folder = big_tokenizer(tmp_path / "model", 10, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    (folder / "additional_chat_templates").mkdir()
    os.mkfifo(folder / "additional_chat_templates" / "tool_use.jinja")  # its reader would wait for a writer forever
    src = tmp_path / "in.jsonl"
    src.write_bytes(record(0) + b"\n")
    res = run_measured(["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(folder), "-q"])
    fifo = folder / "additional_chat_templates" / "tool_use.jinja"
    assert (res["code"], res["stdout"]) == (1, "")
    assert res["stderr"] == (f"error: {fifo} is a named pipe (FIFO), not a regular file: a model folder's files are "
                             f"read only when they are regular files (reading a pipe or device could wait forever or "
                             f"never end); replace it with the file itself\n")
    assert not (tmp_path / "ds").exists()
