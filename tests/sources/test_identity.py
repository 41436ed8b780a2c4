"""An input's identity (a file's stat, a URL's version) and the sha256 it stands for."""

from __future__ import annotations

import hashlib
import os

import pytest

from sftdata.sources import Input, identity
from sftdata.util.hashing import sha256_file
from sftdata.util.urls import object_version

HOUR_NS = 3600 * 10**9


def test_a_files_identity_is_its_stat_and_stdin_has_none(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"{}\n")
    st = os.stat(p)
    assert identity.look(Input(str(p))).identity == {"size": 3, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                                                     "ino": st.st_ino, "dev": st.st_dev}
    assert identity.look(Input("<stdin>", "stdin")).identity is None
    assert identity.look(Input(str(tmp_path / "gone.jsonl"))).identity is None


def test_a_stat_is_trusted_only_when_the_file_had_not_changed_for_a_while_before_the_commit():
    ident = {"size": 3, "mtime_ns": 10 * HOUR_NS, "ctime_ns": 10 * HOUR_NS}
    assert identity.trusted(ident, 11 * HOUR_NS)
    assert not identity.trusted(ident, 10 * HOUR_NS + identity.RACY_NS - 1)  # racily clean: hashed again
    assert not identity.trusted(ident, None) and not identity.trusted(None, 11 * HOUR_NS)
    assert identity.trusted({"size": 3, "ETag": "x"}, None)  # a URL's version names its content


def test_the_recorded_sha256_is_reused_while_the_identity_holds(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"{}\n")
    inp, looked = Input(str(p)), identity.look(Input(str(p)))
    written = max(looked.identity["mtime_ns"], looked.identity["ctime_ns"]) + HOUR_NS
    recorded = {"sha256": "f" * 64, "identity": looked.identity}
    assert identity.known_sha256(inp, looked, recorded, written) == ("f" * 64, False)
    assert identity.known_sha256(inp, looked, {**recorded, "identity": {}}, written) == (sha256_file(p), True)
    assert identity.known_sha256(inp, looked, None) == (sha256_file(p), True)
    assert identity.recordable(looked, identity.look(inp)) == looked.identity
    p.write_bytes(b"[]\n\n")
    assert identity.recordable(looked, identity.look(inp)) is None  # changed while it was read


def test_a_url_has_its_stores_version_and_is_hashed_by_streaming():
    fsspec = pytest.importorskip("fsspec", reason="the cloud extra (fsspec) is not installed")
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/ident/a.jsonl", b"{}\n")
    url = "memory://ident/a.jsonl"
    looked = identity.look(Input(url, "url"))
    assert looked.identity == object_version(fs.info("/ident/a.jsonl")) and "created" in looked.identity
    assert identity.content_sha256(Input(url, "url")) == hashlib.sha256(b"{}\n").hexdigest()
    # a URL read in part (Parquet) records no sha256: while its version holds it is known without a read, once it
    # changes it is unknown (the key then holds the new version)
    recorded = {"sha256": None, "identity": {"size": 1, "ETag": "old"}}
    assert identity.known_sha256(Input(url, "url"), looked, recorded) == (None, False)
    assert object_version({"size": 3}) is None  # the size alone tells no two versions apart

