"""The coordinator's plan (prepare/plan.py) and the shard task (prepare/shard_task.py): the
final shards planned from the staged parts' lengths alone, each written by a task, are the
shards the split writer writes when it is given the kept episodes in input order."""

import re
import shutil

import numpy as np
import pytest

from sftdata.errors import OutputExistsError, SftDataError
from sftdata.prepare.plan import plan_shards
from sftdata.prepare.results import StagedPart
from sftdata.prepare.shard_task import write_shard
from sftdata.storage.fsops import folder_identity
from sftdata.store.format import PARTS_DIR, STOP_FILE
from sftdata.store.split_writer import SplitWriter, shard_starts
from tests.helpers.engines import files


def test_shard_starts_is_the_writers_rolling_rule_however_the_items_are_appended(tmp_path):
    assert shard_starts([3, 3, 3, 9, 1], 6).tolist() == [0, 2, 3, 4]
    assert shard_starts([], 6).tolist() == []
    rng = np.random.default_rng(0)
    for trial in range(30):
        lengths = rng.integers(1, 40, size=int(rng.integers(1, 60)))
        cap = int(rng.integers(1, 120))
        (tmp_path / str(trial)).mkdir()
        w = SplitWriter(tmp_path / str(trial), "s", np.dtype(np.uint16), cap)
        i = 0
        while i < lengths.size:  # appended in batches of random sizes
            j = min(lengths.size, i + int(rng.integers(1, 7)))
            ln = lengths[i:j]
            w.add_many(np.ones(int(ln.sum()), np.uint16), np.zeros(int(ln.sum()), np.uint8), ln, np.arange(i, j))
            i = j
        counts = [s["episodes"] for s in w.close()["shards"]]
        assert np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist() == shard_starts(lengths, cap).tolist()


def staged_parts(root, rng, sizes):
    """Parts of ``sizes`` episodes each, staged by split writers as partition tasks stage
    them; returns the parts and every episode as (ids, mask, record) in input order."""
    parts, episodes, record = [], [], 0
    root.mkdir(parents=True, exist_ok=True)
    for k, n in enumerate(sizes):
        (root / f"part_{k}").mkdir()
        w = SplitWriter(root / f"part_{k}", "s", np.dtype(np.uint32), 1 << 62)
        lengths = rng.integers(1, 25, size=n)
        ids = rng.integers(0, 70000, size=int(lengths.sum())).astype(np.uint32)
        mask = rng.integers(0, 2, size=ids.size).astype(np.uint8)
        sources = np.arange(n) * 2  # records numbered from the start of their input: every other one
        if n:
            w.add_many(ids, mask, lengths, sources)
        w.close()
        ends = np.cumsum(lengths)
        episodes += [(ids[e - ln:e], mask[e - ln:e], int(s) + record) for e, ln, s in zip(ends, lengths, sources)]
        parts.append(StagedPart(str(root / f"part_{k}" / "s" / "shard_00000"), n, int(lengths.sum()), record,
                                lengths.astype(np.int64), sources + record))
        record += 1000
    return parts, episodes


@pytest.mark.parametrize("shard_tokens", [1, 40, 100, 10**6])
def test_the_planned_shards_written_by_tasks_are_the_split_writers(tmp_path, shard_tokens):
    rng = np.random.default_rng(shard_tokens)
    parts, episodes = staged_parts(tmp_path / "stage", rng, [7, 0, 12, 1, 9])
    keep = [rng.random(p.episodes) < 0.8 for p in parts]  # the coordinator's curating dropped some episodes
    parts = [StagedPart(p.path, p.episodes, p.tokens, p.record_offset, p.lengths, p.sources, k)
             for p, k in zip(parts, keep)]
    kept = [e for e, k in zip(episodes, np.concatenate(keep)) if k]
    is_val = np.zeros(len(kept), bool)
    is_val[rng.permutation(len(kept))[:5]] = True
    (tmp_path / "want").mkdir()
    want = {name: SplitWriter(tmp_path / "want", name, np.dtype(np.uint32), shard_tokens) for name in ("train", "val")}
    for (ids, mask, record), v in zip(kept, is_val):  # the single-process run: one episode at a time
        want["val" if v else "train"].add_many(ids, mask, [ids.size], [record])
    want_meta = {name: w.close() for name, w in want.items()}
    got = tmp_path / "got"
    (got / PARTS_DIR).mkdir(parents=True)
    (got / "train").mkdir()
    (got / "val").mkdir()
    jobs = plan_shards(parts, is_val, shard_tokens, ("train", "val"))
    records = [write_shard(job, "uint32", str(got), str(got / PARTS_DIR), "out") for job in jobs]
    assert [r for r, j in zip(records, jobs) if j.split == "train"] == want_meta["train"]["shards"]
    assert [r for r, j in zip(records, jobs) if j.split == "val"] == want_meta["val"]["shards"]
    assert [j.tokens for j in jobs] == [r["tokens"] for r in records]
    assert list((got / PARTS_DIR).iterdir()) == []  # each task's folder renamed into place, then removed
    assert files(got) == files(tmp_path / "want")


def test_an_empty_val_split_is_one_empty_shard_and_a_stopped_run_writes_nothing(tmp_path):
    rng = np.random.default_rng(1)
    parts, _ = staged_parts(tmp_path / "stage", rng, [3])
    jobs = plan_shards(parts, np.zeros(3, bool), 100, ("train", "val"))
    assert [(j.split, j.index, len(j.pieces)) for j in jobs] == [("train", 0, 1), ("val", 0, 0)]
    (tmp_path / "ds" / PARTS_DIR).mkdir(parents=True)
    (tmp_path / "ds" / "val").mkdir()
    rec = write_shard(jobs[1], "uint32", str(tmp_path / "ds"), str(tmp_path / "ds" / PARTS_DIR), "out")
    assert (rec["name"], rec["episodes"], rec["tokens"]) == ("shard_00000", 0, 0)
    assert sorted(p.stat().st_size for p in (tmp_path / "ds" / "val" / "shard_00000").iterdir()) == [0, 0, 0, 0]
    (tmp_path / "ds" / PARTS_DIR / STOP_FILE).touch()
    assert write_shard(jobs[0], "uint32", str(tmp_path / "ds"), str(tmp_path / "ds" / PARTS_DIR), "out") is None
    assert not (tmp_path / "ds" / "train").exists()


def test_a_task_writes_only_inside_the_staging_folder_its_coordinator_made(tmp_path):
    """Issue 45.1: a shard task whose staging area was removed (the run stopped) re-creates
    none of it, and one whose staging area's name now holds a link to another folder (or
    another folder put there) writes nothing through it: it fails naming the folder."""
    rng = np.random.default_rng(2)
    parts, _ = staged_parts(tmp_path / "stage", rng, [3])
    jobs = plan_shards(parts, np.zeros(3, bool), 100, ("train",))
    ds = tmp_path / "out" / ".ds.tmp-1-abcdef01"
    (ds / PARTS_DIR).mkdir(parents=True)
    (ds / "train").mkdir()
    stage_id = folder_identity(ds / PARTS_DIR)
    shutil.rmtree(ds)  # the run stopped and removed its staging area
    gone = f"{ds / PARTS_DIR} is no longer the staging folder this run created"
    with pytest.raises(SftDataError, match=re.escape(gone)):
        write_shard(jobs[0], "uint32", str(ds), str(ds / PARTS_DIR), "out", None, stage_id)
    assert list((tmp_path / "out").iterdir()) == []
    victim = tmp_path / "victim"  # a link planted at the removed name, to a folder shaped like it
    (victim / PARTS_DIR).mkdir(parents=True)
    (victim / "train").mkdir()
    ds.symlink_to(victim)
    with pytest.raises(SftDataError, match=re.escape(gone)):
        write_shard(jobs[0], "uint32", str(ds), str(ds / PARTS_DIR), "out", None, stage_id)
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == [PARTS_DIR, "train"]


def test_a_writer_never_creates_a_parent_folder(tmp_path):
    """The split writer makes its split's folder and its shards' only: below a folder that
    is gone, nothing is created (a worker of a stopped run cannot re-create its staging)."""
    w = SplitWriter(tmp_path / "gone" / "part_000001.tmp-1-abcdef01", "s", np.dtype(np.uint32), 100)
    with pytest.raises(FileNotFoundError):
        w.add_many(np.ones(3, np.uint32), np.ones(3, np.uint8), [3], [0])
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "s").symlink_to(tmp_path / "gone")  # a link where the split's folder goes: refused
    w = SplitWriter(tmp_path / "here", "s", np.dtype(np.uint32), 100)
    with pytest.raises(OutputExistsError, match=r"here/s is not a folder sftdata made \(a link or a file stands "
                                                r"there\); sftdata never writes through it"):
        w.add_many(np.ones(3, np.uint32), np.ones(3, np.uint8), [3], [0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]
