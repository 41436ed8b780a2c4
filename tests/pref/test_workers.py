"""prepare-pref / prepare-rl in chunks: rows written as they are made, rendered by --workers
processes, the train/val split prepare's exact seeded one; the dataset byte-identical for
any worker count; --dedup near over each row's tokens."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from sftdata.errors import RecordError
from sftdata.pref import PrefOptions
from sftdata.prepare import pool, prepare_pref
from sftdata.prepare.split import split_assignment
from tests.helpers.data import write_jsonl
from tests.helpers.pairs import verify_every_row
from tests.helpers.pref_records import kto_rows as _kto
from tests.helpers.pref_records import mixed_rows, tree_bytes
from tests.helpers.pref_records import pair as _pair
from tests.helpers.pref_records import pair_rows as _pairs
from tests.helpers.pref_records import prompt_rows as _prompts


@pytest.mark.parametrize(("make", "rl"), [(_pairs, False), (_kto, False), (_prompts, True)])
def test_the_dataset_is_byte_identical_for_1_2_and_3_workers(tmp_path, monkeypatch, make, rl):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)  # many chunks, so that workers interleave
    src = write_jsonl(tmp_path / "in.jsonl", make(23))
    trees = []
    for workers in (1, 2, 3):
        ds = tmp_path / f"ds{workers}"
        s = prepare_pref([src], ds, PrefOptions(val_split=0.3, seed=5, shard_tokens=90, dedup="exact",
                                                workers=workers), rl=rl)
        trees.append(tree_bytes(ds))
        assert verify_every_row(ds).ok
    assert trees[0] == trees[1] == trees[2]
    meta = orjson.loads(trees[0]["dataset_metadata.json"])
    assert len(meta["splits"]["train"]["shards"]) > 1  # rows written across shards, never one spanning two
    assert not any(name.startswith("_staging") for name in trees[0])
    assert s.rows == ({"train": 15, "val": 6} if make is _pairs else {"train": 16, "val": 7})  # round(0.3 x kept)


def test_the_split_is_prepares_exact_seeded_split_of_the_kept_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 4)
    src = write_jsonl(tmp_path / "in.jsonl", _pairs(30))
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(val_split=0.25, seed=11, dedup="exact", workers=2))
    kept = [i for i in range(30) if i not in (4, 9)]  # record 4 rejected, record 9 a duplicate
    is_val = split_assignment(len(kept), 0.25, 11)
    assert s.rows == {"train": 21, "val": 7}
    for split, want in (("train", ~is_val), ("val", is_val)):
        got = []
        for shard in sorted((tmp_path / "ds" / split).iterdir()):
            got += np.fromfile(shard / "sources.idx", dtype="<u8").tolist()
        assert got == np.asarray(kept)[want].tolist()  # each split in input order


def test_prompt_columns_stay_byte_exact_through_the_split(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(b'{"prompt": "q %d", "answer": %d.50, "meta": {"k" :  [1, 2]}}\n' % (i, i)
                             for i in range(10)))
    prepare_pref([src], tmp_path / "ds", PrefOptions(val_split=0.5, seed=3), rl=True)
    lines = []
    for split in ("train", "val"):
        lines += [orjson.loads(x) for x in (tmp_path / "ds" / split / "shard_00000" / "columns.jsonl")
                  .read_bytes().splitlines()]
    assert sorted((x["record"], x["columns"]["answer"], x["columns"]["meta"]) for x in lines) == [
        (i, f"{i}.50", '{"k" :  [1, 2]}') for i in range(10)]
    assert [x["row"] for x in lines] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]


def test_near_duplicate_pairs_are_dropped_naming_the_kept_pair(tmp_path):
    pytest.importorskip("rensa")
    long = " ".join(f"word{k}" for k in range(60))
    a = {"prompt": [{"role": "user", "content": "Tell me a story. " + long}],
         "chosen": [{"role": "assistant", "content": "Once upon a time " + long}],
         "rejected": [{"role": "assistant", "content": "No."}]}
    b = {**a, "rejected": [{"role": "assistant", "content": "No!"}]}  # one token differs: a near duplicate
    c = _pair(1)
    src = write_jsonl(tmp_path / "in.jsonl", [a, c, b])
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(dedup="near"))
    assert s.rows == {"train": 2} and s.rejected == {"duplicate": 1}
    assert (s.dedup["mode"], s.dedup["exact_duplicates"], s.dedup["near_duplicates"]) == ("near", 0, 1)
    line = orjson.loads((tmp_path / "ds" / "rejects.jsonl").read_bytes())
    assert line["record"] == 2 and line["reason"] == "duplicate"
    assert line["message"].startswith("a near duplicate (estimated Jaccard similarity ")
    assert line["message"].endswith(f"of its token shingles) of record 0 ({src}:line 1), which is kept (the first "
                                    f"occurrence)")
    # with 2 workers (started anew: MinHash's threads do not survive a fork) the same dataset
    s2 = prepare_pref([src], tmp_path / "ds2", PrefOptions(dedup="near", workers=2))
    assert s2.rows == s.rows and tree_bytes(tmp_path / "ds") == tree_bytes(tmp_path / "ds2")


def test_the_cli_takes_workers_and_writes_the_same_bytes(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from sftdata.cli import app

    monkeypatch.setattr(pool, "CHUNK_RECORDS", 2)
    src = write_jsonl(tmp_path / "in.jsonl", _pairs(12))
    runner = CliRunner()
    for j in ("1", "2"):
        r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(tmp_path / f"ds{j}"), "-j", j, "--val-split",
                                "0.25", "--dedup", "exact", "--quiet"])
        assert r.exit_code == 0, r.output
    assert tree_bytes(tmp_path / "ds1") == tree_bytes(tmp_path / "ds2")
    r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(tmp_path / "ds0"), "-j", "0"])
    assert (r.exit_code, r.output) == (2, "error: --workers must be at least 1, got 0\n")


def test_rows_are_written_chunk_by_chunk_not_held_until_the_end(tmp_path, monkeypatch):
    from sftdata.store.split_writer import RowSplitWriter

    monkeypatch.setattr(pool, "CHUNK_RECORDS", 4)
    calls = []
    add_rows = RowSplitWriter.add_rows

    def spy(self, ids, mask, lengths, sources, **kw):
        calls.append((self.split, np.asarray(sources).tolist()))
        return add_rows(self, ids, mask, lengths, sources, **kw)

    monkeypatch.setattr(RowSplitWriter, "add_rows", spy)
    src = write_jsonl(tmp_path / "in.jsonl", [_pair(i) for i in range(10)])
    prepare_pref([src], tmp_path / "ds", PrefOptions())  # no val split: straight into train
    assert calls == [("train", [0, 1, 2, 3]), ("train", [4, 5, 6, 7]), ("train", [8, 9])]
    calls.clear()
    prepare_pref([src], tmp_path / "ds2", PrefOptions(val_split=0.2, seed=1))  # staged, then split
    assert [c[0] for c in calls] == ["_staging"] * 3 + ["train", "val"]
    assert [c[1] for c in calls[:3]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_kto_row_in_a_pairs_dataset_is_rejected_by_name_and_its_copy_as_a_duplicate(tmp_path, workers):
    src = write_jsonl(tmp_path / "in.jsonl", mixed_rows(5, (1, 3)))
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(dedup="exact", workers=workers))
    assert (s.kind, s.rows, s.rejected) == ("pairs", {"train": 3}, {"duplicate": 1, "mixed_kinds": 1})
    lines = [orjson.loads(x) for x in (tmp_path / "ds" / "rejects.jsonl").read_bytes().splitlines()]
    assert [(x["record"], x["reason"]) for x in lines] == [(1, "mixed_kinds"), (3, "duplicate")]
    assert lines[0]["message"] == ("a kto row in a pairs dataset (the first kept row decided); prepare pairs and KTO "
                                   "rows into separate datasets")
    assert lines[1]["message"].startswith(f"the same prompt and completions as record 1 ({src}:line 2)")


def test_strict_stops_at_a_row_of_another_kind(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", mixed_rows(5, (1, 3)))
    with pytest.raises(RecordError, match=r"in.jsonl:line 2: a kto row in a pairs dataset .* \(--strict stops at "
                                          r"the first bad record; drop --strict to skip and count bad records\)$"):
        prepare_pref([src], tmp_path / "ds", PrefOptions(strict=True))
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_strict_names_the_first_bad_record_whichever_step_finds_it(tmp_path, workers):
    """A row of another kind (found when the driver keeps rows) at line 2 comes before a
    record no preference form fits (found when the chunk renders) at line 4: --strict names
    line 2, as a run through the records one by one meets them."""
    rows = [_pair(0), _kto(2)[1], _pair(2), {"bad": 1}, _pair(4)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(RecordError, match=r"in.jsonl:line 2: a kto row in a pairs dataset"):
        prepare_pref([src], tmp_path / "ds", PrefOptions(strict=True, workers=workers))
    assert not (tmp_path / "ds").exists()


def test_strict_does_not_stop_at_the_duplicates_dedup_was_asked_to_drop(tmp_path):
    """--dedup exact asks for duplicates to be dropped: under --strict they are dropped and
    counted, as prepare-chat does, and the run ends with the other rows."""
    rows = [_pair(i) for i in range(5)]
    rows[3] = _pair(1)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(strict=True, dedup="exact"))
    assert (s.rows, s.rejected) == ({"train": 4}, {"duplicate": 1})
