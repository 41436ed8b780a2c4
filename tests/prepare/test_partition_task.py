"""--workers > 1 on plain JSONL: each worker reads its own byte range of the input (the
partitions --engine ray uses), stages its episodes, and the workers write the final shards
the parent planned: the output is byte-identical to one worker's."""

import gzip
import hashlib
import json
import os
import re
import time

import pytest

from sftdata.errors import InputError
from sftdata.prepare import PrepareOptions, driver, local_parts, partition_task, pool, prepare
from sftdata.sources import expand_inputs, inspect_source
from sftdata.store import open_dataset
from sftdata.util import hashing
from tests.helpers.data import chat, write_jsonl

BIG = 2**62 + 1  # beyond a float's exact integers, within 64 bits: kept exactly
HUGE = 2**70  # beyond 64 bits: rejected by name


def tool_record(i, base=BIG):
    return {"messages": [
        {"role": "user", "content": f"add {i}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"n": base + i}}}]},
        {"role": "tool", "content": str(base + i)},
        {"role": "assistant", "content": f"it is {base + i}"}]}


def mixed_lines(n):
    out = []
    for i in range(n):
        if i % 17 == 5:
            out.append("not json")
        elif i % 23 == 7:
            out.append("")  # a blank line: counts as a line, is no record
        elif i % 11 == 3:
            out.append(json.dumps(chat("the same question", "the same answer")))  # exact duplicates
        elif i % 29 == 4:
            out.append(json.dumps(tool_record(i, HUGE)))
        elif i % 13 == 9:
            out.append(json.dumps(tool_record(i)))
        elif i % 19 == 2:
            out.append(json.dumps({"messages": [{"role": "user", "content": "no reply"}]}))  # rejected
        else:
            out.append(json.dumps(chat(f"question {i}", f"answer number {i} " + "x" * (i % 7))))
    return out


def tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def small_ranges(monkeypatch):
    """Ranges of about 2 KB, so a small input is cut into many."""
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 2000)
    monkeypatch.setattr(pool, "MAX_PART_BYTES", 2000)
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 4)


def summary_of(s):
    d = s.as_dict()
    d.pop("seconds")
    d.pop("output_dir")
    return d


@pytest.fixture
def guided_ranges(monkeypatch):
    """Ranges of at most 3 KB shrinking to 300 bytes at the end (the default sizes, scaled down)."""
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 300)
    monkeypatch.setattr(pool, "MAX_PART_BYTES", 3000)
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 4)


@pytest.mark.parametrize("mode,val", [("tool", 0.2), ("tool", 0.0), ("chat", 0.1)])
def test_one_two_and_three_workers_give_the_same_bytes_with_guided_ranges(tmp_path, guided_ranges, mode, val):
    a = write_jsonl(tmp_path / "a.jsonl", mixed_lines(300))
    b = write_jsonl(tmp_path / "b.jsonl", mixed_lines(90)[::-1])
    infos = [inspect_source(s) for s in expand_inputs([a, b])]
    sizes = [p.end - p.start for p in local_parts(infos, 2)]
    assert len(sizes) > 10 and max(sizes[:3]) >= 3000 and max(sizes[-3:]) < 600  # 3 KB, then down to 300 bytes (and a line)
    opts = dict(mode=mode, val_split=val, seed=3, shard_tokens=900, memo_mb=1)
    runs = {w: prepare([a, b], tmp_path / f"w{w}", PrepareOptions(workers=w, **opts)) for w in (1, 2, 3)}
    trees = {w: tree_bytes(tmp_path / f"w{w}") for w in runs}
    assert trees[1] == trees[2] == trees[3] and len([k for k in trees[1] if k.endswith("tokens.bin")]) > 2
    summaries = {w: summary_of(s) for w, s in runs.items()}
    for s in summaries.values():  # each worker has its own memo: what it saved differs, nothing else
        s.pop("memo")
    assert summaries[1] == summaries[2] == summaries[3] and runs[1].records_read == 374  # 390 lines, 16 blank


@pytest.mark.parametrize("mode,val", [("tool", 0.2), ("tool", 0.0)])
def test_one_two_and_three_workers_give_the_same_bytes(tmp_path, small_ranges, mode, val):
    a = write_jsonl(tmp_path / "a.jsonl", mixed_lines(150))
    b = write_jsonl(tmp_path / "b.jsonl", mixed_lines(60)[::-1])
    infos = [inspect_source(s) for s in expand_inputs([a, b])]
    parts = local_parts(infos, 2)
    assert len(parts) > 8 and all(not p.whole for p in parts)  # really cut into ranges
    opts = dict(mode=mode, val_split=val, seed=5, shard_tokens=700, max_tokens=400)
    runs = {}
    for workers in (1, 2, 3):
        runs[workers] = prepare([a, b], tmp_path / f"w{workers}", PrepareOptions(workers=workers, **opts))
    trees = {w: tree_bytes(tmp_path / f"w{w}") for w in runs}
    assert trees[1] == trees[2] == trees[3]
    assert summary_of(runs[1]) == summary_of(runs[2]) == summary_of(runs[3])
    assert len([k for k in trees[1] if k.endswith("tokens.bin")]) > 2
    rejects = [json.loads(x) for x in (tmp_path / "w2" / "rejects.jsonl").read_text().splitlines()]
    first = rejects[0]
    assert (first["record"], first["where"], first["reason"]) == (2, f"{a}:line 3", "no_assistant_turn")
    assert {r["where"] for r in rejects if r["reason"] == "invalid_json"} >= {f"{a}:line 6", f"{b}:line {60 - 22}"}
    assert runs[2].dedup["exact_duplicates"] > 5
    huge = [r["where"] for r in rejects if r["reason"] == "invalid_arguments"]
    assert huge[:2] == [f"{a}:line 5", f"{a}:line 34"]
    ds = open_dataset(tmp_path / "w3")
    sources = sorted(ds.split("train").sources.tolist() + (ds.split("val").sources.tolist() if val else []))
    assert 9 in sources and 150 + (59 - 9) in sources  # the big-integer records, numbered globally


def test_the_parent_reads_no_records_when_the_input_is_cut(tmp_path, small_ranges, monkeypatch):
    src = write_jsonl(tmp_path / "in.jsonl", mixed_lines(80))
    prepare([src], tmp_path / "one", PrepareOptions(mode="tool"))

    def no_reading(*_):
        raise AssertionError("the parent read the records itself")

    monkeypatch.setattr(driver, "iter_all", no_reading)
    seen = []
    prepare([src], tmp_path / "two", PrepareOptions(mode="tool", workers=2), progress=seen.append)
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    done = [p.bytes_done for p in seen]  # the progress bar moves once per range, up to the whole input
    assert len(done) == 5 and done == sorted(done) and done[-1] == seen[-1].bytes_total == src.stat().st_size
    assert seen[-1].records == 76  # 80 lines, 4 of them blank


def test_inputs_that_cannot_be_cut_are_read_as_before(tmp_path, small_ranges, monkeypatch):
    lines = mixed_lines(80)
    plain = write_jsonl(tmp_path / "in.jsonl", lines)
    packed = tmp_path / "in.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    calls = []
    real = driver.partitioned_results
    monkeypatch.setattr(driver, "partitioned_results", lambda *a: calls.append(1) or real(*a))
    prepare([packed], tmp_path / "one", PrepareOptions(mode="tool", val_split=0.1))
    prepare([packed], tmp_path / "two", PrepareOptions(mode="tool", val_split=0.1, workers=2))
    prepare([packed], tmp_path / "near", PrepareOptions(mode="tool", workers=2, dedup="exact"))
    assert calls == []  # gzip, and --dedup: the parent reads and sends records, as before
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    prepare([plain], tmp_path / "three", PrepareOptions(mode="tool", val_split=0.1, workers=2))
    assert calls == [1]
    one, three = tree_bytes(tmp_path / "one"), tree_bytes(tmp_path / "three")
    assert one.keys() == three.keys()
    named = ("dataset_metadata.json", "rejects.jsonl")  # they name the input
    assert all(one[k] == three[k] for k in one if k not in named)
    assert one["rejects.jsonl"].replace(b"in.jsonl.gz", b"in.jsonl") == three["rejects.jsonl"]


def _rewriting_reads(monkeypatch, tmp_path, src, new_bytes, after_part):
    """Partition ``after_part``'s reader rewrites ``src`` in place (``new_bytes``, the same
    size) once it has read its range, then sets an event; the next partition's reader
    waits for that event before it reads (the workers are forked: the patch reaches them).
    So the reads before and after the rewrite are decided by events, not by timing."""
    real, event = partition_task.iter_partition, tmp_path / "rewritten"

    def reading(part, before, max_bytes, read=None):
        if part.index == after_part + 1:
            for _ in range(60_000):  # waits on the event (a bound only against a hung test)
                if event.exists():
                    break
                time.sleep(0.001)
        yield from real(part, before, max_bytes, read)
        if part.index == after_part:
            with open(src, "r+b") as f:  # in place: the same file, the same size
                f.write(new_bytes)
            event.touch()

    monkeypatch.setattr(partition_task, "iter_partition", reading)


def test_an_input_rewritten_between_the_partition_reads_fails_the_run_by_name(tmp_path, small_ranges, monkeypatch):
    """Another process rewrites the input in place (the same size) after the first range
    was read and before the second is: the ranges' readers hashed different bytes of the
    same hash block, so the run fails naming the file, and nothing is left at the target."""
    lines = [json.dumps(chat(f"What is the capital of France? ({i})", f"Paris, number {i}")) for i in range(60)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    old = src.read_bytes()
    new = old.replace(b"the capital", b"the Paris  ")
    assert len(new) == len(old) and new != old
    assert len(local_parts([inspect_source(src)], 2)) > 2
    _rewriting_reads(monkeypatch, tmp_path, src, new, 0)
    with pytest.raises(InputError, match=rf"^input file {re.escape(str(src))} changed while this run read it "
                                         rf"\(bytes 0 to 4,194,304 read differently by two workers\): its workers "
                                         rf"read different versions of it, so no dataset was written\. Run again "
                                         rf"once nothing writes to the file \(or prepare a copy of it\)$"):
        prepare([src], tmp_path / "ds", PrepareOptions(workers=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "rewritten"]  # no target, no staging
    src.write_bytes(new)  # as it is now, read by one worker or two: the same dataset, its sha256 recorded
    prepare([src], tmp_path / "one", PrepareOptions(workers=1))
    monkeypatch.undo()
    prepare([src], tmp_path / "two", PrepareOptions(workers=2))
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    recorded = json.loads((tmp_path / "two" / "dataset_metadata.json").read_bytes())["sources"][0]
    assert recorded["sha256"] == hashlib.sha256(new).hexdigest()


def test_an_input_changed_after_its_ranges_were_read_fails_the_run_by_its_stat(tmp_path, small_ranges, monkeypatch):
    """The same bytes written again after every range was read: every read agrees, but the
    file's modification time is not the one the run started with, so the run fails."""
    lines = [json.dumps(chat(f"question {i}", f"answer {i}")) for i in range(60)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    os.utime(src, ns=(10**18, 10**18))  # a time no write can leave: the rewrite below changes it
    parts = local_parts([inspect_source(src)], 2)
    _rewriting_reads(monkeypatch, tmp_path, src, src.read_bytes(), len(parts) - 1)
    with pytest.raises(InputError, match=rf"^input file {re.escape(str(src))} changed while this run read it "
                                         rf"\(its mtime_ns(, ctime_ns)? changed\): its workers read different "
                                         rf"versions of it, so no dataset was written"):
        prepare([src], tmp_path / "ds", PrepareOptions(workers=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "rewritten"]


@pytest.mark.parametrize("block", [64, 997])
def test_hash_blocks_smaller_than_the_ranges_record_what_one_worker_records(tmp_path, guided_ranges, monkeypatch,
                                                                           block):
    """Each range's reader hashes the blocks its bytes lie in (blocks spanning two ranges are
    hashed by both readers, and agree): the metadata's sha256 and block hash are those of a
    sequential read, byte for byte, with blocks much smaller than the ranges or not
    dividing them."""
    monkeypatch.setattr(hashing, "HASH_BLOCK_BYTES", block)
    src = write_jsonl(tmp_path / "a.jsonl", mixed_lines(200))
    assert len(local_parts([inspect_source(src)], 2)) > 5
    prepare([src], tmp_path / "one", PrepareOptions(mode="tool", workers=1))
    prepare([src], tmp_path / "two", PrepareOptions(mode="tool", workers=2))
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    recorded = json.loads((tmp_path / "two" / "dataset_metadata.json").read_bytes())["sources"][0]
    assert recorded["block_sha256"] == {"block_bytes": block, "sha256": hashing.file_hashes(src)[1]}
