"""A video's frame count, frame rate and size from its container, without decoding a pixel, and
a check that its bytes are whole.

What transformers reads when a processor is handed a video (``video_utils.read_video_pyav``,
its default backend): the first video stream's ``frames``, ``average_rate``, ``width`` and
``height``, as the container records them; no rotation metadata is applied, so none is here.
A container that records no frame count (Matroska, WebM) has its packets counted by demuxing
(one packet a frame; no pixel decoded): transformers reads 0 frames there and cannot sample it.

The integrity check runs over the bytes that are hashed anyway, as ``header.py``'s does for
images: the container's top-level structure must fit the bytes (ISO BMFF boxes for MP4 / MOV,
the RIFF size for AVI, the Segment size for Matroska / WebM), every packet must demux, and a
container that records a frame count must hold that many packets. Each failure is a
``MediaError`` (``media_unreadable``) naming the reference and the reason.
"""

from __future__ import annotations

import io
import struct

from .errors import MEDIA_UNREADABLE, MediaError
from .pillow import needed
from .qwen import VideoInfo

EBML_MAGIC = b"\x1a\x45\xdf\xa3"
MATROSKA_SEGMENT = b"\x18\x53\x80\x67"


def pyav():
    """The ``av`` module (PyAV)."""
    return needed("av", "reading videos", "PyAV", "av")


def _bad(where: str, reason: str) -> MediaError:
    return MediaError(MEDIA_UNREADABLE, reason, where=where)


def _iso_boxes_fit(data: bytes) -> str | None:
    """Why an ISO BMFF file's top-level boxes do not cover its bytes exactly (None when they do)."""
    at = 0
    while at < len(data):
        if at + 8 > len(data):
            return f"a box header cut at byte {at:,}"
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        if size == 1:
            if at + 16 > len(data):
                return f"a box header cut at byte {at:,}"
            size = struct.unpack(">Q", data[at + 8:at + 16])[0]
        elif size == 0:  # the last box runs to the end of the file
            return None
        if size < 8:
            return f"a box of {size} bytes at byte {at:,}"
        if at + size > len(data):
            return f"its {kind.decode('latin-1')!r} box needs {at + size:,} bytes"
        at += size
    return None


def _ebml_vint(data: bytes, at: int) -> tuple[int, int, bool] | None:
    """(value, length, unknown) of the EBML variable-size integer at ``at``; None when cut."""
    if at >= len(data) or data[at] == 0:
        return None
    length = 9 - data[at].bit_length()
    if at + length > len(data):
        return None
    value = int.from_bytes(data[at:at + length], "big") & ((1 << (7 * length)) - 1)
    return value, length, value == (1 << (7 * length)) - 1


def _container_fits(data: bytes) -> str | None:
    """Why the container's top-level structure does not fit ``data`` (None when it does, or
    the container is none of those checked)."""
    if data[4:8] == b"ftyp":
        return _iso_boxes_fit(data)
    if data[:4] == b"RIFF" and len(data) >= 8:
        need = struct.unpack("<I", data[4:8])[0] + 8
        return f"its RIFF header says {need:,} bytes" if need > len(data) else None
    if data[:4] == EBML_MAGIC:
        head = _ebml_vint(data, 4)
        seg = head[0] + 4 + head[1] if head else len(data)
        if data[seg:seg + 4] != MATROSKA_SEGMENT:
            return "no Matroska Segment after its EBML header"
        size = _ebml_vint(data, seg + 4)
        if size is None:
            return "its Segment header is cut"
        need = seg + 4 + size[1] + size[0]
        return f"its Segment says {need:,} bytes" if not size[2] and need > len(data) else None
    return None


def video_info(data: bytes, where: str = "") -> VideoInfo:
    """The first video stream's frame count, frame rate (None when the container has none) and
    size, as transformers' PyAV reader reads them; ``MediaError`` (``media_unreadable``) when
    no demuxer accepts the bytes, they hold no video stream, or they end early."""
    av = pyav()
    why = _container_fits(data)
    if why is not None:
        raise _bad(where, f"a video that ends early: {why} ({len(data):,} bytes; the file is truncated)")
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.video:
                raise _bad(where, f"a {container.format.name} file with no video stream")
            stream = container.streams.video[0]
            recorded, rate = stream.frames, stream.average_rate
            width, height = stream.width, stream.height
            packets = sum(1 for p in container.demux(stream) if p.size)
    except av.error.FFmpegError as e:
        raise _bad(where, f"no video demuxer accepts these bytes ({len(data):,} bytes): {e.strerror}") from None
    if recorded and packets < recorded:
        raise _bad(where, f"a video that ends early: its container records {recorded} frames, its bytes hold "
                   f"{packets} ({len(data):,} bytes; the file is truncated)")
    frames = recorded or packets
    if not frames or not width or not height:
        raise _bad(where, f"a video with {frames} frames of {width}x{height}: nothing a processor can sample")
    return VideoInfo(frames=int(frames), fps=float(rate) if rate else None, width=int(width), height=int(height))
