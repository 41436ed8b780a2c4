"""file:// URLs name datasets wherever a path does: prepare's output, the loader,
inspect, verify and replay-order; object-store URLs are tests/store/test_objects.py."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import DatasetError
from sftdata.loader import LoaderConfig, make_loader
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage.location import local_path, remote_url
from sftdata.store import open_dataset
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()


@pytest.mark.parametrize("given, want", [
    ("s3://b/sft", "s3://b/sft"), (Path("s3://b/sft/"), "s3://b/sft"), ("S3://b/sft", "s3://b/sft"),
    ("memory://x/ds", "memory://x/ds"), ("file:///data/sft", None), ("data/sft", None), ("C:/data", None),
])
def test_remote_url(given, want):
    assert remote_url(given) == want


@pytest.mark.parametrize("given, want", [
    ("file:///data/sft", "/data/sft"), ("file://localhost/data/sft", "/data/sft"), ("file:/data/sft", "/data/sft"),
    ("file:///data/my%20sft", "/data/my sft"), ("data/sft", "data/sft"), (Path("/x/y"), "/x/y"),
])
def test_local_path(given, want):
    assert local_path(given) == Path(want)


def test_other_urls_are_one_line():
    with pytest.raises(DatasetError, match=r"^s3://b/sft: this needs a local path or a file:// URL \(s3:// is not "
                                           r"supported here\); copy it to a folder \(or mount the bucket\) and give "
                                           r"its path$"):
        local_path("s3://b/sft")
    with pytest.raises(DatasetError, match=r"host 'other' is not this machine"):
        local_path("file://other/data")


def test_file_urls_everywhere(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(12)])
    url = (tmp_path / "ds").as_uri()
    assert url.startswith("file:///")
    summary = prepare([src], url, PrepareOptions(val_split=0.25))
    assert summary.output_dir == str(tmp_path / "ds") and open_dataset(url).split("train").num_episodes == 9
    loader = make_loader(LoaderConfig(batch_size=2, block_size=8), url, backend="numpy")
    assert loader.get_batch("train").x.shape == (2, 8)
    for args in (["inspect", url], ["verify", url], ["replay-order", url, "--batch-size", "2", "--step", "1"]):
        r = runner.invoke(app, [*args, "--json"])
        assert r.exit_code == 0, r.output
        json.loads(r.stdout)
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", (tmp_path / "cli").as_uri(), "-q"])
    assert r.exit_code == 0 and (tmp_path / "cli" / "dataset_metadata.json").is_file()
    r = runner.invoke(app, ["verify", "nosuch://bucket/sft"])
    assert r.exit_code == 1 and "nosuch://bucket/sft: nosuch:// is not a protocol fsspec knows (" in r.output
