"""The exact seeded split (prepare/split.py): which episodes go to val, each split in input
order, and the same bytes whether the episodes go through the staging shard or straight
to train."""

import dataclasses

import numpy as np

from sftdata.prepare import PrepareOptions, pool, prepare, split, split_assignment
from sftdata.store import open_dataset
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
