"""pack's build key: the source's metadata and the packing options; an unchanged pack is up
to date and touches nothing, a changed source or option is named."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from sftdata.errors import OutputExistsError
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage.lock import OWNER_FILE, owner_record
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


def test_an_up_to_date_pack_sweeps_what_a_dead_run_left_beside_it(tmp_path, episodes):
    """Issue 44.5 for pack: a staging folder whose owner record names a dead process goes on
    the up-to-date rerun (said in one warning); a live run's and a user's folder stay."""
    _, ds = episodes
    pack(ds, tmp_path / "p", PackOptions(block_size=64))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".p.tmp-{dead.pid}-0badc0de"
    stale.mkdir()
    (stale / OWNER_FILE).write_bytes(orjson.dumps(owner_record() | {"target": "p", "kind": "staging",
                                                                     "pid": dead.pid}))
    (stale / "tokens.bin").write_bytes(b"\0" * 100)
    live = tmp_path / f".p.tmp-{os.getpid()}-0000beef"
    live.mkdir()
    (live / OWNER_FILE).write_bytes(orjson.dumps(owner_record() | {"target": "p", "kind": "staging"}))
    users = tmp_path / ".p.tmp-2024-05"
    users.mkdir()
    before = _files(tmp_path / "p")
    assert pack(ds, tmp_path / "p", PackOptions(block_size=64)).up_to_date
    assert _files(tmp_path / "p") == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".p.")) == sorted([live.name, users.name])
