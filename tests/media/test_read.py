"""A media reference resolved to its bytes: relative paths against the record file's folder or
the media root, file:// and data: URLs, fsspec URLs; missing and unreadable ones named."""

from __future__ import annotations

import base64
import hashlib
from urllib.parse import quote

import pytest

from sftdata.media import MEDIA_MISSING, MEDIA_UNREADABLE, MediaError, read_media
from sftdata.media.read import resolve_path

PAYLOAD = b"\xff\xd8not really a jpeg\xff\xd9"
SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "data" / "imgs").mkdir(parents=True)
    (tmp_path / "root" / "imgs").mkdir(parents=True)
    (tmp_path / "data" / "imgs" / "a b.jpg").write_bytes(PAYLOAD)
    (tmp_path / "root" / "imgs" / "a b.jpg").write_bytes(PAYLOAD[::-1])
    return tmp_path


def test_a_relative_path_is_read_from_the_record_files_folder(tree):
    m = read_media("imgs/a b.jpg", base=tree / "data")
    assert (m.data, m.sha256, m.uri) == (PAYLOAD, SHA, str(tree / "data" / "imgs" / "a b.jpg"))


def test_the_media_root_wins_over_the_record_files_folder(tree):
    m = read_media("imgs/a b.jpg", base=tree / "data", media_root=tree / "root")
    assert (m.data, m.uri) == (PAYLOAD[::-1], str(tree / "root" / "imgs" / "a b.jpg"))


def test_absolute_paths_and_file_urls(tree):
    path = tree / "data" / "imgs" / "a b.jpg"
    assert read_media(str(path), base=tree / "root").data == PAYLOAD
    url = "file://" + quote(str(path))
    assert resolve_path(url) == path
    assert read_media(url, media_root=tree / "root").sha256 == SHA


def test_data_urls_base64_and_percent_encoded():
    b64 = "data:image/jpeg;base64," + base64.b64encode(PAYLOAD).decode()
    m = read_media(b64)
    assert (m.data, m.sha256, m.uri) == (PAYLOAD, SHA, "data:")
    assert read_media("data:," + quote(PAYLOAD)).data == PAYLOAD


def test_an_fsspec_url_is_read_through_fsspec():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/media-test/x.jpg", PAYLOAD)
    try:
        m = read_media("memory://media-test/x.jpg")
        assert (m.data, m.uri) == (PAYLOAD, "memory://media-test/x.jpg")
        with pytest.raises(MediaError, match=r"^memory://media-test/y.jpg: no object at memory://media-test/y.jpg$") as e:
            read_media("memory://media-test/y.jpg")
        assert e.value.reason == MEDIA_MISSING
    finally:
        fs.rm("/media-test", recursive=True)


def test_a_missing_file_is_media_missing(tree):
    with pytest.raises(MediaError, match=r"^imgs/none.jpg: no such file: .*/data/imgs/none.jpg \(a relative path is "
                                         r"read from the record file's folder, or from --media-root when given\)$") as e:
        read_media("imgs/none.jpg", base=tree / "data")
    assert (e.value.reason, e.value.where) == (MEDIA_MISSING, "imgs/none.jpg")


@pytest.mark.parametrize("ref,match", [
    ("imgs", r"^imgs: .*/data/imgs is a folder, not a media file$"),
    ("data:image/png;base64,@@@", r"^data:image/png;base64,@@@: the data: URL's base64 payload is invalid"),
    ("data:image/png;base64", r"^data:image/png;base64: a data: URL without ',' before its payload"),
    ("", r"^a media reference must be a non-empty string, got ''$"),
])
def test_unreadable_references(tree, ref, match):
    with pytest.raises(MediaError, match=match) as e:
        read_media(ref, base=tree / "data")
    assert e.value.reason == MEDIA_UNREADABLE


def test_a_file_over_the_limit_is_refused_unread(tree):
    with pytest.raises(MediaError, match=r"^imgs/a b.jpg: larger than 10 bytes, the most one media item may be$") as e:
        read_media("imgs/a b.jpg", base=tree / "data", max_bytes=10)
    assert e.value.reason == MEDIA_UNREADABLE


def test_a_long_data_url_is_named_by_its_start_only():
    ref = "data:image/png;base64," + "A" * 100 + "@"
    with pytest.raises(MediaError, match=r"^data:image/png;base64,A{26}\.\.\.: ") as e:
        read_media(ref)
    assert e.value.where == ref[:48] + "..."
