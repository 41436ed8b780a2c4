"""pack's build key: the source's metadata and the packing options; an unchanged pack is up
to date and touches nothing, a changed source or option is named."""

from __future__ import annotations

import orjson
import pytest

from sftdata.errors import OutputExistsError
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.util.hashing import sha256_file
from tests.helpers.data import chat, write_jsonl


@pytest.fixture
def episodes(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i} " * (i + 1)) for i in range(12)])
    prepare([src], tmp_path / "ds", PrepareOptions(val_split=0.25))
    return src, tmp_path / "ds"


def _files(root) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}


def test_an_unchanged_pack_is_up_to_date_and_touches_nothing(tmp_path, episodes):
    _, ds = episodes
    first = pack(ds, tmp_path / "p", PackOptions(block_size=64))
    before = _files(tmp_path / "p")
    again = pack(ds, tmp_path / "p", PackOptions(block_size=64))
    assert again.up_to_date and again.build_key == first.build_key and _files(tmp_path / "p") == before
    assert again.as_dict(timing=False) == first.as_dict(timing=False)  # the report, from the metadata
    meta = orjson.loads((tmp_path / "p" / "dataset_metadata.json").read_bytes())
    assert meta["build"]["components"]["source"] == {"path": str(ds.resolve()),
                                                     "metadata_sha256": sha256_file(ds / "dataset_metadata.json")}


def test_a_changed_source_or_option_is_named_and_force_rebuilds(tmp_path, episodes):
    src, ds = episodes
    pack(ds, tmp_path / "p", PackOptions(block_size=64))
    with pytest.raises(OutputExistsError, match=r"not up to date: the option --strategy changed \("):
        pack(ds, tmp_path / "p", PackOptions(block_size=64, strategy="stream"))
    a = sha256_file(ds / "dataset_metadata.json")
    prepare([src], ds, PrepareOptions(val_split=0.5, overwrite=True))
    b = sha256_file(ds / "dataset_metadata.json")
    r = pack(ds, tmp_path / "p", PackOptions(block_size=64, overwrite=True))
    assert r.changed == [f"the source dataset changed (its dataset_metadata.json sha256 {a[:12]}... -> {b[:12]}...)"]
    forced = pack(ds, tmp_path / "p", PackOptions(block_size=64, force=True))
    assert not forced.up_to_date and forced.changed == ["--force rebuilds it whatever its build key says"]
