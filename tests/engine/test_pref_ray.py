"""``prepare-pref --engine ray`` / ``prepare-rl --engine ray``: prepare-chat's partitioned run
on the session's local Ray cluster (tasks read their own partitions, stage their rows and
write the final shards); this process decides on each record from what they send back, so
the dataset is the one ``--engine local`` writes, byte for byte (rejects, duplicates, the
split)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine.prepare_ray import ray_prepare_executor
from sftdata.pref import PrefOptions
from sftdata.pref.verify import verify_rows
from sftdata.prepare import pool, prepare_pref
from tests.helpers.data import write_jsonl
from tests.helpers.pref_records import kto_rows as _kto
from tests.helpers.pref_records import pair_rows as _pairs
from tests.helpers.pref_records import prompt_rows as _prompts
from tests.helpers.pref_records import tree_bytes

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
    assert verify_rows(tmp_path / "ray").ok


def test_the_command_runs_on_ray_and_refuses_a_ray_address_without_it(ray_cluster, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", _pairs(12))
    r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(tmp_path / "ds"), "--engine", "ray", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows"] == {"train": 11}  # the bad record left out; the duplicate kept (--dedup off)
    r = runner.invoke(app, ["prepare-rl", str(src), "-o", str(tmp_path / "rl"), "--ray-address", "auto"])
    assert r.exit_code == 2 and "--ray-address needs --engine ray" in r.output
