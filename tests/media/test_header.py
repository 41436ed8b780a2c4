"""Header sizes with EXIF orientation equal the size after ImageOps.exif_transpose (what
transformers' load_image hands a processor), and bytes that end early are media_unreadable."""

from __future__ import annotations

import io
import struct
import sys

import pytest

from sftdata.errors import InputError
from sftdata.media import MEDIA_UNREADABLE, MEDIA_UNSUPPORTED, MediaError, image_header
from sftdata.media.header import check_webp

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")


def _transposed_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as im:
        return ImageOps.exif_transpose(im).size


@pytest.mark.parametrize("orientation", [None, 1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_the_header_size_is_the_size_exif_transpose_gives(encode_image, fmt, orientation):
    data = encode_image(300, 120, fmt=fmt, orientation=orientation)
    h = image_header(data, "a.img")
    assert (h.width, h.height) == _transposed_size(data)
    swapped = orientation in (5, 6, 7, 8)
    assert (h.width, h.height) == ((120, 300) if swapped else (300, 120))
    assert (h.stored_width, h.stored_height, h.orientation, h.format) == (300, 120, orientation or 1, fmt)


@pytest.mark.parametrize("mode,fmt", [("RGBA", "PNG"), ("LA", "PNG"), ("L", "JPEG"), ("L", "PNG"), ("P", "GIF"),
                                      ("RGB", "BMP"), ("1", "PNG"), ("RGBA", "WEBP")])
def test_modes_and_formats(encode_image, mode, fmt):
    data = encode_image(33, 7, fmt=fmt, mode=mode)
    h = image_header(data)
    assert (h.format, h.width, h.height) == (fmt, 33, 7)


def _move_exif_after_image_data(png: bytes) -> bytes:
    """The same PNG with its eXIf chunk placed after IDAT, where Pillow finds it only on load."""
    chunks, pos = [], 8
    while pos < len(png):
        (length,) = struct.unpack_from(">I", png, pos)
        chunks.append(png[pos:pos + 12 + length])
        pos += 12 + length
    exif = [c for c in chunks if c[4:8] == b"eXIf"]
    rest = [c for c in chunks if c[4:8] != b"eXIf"]
    return png[:8] + b"".join(rest[:-1] + exif + rest[-1:])


def test_a_png_exif_after_the_image_data_still_turns_it(encode_image):
    data = _move_exif_after_image_data(encode_image(40, 10, fmt="PNG", mode="RGBA", orientation=6))
    with Image.open(io.BytesIO(data)) as im:
        assert "exif" not in im.info  # Pillow's header alone misses it
    h = image_header(data)
    assert (h.width, h.height, h.orientation) == (10, 40, 6) and (h.width, h.height) == _transposed_size(data)


def _reject(data: bytes, match: str):
    with pytest.raises(MediaError, match=match) as e:
        image_header(data, "photos/a.jpg")
    assert e.value.reason == MEDIA_UNREADABLE and e.value.where == "photos/a.jpg"
    assert str(e.value).startswith("photos/a.jpg: ")


@pytest.mark.parametrize("orientation", [None, 6])
def test_a_truncated_jpeg_with_its_header_intact_is_unreadable(encode_image, orientation):
    data = encode_image(256, 256, noise=True, orientation=orientation)
    cut = data[:len(data) * 3 // 4]
    h = image_header(data)
    with Image.open(io.BytesIO(cut)) as im:  # the header still opens: only the bytes' end tells
        assert im.size == (256, 256)
    assert (h.width, h.height) == (256, 256)
    _reject(cut, r"a JPEG that ends early: no end-of-image marker \(FF D9\) after its last scan "
                 rf"\({len(cut):,} bytes; the file is truncated\)")


def test_a_progressive_jpeg_cut_after_a_scan_is_unreadable(encode_image):
    im = Image.frombytes("RGB", (128, 128), bytes(range(256)) * 192)
    out = io.BytesIO()
    im.save(out, "JPEG", progressive=True)
    data = out.getvalue()
    assert image_header(data).format == "JPEG"
    last_scan = data.rfind(b"\xff\xda")
    _reject(data[:last_scan + 40], "a JPEG that ends early")


def test_a_truncated_png_is_unreadable(encode_image):
    data = encode_image(64, 64, fmt="PNG", mode="RGBA", noise=True)
    _reject(data[:-12], r"a PNG that ends early: no IEND chunk")
    _reject(data[:len(data) // 2], r"a PNG that ends early: chunk b'IDAT' at byte 33 needs [\d,]+ bytes")


def test_a_png_with_a_bad_crc_is_unreadable(encode_image):
    data = bytearray(encode_image(64, 64, fmt="PNG", noise=True))
    data[60] ^= 0xFF  # inside the first IDAT
    _reject(bytes(data), r"a PNG whose chunk b'IDAT' at byte 33 fails its CRC \(the file is corrupt\)")


def test_truncated_gif_and_webp_are_unreadable(encode_image):
    _reject(encode_image(40, 40, fmt="GIF", mode="P", noise=True)[:-1], r"a GIF that ends early: no trailer byte")
    webp = encode_image(64, 64, fmt="WEBP", noise=True)
    _reject(webp[:-10], r"not an image any decoder accepts: its header cannot be read \(OSError: ")  # Pillow's own
    declared = struct.unpack_from("<I", webp, 4)[0] + 8 + 10
    longer = webp[:4] + struct.pack("<I", declared - 8) + webp[8:]  # a RIFF size past the bytes it has
    _reject(longer, r"not an image any decoder accepts: its header cannot be read")  # libwebp checks it at open
    with pytest.raises(MediaError, match=rf"^x.webp: a WebP that ends early: its RIFF header says {declared:,} bytes, "
                                         rf"the file has {len(webp):,} \(the file is truncated\)$"):
        check_webp(longer, "x.webp")  # and so does the container check, should a Pillow build not


@pytest.mark.parametrize("data", [b"", b"hello", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\xff\xd8\xff"])
def test_bytes_no_decoder_accepts_are_unreadable(data):
    _reject(data, r"not an image any decoder accepts")


def test_an_image_past_pillows_bomb_limit_is_unsupported(encode_image, monkeypatch):
    data = encode_image(100, 100)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # Pillow refuses over twice the limit: 10,000 > 4,000
    with pytest.raises(MediaError, match=r"^big.jpg: an image too large to decode safely \(Image size \(10000 pixels\) "
                                         r"exceeds limit of 4000 pixels") as e:
        image_header(data, "big.jpg")
    assert e.value.reason == MEDIA_UNSUPPORTED


def test_a_missing_pillow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(InputError, match=r"^reading images needs Pillow: pip install 'sftdata\[vision\]' "
                                         r"\(or pip install Pillow\)$"):
        image_header(b"\xff\xd8")
