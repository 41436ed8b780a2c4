import errno
import gzip
import json
import re

import numpy as np
import pytest

from sftdata.errors import AllRecordsRejectedError, NoUsableRecordsError, OutputExistsError, RecordError, UsageError
from sftdata.prepare import PrepareOptions, driver, pool, prepare
from sftdata.store import open_dataset
from sftdata.util.hashing import sha256_file
from tests.helpers.data import chat, write_jsonl


def records(n):
    return [chat(f"question {i}", f"answer number {i} " + "x" * (i % 7)) for i in range(n)]


def tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_multi_shard_output_with_tiny_shard_tokens(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(30))
    prepare([src], tmp_path / "one", PrepareOptions())
    prepare([src], tmp_path / "many", PrepareOptions(shard_tokens=50))
    one, many = open_dataset(tmp_path / "one").split("train"), open_dataset(tmp_path / "many").split("train")
    assert len(one.shards) == 1 and len(many.shards) > 5
    for s in many.shards:
        assert s.tokens.shape[0] <= 50 or s.num_episodes == 1
        # episodes are contiguous from 0 inside every shard
        assert s.episodes[0, 0] == 0
        assert np.array_equal(s.episodes[1:, 0], np.cumsum(s.episodes[:-1, 1]))
    assert many.num_episodes == one.num_episodes == 30
    for g in range(30):
        assert many.episode(g)[0].tolist() == one.episode(g)[0].tolist()
        assert many.episode(g)[1].tolist() == one.episode(g)[1].tolist()
    assert many.sources.tolist() == list(range(30))


def test_an_episode_longer_than_a_shard_gets_its_own_shard(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "long " * 40), chat("q", "a")])
    prepare([src], tmp_path / "ds", PrepareOptions(shard_tokens=10))
    split = open_dataset(tmp_path / "ds").split("train")
    assert [s.num_episodes for s in split.shards] == [1, 1]


def test_interrupted_run_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 2)
    src = write_jsonl(tmp_path / "in.jsonl", records(10))
    calls = []

    def interrupt(p):
        calls.append(p)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare([src], tmp_path / "out" / "ds", PrepareOptions(), progress=interrupt)
    assert not (tmp_path / "out" / "ds").exists()
    assert list((tmp_path / "out").iterdir()) == []


def test_failed_overwrite_keeps_the_old_dataset(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(5))
    prepare([src], tmp_path / "ds", PrepareOptions())
    before = tree_bytes(tmp_path / "ds")
    bad = write_jsonl(tmp_path / "bad.jsonl", ["nope"])
    with pytest.raises(NoUsableRecordsError):
        prepare([bad], tmp_path / "ds", PrepareOptions(overwrite=True))
    assert tree_bytes(tmp_path / "ds") == before


def test_existing_output_is_up_to_date_or_refused_without_overwrite(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(3))
    prepare([src], tmp_path / "ds", PrepareOptions())
    assert prepare([src], tmp_path / "ds", PrepareOptions()).up_to_date
    with pytest.raises(OutputExistsError, match=r"already exists and is not up to date: the option --seed changed "
                                                r"\(1337 -> 7\)\. Pass --overwrite to rebuild it"):
        prepare([src], tmp_path / "ds", PrepareOptions(seed=7))
    s = prepare([src], tmp_path / "ds", PrepareOptions(seed=7, overwrite=True))
    assert s.episodes == {"train": 3} and not s.up_to_date


def test_overwrite_never_replaces_a_folder_that_is_not_a_dataset(tmp_path):
    """--output-dir pointing at the folder of the inputs (or any other folder) with
    --overwrite must not delete that folder and the inputs in it."""
    data = tmp_path / "data"
    data.mkdir()
    src = write_jsonl(data / "in.jsonl", records(3))
    (data / "notes.txt").write_text("keep me")
    with pytest.raises(OutputExistsError, match=r"data is not an sftdata dataset \(no dataset_metadata.json, and not empty\): "
                                                 r"--overwrite replaces only a dataset"):
        prepare([src], data, PrepareOptions(overwrite=True))
    assert sorted(p.name for p in data.iterdir()) == ["in.jsonl", "notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no temporary folder left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare([src], empty, PrepareOptions(overwrite=True)).episodes == {"train": 3}


def test_metadata_checksums_match_the_files(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(12) + ["{}"])
    prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.25, shard_tokens=80))
    root = tmp_path / "ds"
    meta = json.loads((root / "dataset_metadata.json").read_text())
    checked = 0
    for split, info in meta["splits"].items():
        for shard in info["shards"]:
            for fn, f in shard["files"].items():
                path = root / split / shard["name"] / fn
                assert f["sha256"] == sha256_file(path) and f["bytes"] == path.stat().st_size
                checked += 1
    for fn, f in meta["files"].items():
        assert f["sha256"] == sha256_file(root / fn)
        checked += 1
    on_disk = [p for p in root.rglob("*") if p.is_file() and p.name != "dataset_metadata.json"]
    assert checked == len(on_disk)
    assert meta["sources"][0]["sha256"] == sha256_file(src)
    assert meta["counts"]["rejected"] == {"no_messages": 1}
    assert meta["splits"]["train"]["episodes"] + meta["splits"]["val"]["episodes"] == 12
    assert meta["token_dtype"] == "uint32"


def test_every_record_rejected_is_an_error_and_the_reasons_are_kept_beside_the_output(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["nope", "{}", json.dumps(chat("only a question"))])
    out = tmp_path / "ds"
    kept = tmp_path / "ds.rejects.jsonl"
    with pytest.raises(AllRecordsRejectedError) as e:
        prepare([src], out, PrepareOptions())
    assert str(e.value) == (f"every record was rejected (3 read; invalid_json: 1, no_messages: 1, no_assistant_turn: 1); "
                            f"nothing was written to {out}. The reason for each record is in {kept}")
    assert (e.value.rejects_path, e.value.rejected) == (
        str(kept), {"invalid_json": 1, "no_messages": 1, "no_assistant_turn": 1})
    assert isinstance(e.value, NoUsableRecordsError) and e.value.exit_code == 1
    assert not out.exists()
    lines = [json.loads(x) for x in kept.read_text().splitlines()]
    assert [(r["record"], r["where"], r["reason"]) for r in lines] == [
        (0, f"{src}:line 1", "invalid_json"), (1, f"{src}:line 2", "no_messages"),
        (2, f"{src}:line 3", "no_assistant_turn"), (None, None, "sftdata_seal")]  # the seal: sha256 of the rest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.rejects.jsonl", "in.jsonl"]  # no temporary folder
    # a second run replaces the rejects file it wrote before
    write_jsonl(src, ["nope"])
    with pytest.raises(AllRecordsRejectedError, match=r"\(1 read; invalid_json: 1\)"):
        prepare([src], out, PrepareOptions())
    assert len(kept.read_text().splitlines()) == 1 + 1  # the reject, the seal


@pytest.mark.parametrize("what", ["file", "empty file", "folder", "symlink", "lines like rejects", "edited"])
def test_rejects_never_replace_a_path_sftdata_did_not_write(tmp_path, what):
    src = write_jsonl(tmp_path / "in.jsonl", ["nope", "{}"])
    taken = tmp_path / "ds.rejects.jsonl"
    target = tmp_path / "precious.txt"
    target.write_text("mine")
    if what == "file":
        taken.write_text('{"record": 0, "note": "my own list"}\n')
    elif what == "empty file":
        taken.write_text("")
    elif what == "folder":
        taken.mkdir()
    elif what == "lines like rejects":  # the keys of a reject are not proof that sftdata wrote it
        taken.write_text('{"record": 0, "source": "a", "where": "a:line 1", "reason": "mine", "message": "x"}\n')
    elif what == "edited":  # one sftdata sealed, then changed: its seal no longer holds
        write_jsonl(tmp_path / "other.jsonl", ["nope"])
        with pytest.raises(AllRecordsRejectedError):
            prepare([tmp_path / "other.jsonl"], tmp_path / "ds", PrepareOptions())
        taken.write_bytes(taken.read_bytes().replace(b"invalid_json", b"my_own_note!"))
    else:
        taken.symlink_to(target)
    before = taken.read_bytes() if taken.is_file() else None
    with pytest.raises(AllRecordsRejectedError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions())
    second = tmp_path / "ds.rejects-2.jsonl"
    assert e.value.rejects_path == str(second) and str(e.value).endswith(f"The reason for each record is in {second}")
    assert len(second.read_text().splitlines()) == 2 + 1  # two rejects, the seal
    assert target.read_text() == "mine"
    if before is not None:
        assert taken.read_bytes() == before
    assert taken.is_symlink() == (what == "symlink") and taken.is_dir() == (what == "folder")


def test_all_tool_records_rejected_in_chat_mode_name_prepare_tool_and_the_rejects(tmp_path):
    rec = {"messages": [{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}]}
    src = write_jsonl(tmp_path / "in.jsonl", [rec, rec])
    with pytest.raises(AllRecordsRejectedError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions())
    assert str(e.value) == (f"every record was rejected (2 read; tool_conversation: 2); nothing was written to "
                            f"{tmp_path / 'ds'}. The reason for each record is in {tmp_path / 'ds.rejects.jsonl'}. "
                            f"The records hold tool calls or results: prepare them with `sftdata prepare-tool`")


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # what write() raises: no file name


@pytest.mark.parametrize("val_split,folder", [(0.0, "train"), (0.5, "_staging")])  # no val: straight to train
def test_a_full_disk_names_the_path_being_written(tmp_path, monkeypatch, val_split, folder):
    from sftdata.store import split_writer

    src = write_jsonl(tmp_path / "in.jsonl", records(3))
    monkeypatch.setattr(split_writer._HashedFile, "write", _disk_full)
    with pytest.raises(OSError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions(val_split=val_split))
    assert e.value.errno == errno.ENOSPC
    assert re.fullmatch(re.escape(str(tmp_path)) + r"/\.ds\.tmp-\d+-[0-9a-f]{8}/" + folder, e.value.filename)
    assert e.value.strerror == f"No space left on device (while preparing {tmp_path / 'ds'})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_full_disk_while_writing_rejects_names_the_rejects_file(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "in.jsonl", records(2) + ["nope"])
    real_open = open

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        write = flush = _disk_full

    monkeypatch.setattr(driver, "open", lambda path, mode="r": Full(real_open(path, mode)), raising=False)
    with pytest.raises(OSError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions())
    assert e.value.filename.endswith("/rejects.jsonl") and e.value.errno == errno.ENOSPC
    assert e.value.strerror == f"No space left on device (while preparing {tmp_path / 'ds'})"


def test_strict_stops_at_the_first_bad_record(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(3) + ['{"messages": 1}'] + records(2))
    with pytest.raises(RecordError, match=r"in.jsonl:line 4: 'messages' is a number, not a list of messages \(--strict stops") as e:
        prepare([src], tmp_path / "ds", PrepareOptions(strict=True))
    assert e.value.reason == "no_messages"
    assert not (tmp_path / "ds").exists()


def test_rejects_file_lists_reasons_with_lines(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(2) + ["nope", json.dumps(chat("q"))])
    s = prepare([src], tmp_path / "ds", PrepareOptions())
    lines = [json.loads(x) for x in (tmp_path / "ds" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["record"], r["reason"], r["where"].rsplit(":", 1)[1]) for r in lines] == [
        (2, "invalid_json", "line 3"), (3, "no_assistant_turn", "line 4")]
    assert s.rejected == {"invalid_json": 1, "no_assistant_turn": 1}


def test_too_long_and_truncated_are_counted(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q " * 50, "a"), chat("q", "a", "q " * 50, "a")])
    s = prepare([src], tmp_path / "ds", PrepareOptions(max_tokens=20))
    assert s.rejected == {"too_long": 1}
    assert s.records_truncated == 1 and s.pairs_dropped == 1


def test_gzip_json_array_and_several_inputs_number_records_globally(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", records(2) + [""] + records(1))  # a blank line keeps its number
    b = tmp_path / "b.json.gz"
    with gzip.open(b, "wt") as f:
        json.dump(records(3), f)
    s = prepare([a, b], tmp_path / "ds", PrepareOptions())
    ds = open_dataset(tmp_path / "ds")
    assert ds.split("train").sources.tolist() == [0, 1, 3, 4, 5, 6]
    assert [(x["first_record"], x["records"], x["container"], x["compressed"]) for x in ds.metadata["sources"]] == [
        (0, 4, "jsonl", False), (4, 3, "json", True)]
    assert s.records_read == 6


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_record(tmp_path):
    """Files saved by Windows tools often start with a UTF-8 BOM: the first JSONL record
    must not be rejected for it, nor a JSON array be read as JSONL."""
    bom = b"\xef\xbb\xbf"
    a = tmp_path / "a.jsonl"
    a.write_bytes(bom + b"\n".join(json.dumps(r).encode() for r in records(2)) + b"\n")
    b = tmp_path / "b.json"
    b.write_bytes(bom + b"[\n" + b",\n".join(json.dumps(r).encode() for r in records(2)) + b"\n]\n")
    c = tmp_path / "c.json.gz"
    c.write_bytes(gzip.compress(bom + json.dumps(records(1)).encode()))
    s = prepare([a, b, c], tmp_path / "ds", PrepareOptions())
    assert s.rejected == {} and s.episodes == {"train": 5}
    ds = open_dataset(tmp_path / "ds")
    assert ds.split("train").sources.tolist() == [0, 1, 2, 3, 4]
    assert [x["container"] for x in ds.metadata["sources"]] == ["jsonl", "json", "json"]


def test_input_errors(tmp_path):
    from sftdata.errors import InputError

    with pytest.raises(InputError, match="does not exist"):
        prepare([tmp_path / "missing.jsonl"], tmp_path / "ds", PrepareOptions())
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(InputError, match="not a valid JSON array"):
        prepare([bad], tmp_path / "ds", PrepareOptions())
    with pytest.raises(UsageError, match="--val-split must be a fraction"):
        prepare([bad], tmp_path / "ds", PrepareOptions(val_split=1.5))
    src = write_jsonl(tmp_path / "one.jsonl", records(1))
    with pytest.raises(UsageError, match="leaves no training episode"):
        prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.6))


def test_json_array_inputs_keep_integers_beyond_64_bits_exact(tmp_path):
    """A JSON array is decoded whole, not line by line: a tool call's integer beyond 64 bits
    must be refused there too (orjson alone would turn it into a float and train on it)."""
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "f", "arguments": {"n": 7}}}]}
    ok = {"messages": [{"role": "user", "content": "q"}, call]}
    src = tmp_path / "in.json"
    src.write_text("[" + json.dumps(ok) + "," + json.dumps(ok).replace('"n": 7', '"n": 123456789012345678901') + "]")
    s = prepare([src], tmp_path / "ds", PrepareOptions(mode="tool"))
    assert s.rejected == {"invalid_arguments": 1} and s.episodes == {"train": 1}
    (rej,) = [json.loads(x) for x in (tmp_path / "ds" / "rejects.jsonl").read_text().splitlines()]
    assert rej["record"] == 1 and "the integer 123456789012345678901 does not fit in 64 bits" in rej["message"]
