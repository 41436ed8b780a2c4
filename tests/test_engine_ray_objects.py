"""``pack`` and ``verify --engine ray`` of a dataset in object storage (moto's S3 server,
the fixtures of tests/test_store_objects.py): the same objects and report as ``--engine local``."""

from __future__ import annotations

import orjson
from test_store_objects import BUCKET, both, objects, s3, source  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine.pack_ray import ray_pack_executor
from sftdata.pack import PackOptions, pack

runner = CliRunner()


def test_ray_pack_and_verify_of_an_object_store_dataset_equal_local(ray_cluster, s3, both):  # noqa: F811
    """s3:// in and out (moto's server): the tasks read the driver's cached copy and write into its
    staging folder; the uploaded objects are those --engine local uploads, verify's report the same."""
    _, url = both
    opts = PackOptions(block_size=64, shard_tokens=300)
    local = pack(url, f"s3://{BUCKET}/ray/local", opts)
    ray = pack(url, f"s3://{BUCKET}/ray/ray", opts, executor=ray_pack_executor(shards_per_task=1))
    got, want = objects(s3, ray.output_dir), objects(s3, local.output_dir)
    assert got == want and len([k for k in got if k.endswith("tokens.bin")]) > 4
    a, b = runner.invoke(app, ["verify", ray.output_dir, "--json"]), runner.invoke(
        app, ["verify", ray.output_dir, "--json", "--engine", "ray"])
    assert (a.exit_code, b.exit_code) == (0, 0), b.output
    ja, jb = orjson.loads(a.stdout), orjson.loads(b.stdout)
    ja.pop("seconds"), jb.pop("seconds")
    assert ja == jb
