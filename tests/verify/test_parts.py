"""A shard's content checks run as parts (``verify.shards.piece_checks`` over ranges of its
episodes or rows, merged by ``merge_pieces``, the file hashes whole beside them): the report
is the whole-shard report exactly, clean and with problems planted in several parts. Here
in this process (the Ray tasks: tests/engine/test_verify_ray.py)."""

from __future__ import annotations

import shutil

import numpy as np
import orjson
import pytest

from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store.reader import scan_dataset
from sftdata.verify import verify
from sftdata.verify.shards import (
    ShardContext,
    shard_parts,
    splittable,
)
from tests.helpers.data import random_conversation
from tests.helpers.engines import in_process_engine


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    """An episodes dataset of one shard per split (1,600 train episodes) and its pack
    (one shard per split)."""
    d = tmp_path_factory.mktemp("parts")
    rng = np.random.default_rng(3)
    (d / "chats.jsonl").write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i, 20, 40))
                                               for i in range(2000)) + b"\n")
    prepare([d / "chats.jsonl"], d / "episodes", PrepareOptions(val_split=0.2, workers=1, shard_tokens=10**8))
    pack(d / "episodes", d / "packed", PackOptions(block_size=128, shard_tokens=10**8))
    for kind in ("episodes", "packed"):
        assert [p.name for p in (d / kind / "train").iterdir() if p.is_dir()] == ["shard_00000"]
    return d


def as_dict(report) -> dict:
    d = report.as_dict()
    d.pop("seconds")
    return d


def plant(path, what: str) -> None:
    """Problems at 10%, 35%, 60% and 85% of the train shard (several parts): ``what`` is
    ``vocab`` (an id past the vocabulary), ``mask`` (a trained token untrained: the mask
    rule and stops), ``values`` (a mask value 7) or ``many`` (every 97th trained token
    untrained: more than 100 episodes that cannot stop)."""
    sh = path / "train" / "shard_00000"
    dtype = orjson.loads((path / "dataset_metadata.json").read_bytes())["token_dtype"]
    ids = np.fromfile(sh / "tokens.bin", dtype=dtype)
    mask = np.fromfile(sh / "mask.bin", dtype=np.uint8)
    at = [int(ids.size * f) for f in (0.1, 0.35, 0.6, 0.85)]
    if what == "vocab":
        ids[at] = np.iinfo(ids.dtype).max
    elif what == "values":
        mask[at] = 7
    else:
        ones = np.flatnonzero(mask == 1)
        mask[ones[::97] if what == "many" else ones[np.searchsorted(ones, at)]] = 0
    ids.tofile(sh / "tokens.bin")
    mask.tofile(sh / "mask.bin")


@pytest.mark.parametrize("kind", ["episodes", "packed"])
@pytest.mark.parametrize("damage", ["", "vocab", "mask", "values", "many", "vocab+mask+values"])
def test_a_shard_checked_in_parts_reports_what_the_whole_shard_reports(one_shard, tmp_path, kind, damage):
    path = tmp_path / kind
    shutil.copytree(one_shard / kind, path)
    for what in filter(None, damage.split("+")):
        plant(path, what)
    whole = verify(path)
    for items in (100, 333):
        parts = verify(path, executor=in_process_engine(items_per_task=items))
        scan = scan_dataset(path)
        ctx = ShardContext(kind == "packed", scan.row_len, None, None, False)
        assert len(shard_parts(scan.dataset.shards, ctx, 4, items)[0]) >= 4  # the train shard, in several parts
        assert as_dict(parts) == as_dict(whole)
        assert parts.problems == whole.problems
    failed = {c.name for c in whole.checks if c.status == "failed"}
    want = {"": set(), "vocab": {"vocab", "checksums"}, "mask": {"mask_rule", "stops", "checksums"},
            "values": {"mask_values", "checksums"}, "many": {"mask_rule", "stops", "checksums"}}
    assert set().union(*(want[w] for w in damage.split("+"))) <= failed
    if damage == "many":
        rec = whole.cannot_stop["train"]
        assert rec["count"] > 100 and len(rec["episodes" if kind == "episodes" else "rows"]) == 100
    found = [(p.check, p.code) for p in whole.problems if p.file.startswith("train/") and p.check not in ("checksums", "ranges")]
    assert len(found) == len(set(found))  # one problem per check (and kind) for the shard, its parts merged
    if damage in ("vocab", "values"):  # its message counts the plants of every part
        assert sum(f" (3 more {kind if kind == 'episodes' else 'rows'} like it in this shard)" in p.message
                   for p in whole.problems) == 1, [p.message for p in whole.problems]


def test_a_split_of_few_shards_is_cut_into_parts_and_an_older_layout_is_not(one_shard):
    shards = scan_dataset(one_shard / "episodes").dataset.shards
    ctx = ShardContext(False, None, None, None, False)
    n = [sh.num_items for sh in shards]
    assert n[0] > 1000
    parts = shard_parts(shards, ctx, want=8)
    assert [len(p) for p in parts] == [-(-k // max(256, -(-sum(n) // 8))) for k in n]
    assert parts[0][0][0] == 0 and parts[0][-1][1] is None
    assert all(a[1] == b[0] for a, b in zip(parts[0], parts[0][1:]))
    assert shard_parts(shards, ctx, want=len(shards)) == [None] * len(shards)  # enough shards: whole
    older = ShardContext(False, None, None, None, True)  # EOS endings of an older flat layout: whole
    assert not splittable(older) and shard_parts(shards, older, 8, 10) == [None] * len(shards)
