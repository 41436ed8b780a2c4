"""A video's frame count, frame rate and size read from its container equal what transformers
reads when a processor is handed that video (``load_video(..., backend="pyav")``'s metadata),
without a pixel decoded; a video that ends early, or bytes no demuxer accepts, is one
media_unreadable."""

from __future__ import annotations

import io
import sys
from fractions import Fraction

import pytest

from sftdata.errors import InputError
from sftdata.media import MEDIA_UNREADABLE, MediaError, VideoInfo, video_info
from tests.helpers.vision import encode_video as made_video

av = pytest.importorskip("av")
np = pytest.importorskip("numpy")


def encode_video(tmp_path, frames, fps, width, height, fmt="mp4", codec="libx264", options=None) -> bytes:
    return made_video(tmp_path / f"made.{fmt}", frames, fps, width, height, fmt, codec, options)


def _transformers_metadata(tmp_path, data: bytes, suffix: str):
    video_utils = pytest.importorskip("transformers.video_utils")
    path = tmp_path / f"given{suffix}"
    path.write_bytes(data)
    _, meta = video_utils.load_video(str(path), backend="pyav")
    return meta


CASES = [  # (frames, fps, width, height, container, codec, muxer options)
    (48, 24, 64, 48, "mp4", "libx264", None),
    (30, Fraction(30000, 1001), 96, 64, "mp4", "libx264", {"movflags": "faststart"}),
    (9, 2, 40, 72, "mp4", "mpeg4", None),
    (25, 10, 128, 32, "mov", "libx264", None),
    (36, 12, 48, 48, "avi", "mpeg4", None),
    (40, 5, 80, 60, "avi", "mpeg4", None),
]


@pytest.mark.parametrize("frames, fps, width, height, fmt, codec, options", CASES)
def test_the_container_read_equals_transformers_pyav_metadata(tmp_path, frames, fps, width, height, fmt, codec,
                                                                options):
    data = encode_video(tmp_path, frames, fps, width, height, fmt, codec, options)
    meta = _transformers_metadata(tmp_path, data, f".{fmt}")
    got = video_info(data, "clip")
    assert got == VideoInfo(frames=meta.total_num_frames, fps=meta.fps, width=meta.width, height=meta.height)
    assert got == VideoInfo(frames=frames, fps=float(fps), width=width, height=height)


@pytest.mark.parametrize("fmt, codec", [("matroska", "libx264"), ("webm", "libvpx-vp9")])
def test_a_container_without_a_frame_count_has_its_packets_counted(tmp_path, fmt, codec):
    """Matroska / WebM record no frame count (transformers' PyAV reader reads 0 there): the
    packets demuxed are the frames decoded."""
    data = encode_video(tmp_path, 21, 7, 64, 48, fmt, codec)
    with av.open(io.BytesIO(data)) as c:
        assert c.streams.video[0].frames == 0
        decoded = sum(1 for _ in c.decode(video=0))
    assert decoded == 21
    assert video_info(data, "clip") == VideoInfo(frames=21, fps=7.0, width=64, height=48)


TRUNCATED = [
    ("mp4", "libx264", None, "its 'mdat' box needs"),
    ("mp4", "libx264", {"movflags": "faststart"}, "its 'mdat' box needs"),
    ("avi", "mpeg4", None, "its RIFF header says"),
    ("matroska", "libx264", None, "its Segment says"),
    ("webm", "libvpx-vp9", None, "its Segment says"),
]


@pytest.mark.parametrize("fmt, codec, options, why", TRUNCATED)
@pytest.mark.parametrize("keep", [0.5, 0.98])
def test_a_truncated_video_is_media_unreadable(tmp_path, fmt, codec, options, why, keep):
    data = encode_video(tmp_path, 30, 10, 64, 48, fmt, codec, options)
    cut = data[:int(len(data) * keep)]
    with pytest.raises(MediaError, match=f"a video that ends early: {why} .* the file is truncated") as e:
        video_info(cut, "clip.bin")
    assert (e.value.reason, e.value.where) == (MEDIA_UNREADABLE, "clip.bin")


def test_a_frame_count_the_packets_fall_short_of_is_media_unreadable(tmp_path):
    """An MP4 whose boxes fit but whose sample table promises more frames than its bytes hold
    (its mdat box shortened, the rest kept whole)."""
    data = encode_video(tmp_path, 30, 10, 64, 48, "mp4", "libx264", {"movflags": "faststart"})
    at = data.index(b"mdat") - 4
    size = int.from_bytes(data[at:at + 4], "big")
    keep = size // 2
    cut = data[:at] + keep.to_bytes(4, "big") + data[at + 4:at + keep]
    with pytest.raises(MediaError, match=r"its container records 30 frames, its bytes hold \d+ ") as e:
        video_info(cut, "clip.mp4")
    assert e.value.reason == MEDIA_UNREADABLE


@pytest.mark.parametrize("data", [b"", b"garbage" * 50, b"\x00" * 1000], ids=["empty", "text", "zeros"])
def test_bytes_no_demuxer_accepts_are_media_unreadable(data):
    with pytest.raises(MediaError, match=r"^clip\.mp4: no video demuxer accepts these bytes \([\d,]+ bytes\): ") as e:
        video_info(data, "clip.mp4")
    assert e.value.reason == MEDIA_UNREADABLE


def test_a_file_without_a_video_stream_is_media_unreadable(tmp_path):
    path = tmp_path / "audio.wav"
    with av.open(str(path), "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), dtype=np.int16), format="s16", layout="mono")
        frame.sample_rate = 8000
        out.mux(stream.encode(frame))
        out.mux(stream.encode())
    with pytest.raises(MediaError, match="a wav file with no video stream") as e:
        video_info(path.read_bytes(), "a.wav")
    assert e.value.reason == MEDIA_UNREADABLE


def test_without_pyav_one_line_names_the_vision_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(InputError, match=r"^reading videos needs PyAV: pip install 'sftdata\[vision\]' \(or pip "
                                         r"install av\)$"):
        video_info(b"\x00" * 16, "clip.mp4")
