"""The media step of a chunk (prepare/media.py): each reference read from the record file's
folder (or --media-root), counted under the pinned settings, once per chunk; a bad item is
its record's reject, naming the reference; a video is read from its container and counted for
the Qwen family, refused by name for the others."""

from __future__ import annotations

from pathlib import Path

import pytest

import sftdata.prepare.media as media_step
from sftdata.errors import RecordError
from sftdata.media import VideoInfo, image_count, settings_from_dicts, video_count
from sftdata.prepare.media import MediaStep, record_base
from sftdata.records.turns import MEDIA_MARK, Conversation, MediaRef, Turn
from tests.helpers.vision import QWEN2_5_VL, encode_image, encode_video
from tests.helpers.vision_families import FAMILIES


def _conv(text: str, *refs: str, kind: str = "image") -> Conversation:
    return Conversation(turns=(Turn("user", text, media=tuple(MediaRef(kind, r) for r in refs)),
                               Turn("assistant", "x")))


@pytest.fixture
def data(tmp_path) -> Path:
    (tmp_path / "portrait.jpg").write_bytes(encode_image(300, 640))
    (tmp_path / "rotated.jpg").write_bytes(encode_image(400, 240, orientation=6))
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "portrait.jpg").read_bytes()[:600])
    clip = encode_video(tmp_path / "clip.mp4", 20, 10, 96, 64)
    (tmp_path / "cut.mp4").write_bytes(clip[:len(clip) // 2])
    return tmp_path


SETTINGS = settings_from_dicts(QWEN2_5_VL)


def test_an_item_is_read_hashed_and_counted_as_shown(data):
    where = f"{data / 'records.jsonl'}:line 2"
    got = MediaStep(SETTINGS).record_media(_conv(f"{MEDIA_MARK}{MEDIA_MARK}", "rotated.jpg", "portrait.jpg"), where)
    rotated = got[MediaRef("image", "rotated.jpg")]
    assert (rotated.uri, rotated.size, rotated.stored) == (str(data / "rotated.jpg"), (240, 400), (400, 240))
    assert rotated.count == image_count(SETTINGS, 240, 400)
    assert rotated.nbytes == (data / "rotated.jpg").stat().st_size
    assert MediaStep(SETTINGS).record_media(_conv("no media"), where) is None


def test_media_root_wins_over_the_records_folder(data, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    got = MediaStep(SETTINGS, str(data)).record_media(_conv(MEDIA_MARK, "portrait.jpg"),
                                                      f"{elsewhere / 'r.jsonl'}:line 1")
    assert got[MediaRef("image", "portrait.jpg")].uri == str(data / "portrait.jpg")


def test_bad_media_rejects_the_record_by_name(data):
    step = MediaStep(SETTINGS)
    where = f"{data / 'records.jsonl'}:line 4"
    with pytest.raises(RecordError, match=r"^.*line 4: image nothere\.png: no such file: .*nothere\.png") as e:
        step.record_media(_conv(f"{MEDIA_MARK}?", "nothere.png"), where)
    assert e.value.reason == "media_missing" and e.value.where == where
    with pytest.raises(RecordError, match=r"image cut\.jpg: ") as e:
        step.record_media(_conv(f"{MEDIA_MARK}?", "cut.jpg"), where)
    assert e.value.reason == "media_unreadable"
    with pytest.raises(RecordError, match=r"line 4: video cut\.mp4: a video that ends early: its 'mdat' box needs ") as e:
        step.record_media(_conv(f"{MEDIA_MARK}?", "cut.mp4", kind="video"), where)
    assert e.value.reason == "media_unreadable"
    (data / "thin.png").write_bytes(encode_image(1000, 4, fmt="PNG"))
    with pytest.raises(RecordError, match=r"image thin\.png: an image of 1000x4: the Qwen-VL processor refuses") as e:
        step.record_media(_conv(f"{MEDIA_MARK}?", "thin.png"), where)
    assert e.value.reason == "media_unsupported"


def test_a_video_is_read_from_its_container_and_counted(data):
    where = f"{data / 'records.jsonl'}:line 3"
    got = MediaStep(SETTINGS).record_media(_conv(f"{MEDIA_MARK}?", "clip.mp4", kind="video"), where)
    clip = got[MediaRef("video", "clip.mp4")]
    assert (clip.kind, clip.uri, clip.size, clip.stored) == ("video", str(data / "clip.mp4"), (96, 64), (96, 64))
    assert clip.count == video_count(SETTINGS, VideoInfo(frames=20, fps=10.0, width=96, height=64))
    assert clip.count.frames == 20 and clip.count.grid == (10, 4, 6)


def test_a_video_under_a_family_without_video_is_refused_by_name(data):
    gemma = settings_from_dicts(FAMILIES["gemma3"].image, FAMILIES["gemma3"].processor)
    with pytest.raises(RecordError, match=r"line 1: video clip\.mp4: Gemma 3 takes no video in sftdata: video is "
                                          r"counted for the Qwen family only; leave the video out of the record, or "
                                          r"give its frames as images$") as e:
        MediaStep(gemma).record_media(_conv(MEDIA_MARK, "clip.mp4", kind="video"), f"{data / 'r.jsonl'}:line 1")
    assert e.value.reason == "media_unsupported"


def test_identical_references_are_read_once_per_chunk(data, monkeypatch):
    reads = []
    real = media_step.read_media
    monkeypatch.setattr(media_step, "read_media", lambda ref, **kw: reads.append(ref) or real(ref, **kw))
    step = MediaStep(SETTINGS)
    where = f"{data / 'records.jsonl'}:line 1"
    conv = _conv(f"{MEDIA_MARK}{MEDIA_MARK}", "portrait.jpg", "portrait.jpg")
    step.record_media(conv, where)
    step.record_media(conv, where.replace("line 1", "line 2"))
    with pytest.raises(RecordError):
        step.record_media(_conv(MEDIA_MARK, "nothere.png"), where)
    with pytest.raises(RecordError):  # a bad item is remembered too
        step.record_media(_conv(MEDIA_MARK, "nothere.png"), where)
    assert reads == ["portrait.jpg", "nothere.png"]


def test_where_names_the_records_folder(tmp_path):
    assert record_base("data/x.jsonl:line 3") == "data"
    assert record_base("x.jsonl:line 3") == "."
    assert record_base("s3://bucket/dir/x.jsonl:line 3") == "s3://bucket/dir"
    assert Path(record_base(f"{tmp_path}/a.jsonl:row 0")) == tmp_path
