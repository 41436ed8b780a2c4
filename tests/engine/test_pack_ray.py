"""``pack --engine ray``: the packed dataset ``--engine local`` gives, byte for byte, for any
number of tasks, and the same errors; survives a killed worker. On the session's local
Ray cluster (2 CPUs, tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine import ray_engine
from sftdata.errors import NothingToTrainError, OutputExistsError
from sftdata.pack import PackOptions, pack
from sftdata.pack.tasks import MIN_PIECE_ROWS, plan_slice, row_tasks, shard_ranges
from sftdata.packing.strategies import plan_bfd
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import random_conversation
from tests.helpers.engines import kill_first_writer, same_dataset
from tests.helpers.zoo import trl_model_folder

runner = CliRunner()
@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(0)
    (d / "chats.jsonl").write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i, 60, 80)) for i in range(400)) + b"\n")
    prepare([d / "chats.jsonl"], d / "ds", PrepareOptions(val_split=0.2, seed=3, workers=1, shard_tokens=5000))
    return d / "ds"


def report_without_timing(r) -> dict:
    d = r.as_dict(timing=False)
    d.pop("output_dir")
    return d


@pytest.mark.parametrize("opts, per_task, rows", [
    (PackOptions(block_size=128, shard_tokens=1000), None, None),  # 7 rows per shard, tasks of several shards
    (PackOptions(block_size=128, shard_tokens=1000), 1, None),  # one shard per task
    (PackOptions(block_size=64, overlong="split", seed=5, shard_tokens=700), 3, None),
    (PackOptions(block_size=100, overlong="keep_end", shard_tokens=50_000), 1, None),  # one shard per split
    (PackOptions(block_size=96, strategy="stream", shard_tokens=1000), 2, None),  # injected context, cut episodes
    (PackOptions(block_size=150, overlong="drop", shard_tokens=302), 1, None),  # lossy: the warning and the hint
    # tasks over part of a shard, merged: one shard per split cut by default (fewer shards than 4 per CPU)
    (PackOptions(block_size=100, overlong="keep_end", shard_tokens=50_000), None, None),
    (PackOptions(block_size=100, overlong="keep_end", shard_tokens=50_000), None, 37),  # pieces of 37 rows
    (PackOptions(block_size=64, overlong="split", seed=5, shard_tokens=4000), None, 11),  # several shards, cut
    (PackOptions(block_size=96, strategy="stream", shard_tokens=200_000), None, 29),  # cut episodes across pieces
])
def test_ray_pack_is_byte_identical_to_local(ray_cluster, source, tmp_path, opts, per_task, rows):
    local = pack(source, tmp_path / "local", opts)
    ray = pack(source, tmp_path / "ray", opts, executor=ray_engine(shards_per_task=per_task,
                                                                          rows_per_task=rows))
    same_dataset(tmp_path / "local", tmp_path / "ray")
    assert report_without_timing(local) == report_without_timing(ray)
    shards = len(list((tmp_path / "ray" / "train").iterdir()))
    assert shards == 1 if opts.shard_tokens >= 50_000 else shards >= 4
    assert local.warnings == ray.warnings and len(ray.warnings) == 2  # every split loses trained tokens here
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "ray"]  # no staging, no _parts left
    assert not list((tmp_path / "ray").rglob("_parts"))


def test_plan_slices_and_shard_ranges_cover_the_plan(source):
    lengths = np.array([5, 9, 3, 12, 7, 2, 8, 4, 6, 11], np.int64)
    plan = plan_bfd(lengths, 13, "split", 0)
    parts = [plan_slice(plan, r0, min(plan.num_rows, r0 + 2)) for r0 in range(0, plan.num_rows, 2)]
    assert [p.num_rows for p in parts] == [2] * (plan.num_rows // 2) + [1] * (plan.num_rows % 2)
    assert np.array_equal(np.concatenate([p.segments.row + 2 * k for k, p in enumerate(parts)]), plan.segments.row)
    assert np.array_equal(np.concatenate([p.segments.episode for p in parts]), plan.segments.episode)
    assert shard_ranges(100, 7, 2) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12), (12, 14), (14, 15)]
    assert shard_ranges(100, 7, 2, shards_per_task=5) == [(0, 5), (5, 10), (10, 15)]
    assert shard_ranges(0, 7, 2) == []


def test_row_tasks_cut_shards_into_pieces_only_when_there_are_too_few():
    assert row_tasks(100, 7, 2) == [(k0, k1, [(7 * k0, min(100, 7 * k1))]) for k0, k1 in shard_ranges(100, 7, 2)]
    assert row_tasks(100, 7, 2, shards_per_task=5) == [(0, 5, [(0, 35)]), (5, 10, [(35, 70)]), (10, 15, [(70, 100)])]
    # 2 shards of 300 rows on 2 CPUs: fewer than 4 per CPU, so pieces of 75 rows (at least MIN_PIECE_ROWS)
    assert row_tasks(600, 300, 2) == [(0, 1, [(0, 75), (75, 150), (150, 225), (225, 300)]),
                                      (1, 2, [(300, 375), (375, 450), (450, 525), (525, 600)])]
    assert row_tasks(100, 90, 2) == [(0, 1, [(0, MIN_PIECE_ROWS), (MIN_PIECE_ROWS, 90)]), (1, 2, [(90, 100)])]
    assert row_tasks(100, 90, 2, rows_per_task=40) == [(0, 1, [(0, 40), (40, 80), (80, 90)]), (1, 2, [(90, 100)])]
    assert row_tasks(100, 90, 2, rows_per_task=90) == [(0, 1, [(0, 90)]), (1, 2, [(90, 100)])]  # whole shards
    assert row_tasks(0, 7, 2) == []


def test_the_cli_packs_on_ray(ray_cluster, source, tmp_path):
    args = ["pack", str(source), "-b", "128", "--shard-tokens", "1000", "--json", "--quiet"]
    r = runner.invoke(app, [*args, "-o", str(tmp_path / "ray"), "--engine", "ray"])
    assert r.exit_code == 0, r.output
    loc = runner.invoke(app, [*args, "-o", str(tmp_path / "local"), "--engine", "local"])
    assert loc.exit_code == 0, loc.output
    same_dataset(tmp_path / "local", tmp_path / "ray")
    a, b = orjson.loads(r.stdout), orjson.loads(loc.stdout)
    for d in (a, b):
        d.pop("seconds"), d.pop("output_dir")
    assert a == b
    r = runner.invoke(app, [*args, "-o", str(tmp_path / "x"), "--ray-address", "auto"])
    assert (r.exit_code, r.output.strip()) == (2, "error: --ray-address needs --engine ray")


@pytest.mark.parametrize("opts, pattern, executor", [
    (PackOptions(block_size=64, shard_tokens=300), "train_*.tmp-*", dict(shards_per_task=1)),
    # a task over part of a shard: its piece is built again, the merge reads the retry's
    (PackOptions(block_size=64, shard_tokens=50_000), "train_*_row_*.tmp-*", dict(rows_per_task=40)),
])
def test_a_killed_pack_worker_is_retried_and_the_output_is_the_same(ray_cluster, source, tmp_path, opts, pattern,
                                                                   executor):
    """A worker process killed (SIGKILL) while its task writes rows: Ray runs the task
    again, the dead attempt's partial shards are never adopted, the dataset is identical."""
    pack(source, tmp_path / "local", opts)
    with kill_first_writer(tmp_path, f".ray*/_parts/{pattern}") as killed:
        pack(source, tmp_path / "ray", opts, executor=ray_engine(**executor))
    assert len(killed) == 1
    same_dataset(tmp_path / "local", tmp_path / "ray")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "ray"]


def test_errors_of_a_ray_pack_are_those_of_a_local_one(ray_cluster, source, tmp_path):
    opts = PackOptions(block_size=3, overlong="drop")  # every episode is longer than a row: 0 rows for train
    with pytest.raises(NothingToTrainError) as local:
        pack(source, tmp_path / "l", opts)
    with pytest.raises(NothingToTrainError) as ray:
        pack(source, tmp_path / "l", opts, executor=ray_engine())
    assert str(ray.value) == str(local.value)
    assert str(local.value).startswith("pack would write 0 rows for train: --overlong drop leaves out all ")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("x")
    with pytest.raises(OutputExistsError) as local:
        pack(source, tmp_path / "taken", PackOptions())
    with pytest.raises(OutputExistsError) as ray:
        pack(source, tmp_path / "taken", PackOptions(), executor=ray_engine())
    assert str(ray.value) == str(local.value) == (f"{tmp_path / 'taken'} already exists; pass --overwrite to "
                                                  f"replace it, or choose another --output-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]



THINK = {"messages": [{"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4.", "reasoning_content": "add them"},
                      {"role": "user", "content": "3+3?"},
                      {"role": "assistant", "content": "6.", "reasoning_content": "add again"}]}


@pytest.mark.parametrize("per_task, rows", [(1, None), (None, 3)])
def test_ray_pack_of_flagged_episodes_is_byte_identical_to_local(ray_cluster, tmp_path, per_task, rows):
    """Episodes flagged "last reply only" (Qwen3's template, earlier reasoning): the flags
    travel per segment into last_reply.bin, whole shards or shards merged from pieces."""
    model = trl_model_folder(tmp_path / "model", "qwen3", [THINK])
    if model is None:
        pytest.skip("trl ships no qwen3.jinja")
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(THINK if i % 4 == 0 else random_conversation(np.random.default_rng(i), i,
                                                                                         5, 12)) for i in range(60)))
    prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(model), shard_tokens=2000))
    opts = PackOptions(block_size=128, shard_tokens=600)
    pack(tmp_path / "ds", tmp_path / "local", opts)
    pack(tmp_path / "ds", tmp_path / "ray", opts, executor=ray_engine(shards_per_task=per_task,
                                                                               rows_per_task=rows))
    same_dataset(tmp_path / "local", tmp_path / "ray")
    meta = orjson.loads((tmp_path / "ray" / "dataset_metadata.json").read_bytes())
    assert meta["format_version"] == 3 and meta["splits"]["train"]["last_reply_only"] == 30  # 15 records, 2 each


@pytest.mark.parametrize("per_task, rows", [(1, None), (None, 2)])
def test_ray_pack_of_a_dataset_with_images_is_byte_identical_to_local(ray_cluster, tmp_path, per_task, rows):
    """Each packed shard's media table is the same whichever engine built the rows (whole
    shards, or shards merged from pieces)."""
    from tests.helpers.media_dataset import media_dataset

    built = media_dataset(tmp_path, [[(56, 56), (100, 200)], [(300, 120)], [], [(56, 56)] * 3] * 6)
    opts = PackOptions(block_size=255, shard_tokens=600)
    pack(built.root, tmp_path / "local", opts)
    pack(built.root, tmp_path / "ray", opts, executor=ray_engine(shards_per_task=per_task, rows_per_task=rows))
    same_dataset(tmp_path / "local", tmp_path / "ray")
    meta = orjson.loads((tmp_path / "ray" / "dataset_metadata.json").read_bytes())
    assert meta["format_version"] == 4 and meta["media"] == {"items": 36, "images": 36, "videos": 0, "tokens": 528}
    assert len(meta["splits"]["train"]["shards"]) >= 3
