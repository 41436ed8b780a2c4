"""``prepare-pref --engine ray`` / ``prepare-rl --engine ray``: prepare-chat's partitioned run
on the session's local Ray cluster (tasks read their own partitions, stage their rows and
write the final shards); this process decides on each record from what they send back, so
the dataset is the one ``--engine local`` writes, byte for byte (rejects, duplicates, the
split)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine.prepare_ray import ray_prepare_executor
from sftdata.pref import PrefOptions
from sftdata.pref.run import RowFacts
from sftdata.prepare import PartSummary, driver, pool, prepare_pref
from sftdata.sources.partitions import RangeScan
from sftdata.tasks import RayTasks
from tests.helpers.data import write_jsonl
from tests.helpers.pairs import verify_every_row
from tests.helpers.pref_records import kto_rows as _kto
from tests.helpers.pref_records import mixed_rows, tree_bytes
from tests.helpers.pref_records import pair_rows as _pairs
from tests.helpers.pref_records import prompt_rows as _prompts

runner = CliRunner()


@pytest.mark.parametrize(("make", "rl"), [(_pairs, False), (_kto, False), (_prompts, True)],
                         ids=["pairs", "kto", "prompts"])
def test_ray_prepare_pref_is_byte_identical_to_local(ray_cluster, tmp_path, monkeypatch, make, rl):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)  # many chunks, more than the tasks in flight
    src = write_jsonl(tmp_path / "in.jsonl", make(23))
    opts = PrefOptions(val_split=0.3, seed=5, shard_tokens=90, dedup="exact", workers=1)
    local = prepare_pref([src], tmp_path / "local", opts, rl=rl)
    ray = prepare_pref([src], tmp_path / "ray", opts, rl=rl, executor=ray_prepare_executor())
    assert tree_bytes(tmp_path / "local") == tree_bytes(tmp_path / "ray")
    a, b = local.as_dict(), ray.as_dict()
    for k in ("seconds", "output_dir"):
        a.pop(k), b.pop(k)
    assert a == b and a["rejected"] == ({"not_preference_record": 1, "duplicate": 1} if make is _pairs else {})
    assert verify_every_row(tmp_path / "ray").ok


def _arrays_and_types(obj, arrays: list, types: set, seen: set) -> None:
    """Every numpy array and every type of object reachable from ``obj`` (what a task sent back)."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    types.add(type(obj).__name__)
    if isinstance(obj, np.ndarray):
        arrays.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _arrays_and_types(v, arrays, types, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            _arrays_and_types(v, arrays, types, seen)
    elif hasattr(obj, "__dict__"):
        _arrays_and_types(vars(obj), arrays, types, seen)


def test_pairs_on_ray_are_partitioned_the_coordinator_reads_no_record_and_gets_no_token(ray_cluster, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 3)
    src = write_jsonl(tmp_path / "in.jsonl", _pairs(23))
    opts = PrefOptions(val_split=0.3, seed=5, shard_tokens=90, dedup="exact", workers=1)
    local = prepare_pref([src], tmp_path / "local", opts)

    def no_reading(*_):
        raise AssertionError("the coordinator read the records itself")

    got, real = [], RayTasks.result
    monkeypatch.setattr(driver, "iter_all", no_reading)
    # what came back, as it came (the coordinator numbers the results in place afterwards)
    monkeypatch.setattr(RayTasks, "result", lambda self, ref, doing: got.append(pickle.loads(pickle.dumps(
        out := real(self, ref, doing)))) or out)
    ray = prepare_pref([src], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=1500))
    assert tree_bytes(tmp_path / "local") == tree_bytes(tmp_path / "ray")
    parts = [g for g in got if isinstance(g, PartSummary)]
    assert len(parts) == len([g for g in got if isinstance(g, RangeScan)]) + 1 > 2  # ranges: one scan each but the first
    assert sum(p.records for p in parts) == 23 and ray.records_read == 23
    # each partition's rows came back as facts (22: the bad record is a reject, the duplicate is decided here)
    assert all(type(p.result.rows) is RowFacts for p in parts)
    assert sum(p.result.rows.bits.shape[0] for p in parts) == 22 and sum(ray.rows.values()) == 21
    # and no token: a partition's arrays are its rows' lengths and records (1 byte each here: under 256 tokens, under
    # 256 records; the smallest type that holds them) and facts (2 bytes), and its keys' records (none: they stay)
    arrays, types = [], set()
    _arrays_and_types(parts, arrays, types, set())
    assert {a.dtype.name for a in arrays if a.size} == {"uint8"}
    assert sum(a.nbytes for a in arrays) == 22 * (1 + 1 + 2)
    # besides: the ranges' scans, the input's hash (a tuple), the duplicate keys' groups, the final shards' records
    assert "Row" not in types and {type(g).__name__ for g in got} == {"RangeScan", "PartSummary", "tuple", "BucketGroups",
                                                                      "dict"}
    assert (local.rows, local.rejected) == (ray.rows, ray.rejected) == ({"train": 15, "val": 6},
                                                                        {"duplicate": 1, "not_preference_record": 1})


def test_rows_of_two_kinds_are_decided_on_ray_as_here(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(pool, "CHUNK_RECORDS", 2)
    src = write_jsonl(tmp_path / "in.jsonl", mixed_rows(14, (3, 8, 9)))
    opts = PrefOptions(val_split=0.3, seed=5, shard_tokens=90, dedup="exact", workers=1)
    local = prepare_pref([src], tmp_path / "local", opts)
    ray = prepare_pref([src], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=700))
    assert tree_bytes(tmp_path / "local") == tree_bytes(tmp_path / "ray")
    assert local.rejected == ray.rejected == {"duplicate": 2, "mixed_kinds": 1}


def test_the_command_runs_on_ray_and_refuses_a_ray_address_without_it(ray_cluster, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", _pairs(12))
    r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(tmp_path / "ds"), "--engine", "ray", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == {"train": 11}  # the bad record left out; the duplicate kept (--dedup off)
    r = runner.invoke(app, ["prepare-rl", str(src), "-o", str(tmp_path / "rl"), "--ray-address", "auto"])
    assert r.exit_code == 2 and "--ray-address needs --engine ray" in r.output
