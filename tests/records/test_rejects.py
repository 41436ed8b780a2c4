"""rejects.jsonl is bounded: a reject's message is cut past MAX_MESSAGE_CHARS, the file
past MAX_STORED_BYTES (the metadata's counts stay whole), each saying so; and the file
kept beside an output is sealed, so only an unchanged one sftdata wrote is ever replaced."""

from __future__ import annotations

import io
import json

import orjson
import pytest

from sftdata.errors import AllRecordsRejectedError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.records import rejects as rejects_mod
from sftdata.records.rejects import MAX_MESSAGE_CHARS, RejectsFile, is_rejects_file, reject_line, seal
from tests.helpers.data import chat, write_jsonl


def test_a_reject_message_is_cut_saying_how_much_was_left_out():
    line = orjson.loads(reject_line(7, "in.jsonl:line 8", "unknown_role", "message 0 has role " + "r" * 5_000))
    assert line == {"record": 7, "source": "in.jsonl", "where": "in.jsonl:line 8", "reason": "unknown_role",
                    "message": "message 0 has role " + "r" * (MAX_MESSAGE_CHARS - 19) + "... (cut: 4,019 more "
                               "characters)"}
    short = orjson.loads(reject_line(1, "a:line 2", "invalid_json", "not valid JSON"))
    assert short["message"] == "not valid JSON"


def test_the_rejects_file_stops_listing_at_its_limit_and_says_how_many_it_left_out():
    f = io.BytesIO()
    rej = RejectsFile(f, limit=100)
    lines = [reject_line(i, f"a:line {i + 1}", "invalid_json", "bad") + b"\n" for i in range(5)]
    rej.write(lines[0] + lines[1])  # 2 x 85 bytes: only the first fits
    rej.write(lines[2])
    rej.close()
    out = [orjson.loads(x) for x in f.getvalue().splitlines()]
    assert len(lines[0]) == 85 and [x["record"] for x in out] == [0, None]
    assert out[1] == {"record": None, "source": None, "where": None, "reason": "rejects_cut",
                      "message": "2 more rejected records are not listed: rejects.jsonl lists 100 bytes of rejects at "
                                 "most; dataset_metadata.json counts every one by reason (counts.rejected)"}


def test_a_run_of_many_short_bad_lines_writes_a_bounded_rejects_file_and_counts_every_one(tmp_path, monkeypatch):
    """Each reject is ~100 times a one-character bad line: the file stops at its limit."""
    monkeypatch.setattr(rejects_mod, "MAX_STORED_BYTES", 2_000)
    src = write_jsonl(tmp_path / "in.jsonl", [json.dumps(chat("q", "a"))] + ["x"] * 300)
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    meta = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())
    assert meta["counts"]["rejected"] == {"invalid_json": 300}
    data = (tmp_path / "ds" / "rejects.jsonl").read_bytes()
    lines = [orjson.loads(x) for x in data.splitlines()]
    listed = len(lines) - 1
    assert listed == 2_000 // len(data.splitlines(keepends=True)[0]) and len(data) <= 2_000 + 300
    assert [x["record"] for x in lines[:-1]] == list(range(1, listed + 1))
    assert (lines[-1]["reason"], lines[-1]["message"].split(" more")[0]) == ("rejects_cut", f"{300 - listed:,}")


def test_only_a_sealed_unchanged_rejects_file_is_sftdatas(tmp_path):
    p = tmp_path / "ds.rejects.jsonl"
    p.write_bytes(reject_line(0, "a:line 1", "invalid_json", "bad") + b"\n")
    assert not is_rejects_file(p)  # lines like rejects: no proof
    seal(p)
    assert is_rejects_file(p)
    p.write_bytes(p.read_bytes().replace(b"bad", b"mine"))
    assert not is_rejects_file(p)


def test_the_bound_holds_and_the_file_is_the_same_when_workers_decide_duplicates(tmp_path, monkeypatch):
    """With --dedup and several workers the duplicates' rejects are merged in after the
    partitions: the file stays under the same bound, byte-identical to one process's."""
    monkeypatch.setattr(rejects_mod, "MAX_STORED_BYTES", 4_000)
    rows = []
    for i in range(400):
        rows += [json.dumps(chat(f"q{i}", f"a{i}")), "x", json.dumps(chat(f"q{i}", f"a{i}"))]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    files = {}
    for j in (1, 2):
        prepare([src], tmp_path / f"ds{j}", PrepareOptions(workers=j, dedup="exact"))
        files[j] = (tmp_path / f"ds{j}" / "rejects.jsonl").read_bytes()
        meta = json.loads((tmp_path / f"ds{j}" / "dataset_metadata.json").read_text())
        assert meta["counts"]["rejected"] == {"duplicate": 400, "invalid_json": 400}
    lines = [orjson.loads(x) for x in files[2].splitlines()]
    assert files[1] == files[2] and len(files[2]) <= 4_000 + 300
    listed = len(lines) - 1
    assert (lines[-1]["reason"], lines[-1]["message"].split(" more")[0]) == ("rejects_cut", f"{800 - listed:,}")


def test_a_run_that_keeps_nothing_says_when_its_rejects_file_lists_only_the_first(tmp_path, monkeypatch):
    """No dataset is made: the error, not dataset_metadata.json, must say the list was cut."""
    monkeypatch.setattr(rejects_mod, "MAX_STORED_BYTES", 2_000)
    src = write_jsonl(tmp_path / "in.jsonl", ["x"] * 300)
    with pytest.raises(AllRecordsRejectedError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    kept = tmp_path / "ds.rejects.jsonl"
    assert str(e.value).endswith(f"nothing was written to {tmp_path / 'ds'}. The first rejects are listed with their "
                                 f"reasons in {kept}; its size bound left the rest out (the counts above count every "
                                 f"one)")
    assert is_rejects_file(kept) and not rejects_mod.lists_every_reject(kept)
    small = write_jsonl(tmp_path / "small.jsonl", ["x"] * 3)
    with pytest.raises(AllRecordsRejectedError, match="The reason for each record is in "):
        prepare([small], tmp_path / "ds2", PrepareOptions(workers=1))
