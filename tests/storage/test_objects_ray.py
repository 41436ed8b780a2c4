"""``pack`` and ``verify --engine ray`` of a dataset in object storage (moto's S3 server in a
thread, as tests/store/test_objects.py): the same objects and report as ``--engine local``.
A bucket of its own, removed at the end (moto's state outlives its server in this process)."""

from __future__ import annotations

import os

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine import ray_engine
from sftdata.engine.prepare_ray import ray_prepare_executor
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import chat, write_jsonl
from tests.helpers.moto_s3 import count_coordinator, moto_s3, objects

runner = CliRunner()
BUCKET = "sftdata-ray-test"


@pytest.fixture(scope="module")
def s3():
    with moto_s3(BUCKET) as fs:
        yield fs


def test_ray_pack_and_verify_of_an_object_store_dataset_equal_local(ray_cluster, s3, tmp_path):
    """s3:// in and out: the tasks read the driver's cached copy and write into its staging
    folder; the uploaded objects are those --engine local uploads, verify's report the same."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i} " * (i % 7 + 1)) for i in range(60)])
    url = f"s3://{BUCKET}/sft/ds"
    prepare([src], url, PrepareOptions(val_split=0.2, shard_tokens=400))
    opts = PackOptions(block_size=64, shard_tokens=300)
    local = pack(url, f"s3://{BUCKET}/sft/local", opts)
    ray = pack(url, f"s3://{BUCKET}/sft/ray", opts, executor=ray_engine(shards_per_task=1))
    got, want = objects(s3, ray.output_dir), objects(s3, local.output_dir)
    assert got == want and len([k for k in got if k.endswith("tokens.bin")]) > 4
    a, b = runner.invoke(app, ["verify", ray.output_dir, "--json"]), runner.invoke(
        app, ["verify", ray.output_dir, "--json", "--engine", "ray"])
    assert (a.exit_code, b.exit_code) == (0, 0), b.output
    ja, jb = orjson.loads(a.stdout), orjson.loads(b.stdout)
    ja.pop("seconds"), jb.pop("seconds")
    assert ja == jb


def test_ray_tasks_put_the_shards_and_the_driver_only_the_metadata(ray_cluster, s3, tmp_path, monkeypatch):
    """prepare --engine ray to s3://: each write_shard task puts its shard's objects itself
    (the endpoint and keys given to the tasks as environment variables); the driver sends
    the metadata objects alone; the objects are those one local process writes."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i} " * (i % 7 + 1)) for i in range(60)])
    opts = PrepareOptions(val_split=0.2, shard_tokens=400)
    prepare([src], tmp_path / "local", opts)
    want = {p.relative_to(tmp_path / "local").as_posix(): p.read_bytes()
            for p in sorted((tmp_path / "local").rglob("*")) if p.is_file()}
    counted = count_coordinator(monkeypatch)
    env = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                                      "AWS_ENDPOINT_URL")}
    url = f"s3://{BUCKET}/sft/direct"
    prepare([src], url, opts, executor=ray_prepare_executor(task_env=env))
    got = objects(s3, url)
    assert got == want and len([k for k in got if k.endswith("tokens.bin")]) == 4
    (fs,) = counted
    root = f"{BUCKET}/sft/direct/"
    assert {k.removeprefix(root): n for k, n in fs.sent.items() if k.startswith(root)} == {
        k: len(v) for k, v in got.items() if not k.startswith(("train/", "val/"))}
