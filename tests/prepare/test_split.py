"""The exact seeded split (prepare/split.py): which episodes go to val, each split in input
order, and the same bytes whether the episodes go through the staging shard or straight
to train; rows of any kind copied through the store's writers."""

import dataclasses

import numpy as np

from sftdata.prepare import PrepareOptions, pool, prepare, split, split_assignment
from sftdata.store import open_dataset
from sftdata.store.rows import Rows
from sftdata.store.shard import Shard
from tests.helpers.data import chat, write_jsonl


def records(n):
    return [chat(f"question {i}", f"answer number {i} " + "x" * (i % 7)) for i in range(n)]


def test_split_is_exact_seeded_and_keeps_input_order(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", records(20))
    prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.25, seed=7))
    ds = open_dataset(tmp_path / "ds")
    val = ds.split("val").sources.tolist()
    train = ds.split("train").sources.tolist()
    assert val == sorted(np.random.RandomState(7).permutation(20)[:5].tolist())
    assert train == sorted(set(range(20)) - set(val))
    assert split_assignment(20, 0.25, 7).sum() == 5
    assert split_assignment(10, 0.05, 1).sum() == 1  # round half up: 0.5 -> 1
    assert split_assignment(10, 0.04, 1).sum() == 0


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_val_split_writes_train_directly_with_the_same_bytes_as_through_staged_parts(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "in.jsonl", records(40) + ["nope"])
    opts = PrepareOptions(shard_tokens=120)  # several train shards
    direct = prepare([src], tmp_path / "direct", opts)
    # two workers stage their ranges' episodes, and write the shards the parent planned from their lengths
    monkeypatch.setattr(pool, "MAX_PART_BYTES", 500)
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 500)
    staged = prepare([src], tmp_path / "staged", dataclasses.replace(opts, workers=2))
    assert direct.shards == staged.shards == {"train": direct.shards["train"]} and direct.shards["train"] > 2
    assert _files(tmp_path / "direct") == _files(tmp_path / "staged")
    assert not (tmp_path / "direct" / "_staging").exists()


def test_the_staging_shard_copied_in_small_windows_gives_the_same_bytes(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "in.jsonl", records(40))
    opts = PrepareOptions(val_split=0.3, seed=5, shard_tokens=150)  # several shards in each split
    prepare([src], tmp_path / "whole", opts)
    monkeypatch.setattr(split, "COPY_TOKENS", 7)  # shorter than any episode: one episode a window
    prepare([src], tmp_path / "windows", opts)
    assert _files(tmp_path / "windows") == _files(tmp_path / "whole")
    assert len([k for k in _files(tmp_path / "whole") if k.startswith("val/")]) > 3


def _prompts_shard(root, n):
    """A staged shard of ``n`` RL prompts: prompt ``i`` is ``i + 1`` tokens ``10 * i``, record ``100 + i``."""
    w = split.open_split(root, "prompts", "_staging", np.dtype("uint32"), 1 << 62)
    split.add_rows(w, Rows(np.concatenate([np.full(i + 1, 10 * i, np.uint32) for i in range(n)]),
                           np.zeros(n * (n + 1) // 2, np.uint8), np.arange(1, n + 1), np.arange(100, 100 + n),
                           columns=[b'{"answer": "%d"}' % i for i in range(n)]))
    w.close()
    return Shard(root / "_staging" / "shard_00000", np.dtype("uint32"))


def test_rows_of_a_kind_with_columns_are_copied_in_windows_to_the_writers_their_route_names(tmp_path, monkeypatch):
    src = _prompts_shard(tmp_path, 5)
    monkeypatch.setattr(split, "COPY_TOKENS", 2)  # rows 1 to 4 are 2 to 5 tokens: one row a window
    writers = [split.open_split(tmp_path, "prompts", s, np.dtype("uint32"), 1 << 62) for s in ("a", "b")]
    split.copy_rows(src, "prompts", 1, 5, np.array([1, -1, 0, 1]), writers, record_offset=1000)
    assert [w.close()["rows"] for w in writers] == [1, 2]
    a, b = (Shard(tmp_path / s / "shard_00000", np.dtype("uint32")) for s in ("a", "b"))
    assert a.tokens.tolist() == [30] * 4 and a.sources.tolist() == [1103]
    assert b.tokens.tolist() == [10] * 2 + [40] * 5 and b.sources.tolist() == [1101, 1104]
    assert (tmp_path / "b" / "shard_00000" / "columns.jsonl").read_bytes() == (
        b'{"row": 0, "record": 1101, "columns": {"answer": "1"}}\n'
        b'{"row": 1, "record": 1104, "columns": {"answer": "4"}}\n')
