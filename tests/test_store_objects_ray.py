"""``pack`` and ``verify --engine ray`` of a dataset in object storage (moto's S3 server in a
thread, as tests/test_store_objects.py): the same objects and report as ``--engine local``.
A bucket of its own, removed at the end (moto's state outlives its server in this process)."""

from __future__ import annotations

import logging
import os

import orjson
import pytest
from conftest import chat, write_jsonl
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine.pack_ray import ray_pack_executor
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare

runner = CliRunner()
BUCKET = "sftdata-ray-test"


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir(BUCKET)
    yield fs
    fs.rm(BUCKET, recursive=True)
    s3fs.S3FileSystem.clear_instance_cache()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def objects(fs, url: str) -> dict[str, bytes]:
    root = url.removeprefix("s3://")
    fs.invalidate_cache()
    return {p[len(root) + 1:]: fs.cat_file(p) for p in fs.find(root + "/")}


def test_ray_pack_and_verify_of_an_object_store_dataset_equal_local(ray_cluster, s3, tmp_path):
    """s3:// in and out: the tasks read the driver's cached copy and write into its staging
    folder; the uploaded objects are those --engine local uploads, verify's report the same."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i} " * (i % 7 + 1)) for i in range(60)])
    url = f"s3://{BUCKET}/sft/ds"
    prepare([src], url, PrepareOptions(val_split=0.2, shard_tokens=400))
    opts = PackOptions(block_size=64, shard_tokens=300)
    local = pack(url, f"s3://{BUCKET}/sft/local", opts)
    ray = pack(url, f"s3://{BUCKET}/sft/ray", opts, executor=ray_pack_executor(shards_per_task=1))
    got, want = objects(s3, ray.output_dir), objects(s3, local.output_dir)
    assert got == want and len([k for k in got if k.endswith("tokens.bin")]) > 4
    a, b = runner.invoke(app, ["verify", ray.output_dir, "--json"]), runner.invoke(
        app, ["verify", ray.output_dir, "--json", "--engine", "ray"])
    assert (a.exit_code, b.exit_code) == (0, 0), b.output
    ja, jb = orjson.loads(a.stdout), orjson.loads(b.stdout)
    ja.pop("seconds"), jb.pop("seconds")
    assert ja == jb
