"""export of a dataset with images: an ``images`` column beside input_ids / labels, each
episode's image uris in token order, or with ``--media-bytes`` Hugging Face's Image layout
({bytes, path}) holding the bytes, checked against the recorded sha256."""

from __future__ import annotations

import base64
import json

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import DatasetError
from sftdata.interop.export import EPISODE_COLUMNS, ExportOptions, export
from tests.helpers.media_dataset import media_dataset

pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return media_dataset(tmp_path_factory.mktemp("media"), [[(56, 56), (100, 200)], [(300, 120)], []])


def _uris(built):
    return [[str(p) for p in paths] for paths in built.images]


def test_parquet_has_each_episodes_image_uris(built, tmp_path):
    report = export(built.root, tmp_path / "out")
    assert report.columns == [*EPISODE_COLUMNS, "images"] and report.notes == []
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert table.column_names == report.columns and str(table.schema.field("images").type) == "list<element: string>"
    assert table.column("images").to_pylist() == _uris(built)
    ids = table.column("input_ids").to_pylist()[0]
    assert ids[28:32] == [built.image_pad] * 4 and table.column("labels").to_pylist()[0][28:32] == [-100] * 4


def test_jsonl_has_the_uris_and_media_bytes_the_bytes(built, tmp_path):
    export(built.root, tmp_path / "uris", ExportOptions(format="jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "uris" / "train.jsonl").read_text().splitlines()]
    assert [r["images"] for r in rows] == _uris(built)
    export(built.root, tmp_path / "bytes", ExportOptions(format="jsonl", media_bytes=True))
    rows = [json.loads(line) for line in (tmp_path / "bytes" / "train.jsonl").read_text().splitlines()]
    assert [[(c["path"], base64.b64decode(c["bytes"])) for c in r["images"]] for r in rows] == \
        [[(str(p), p.read_bytes()) for p in paths] for paths in built.images]


def test_parquet_media_bytes_is_the_image_layout(built, tmp_path):
    report = export(built.root, tmp_path / "out", ExportOptions(media_bytes=True))
    table = pq.read_table(tmp_path / "out" / "train.parquet")
    assert str(table.schema.field("images").type) == "list<element: struct<bytes: binary, path: string>>"
    assert table.column("images").to_pylist() == [[{"bytes": p.read_bytes(), "path": str(p)} for p in paths]
                                                  for paths in built.images]
    assert report.as_dict()["columns"][-1] == "images"


def test_media_bytes_refuses_a_changed_or_missing_image(tmp_path):
    ds = media_dataset(tmp_path, [[(56, 56)]])
    path = ds.images[0][0]
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(DatasetError, match=rf"--media-bytes: {path} has sha256 [0-9a-f]{{16}}\.\.\., the dataset "
                                           rf"recorded [0-9a-f]{{16}}\.\.\.: it changed since prepare read it"):
        export(ds.root, tmp_path / "a", ExportOptions(media_bytes=True))
    path.unlink()
    with pytest.raises(DatasetError, match=rf"--media-bytes: {path} cannot be read again \(media_missing: "):
        export(ds.root, tmp_path / "b", ExportOptions(media_bytes=True))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert export(ds.root, tmp_path / "c").columns[-1] == "images"  # the uris need no file


def test_the_cli_takes_media_bytes(built, tmp_path):
    r = CliRunner().invoke(app, ["export", str(built.root), "-o", str(tmp_path / "out"), "--format", "jsonl",
                                 "--media-bytes", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["columns"] == [*EPISODE_COLUMNS, "images"]
    first = json.loads((tmp_path / "out" / "train.jsonl").read_text().splitlines()[0])
    assert first["images"][0]["path"] == str(built.images[0][0])


def test_a_damaged_media_table_refuses_the_export_by_name(tmp_path):
    from tests.helpers.media_dataset import reseal

    ds = media_dataset(tmp_path, [[(56, 56)]])
    table = ds.root / "train" / "shard_00000" / "media.jsonl"
    table.write_text("junk\n")
    reseal(ds.root, "train/shard_00000", "media.jsonl")
    with pytest.raises(DatasetError, match=r"train/shard_00000/media.jsonl \(line 1 of media.jsonl\): line 1 is not "
                                           r"JSON\. To fix: restore it"):
        export(ds.root, tmp_path / "out")
    assert not (tmp_path / "out").exists()
