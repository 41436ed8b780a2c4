"""An image's size from its header, EXIF orientation applied, and a check that its bytes are
whole, without decoding a pixel.

``Image.open`` reads only the header. The size a processor sees is the size after
``ImageOps.exif_transpose`` (transformers' ``load_image`` applies it): orientations 5-8
(transpose, rotate 270, transverse, rotate 90) swap width and height. The integrity check runs
over the bytes that are hashed anyway:

* JPEG (and MPO): the EOI marker ``FF D9`` after the last start of scan ``FF DA`` (inside
  entropy-coded data every ``FF`` is stuffed, so neither can appear there by chance);
* PNG: every chunk's length and CRC, ending with ``IEND``;
* GIF: the trailer byte ``3B``; WebP: the RIFF container holds the size its header says;
* anything Pillow cannot identify is undecodable; other formats Pillow identifies (BMP,
  TIFF ...) are taken on their header.

Each failure is a ``MediaError`` (``media_unreadable``) naming the reference and the reason.
"""

from __future__ import annotations

import io
import struct
import warnings
import zlib
from dataclasses import dataclass

from .errors import MEDIA_UNREADABLE, MEDIA_UNSUPPORTED, MediaError
from .pillow import pillow

ORIENTATION_TAG = 0x0112
SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})  # the ones exif_transpose turns by 90 degrees
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class ImageHeader:
    """``width`` x ``height``: the size as shown (EXIF orientation applied), the size a processor
    resizes; ``stored_width`` x ``stored_height``: as the file stores it."""

    format: str
    width: int
    height: int
    stored_width: int
    stored_height: int
    orientation: int


def _bad(where: str, reason: str) -> MediaError:
    return MediaError(MEDIA_UNREADABLE, reason, where=where)


def check_jpeg(data: bytes, where: str = "") -> None:
    """The EOI marker follows the last start of scan, or the file ends early."""
    sos = data.rfind(b"\xff\xda")
    if sos < 0:
        raise _bad(where, "a JPEG without a start of scan (FF DA): no image data")
    if data.rfind(b"\xff\xd9") < sos:
        raise _bad(where, f"a JPEG that ends early: no end-of-image marker (FF D9) after its last scan "
                   f"({len(data):,} bytes; the file is truncated)")


def walk_png(data: bytes, where: str = "") -> bytes | None:
    """Every chunk of a PNG checked (length inside the file, CRC), ending with IEND; returns the
    eXIf chunk's payload, wherever it lies (before or after the image data), or None."""
    pos, exif, n = len(PNG_SIGNATURE), None, len(data)
    while True:
        if pos + 8 > n:
            raise _bad(where, f"a PNG that ends early: no IEND chunk ({n:,} bytes; the file is truncated)")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 8 + length + 4
        if end > n:
            raise _bad(where, f"a PNG that ends early: chunk {kind!r} at byte {pos:,} needs {length:,} bytes "
                       f"(the file is truncated)")
        body = data[pos + 4:end - 4]
        if zlib.crc32(body) != struct.unpack_from(">I", data, end - 4)[0]:
            raise _bad(where, f"a PNG whose chunk {kind!r} at byte {pos:,} fails its CRC (the file is corrupt)")
        if kind == b"eXIf" and exif is None:
            exif = body[4:]
        if kind == b"IEND":
            return exif
        pos = end


def check_gif(data: bytes, where: str = "") -> None:
    if not data.endswith(b"\x3b"):
        raise _bad(where, "a GIF that ends early: no trailer byte (3B) (the file is truncated)")


def check_webp(data: bytes, where: str = "") -> None:
    declared = int.from_bytes(data[4:8], "little") + 8
    if len(data) < declared:
        raise _bad(where, f"a WebP that ends early: its RIFF header says {declared:,} bytes, the file has "
                   f"{len(data):,} (the file is truncated)")


def _orientation(im, png_exif: bytes | None) -> int:
    """The EXIF orientation exif_transpose would read (EXIF, else XMP, as Pillow's getexif),
    without PngImageFile.getexif's pixel load: the PNG walk found eXIf wherever it lies."""
    if png_exif is not None:
        im.info["exif"] = png_exif
    value = pillow().Image.getexif(im).get(ORIENTATION_TAG, 1)
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def image_header(data: bytes, where: str = "") -> ImageHeader:
    """The header of an image's bytes, checked whole (see the module's docstring)."""
    Image = pillow()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise MediaError(MEDIA_UNSUPPORTED, f"an image too large to decode safely ({e})", where=where) from None
    except Image.UnidentifiedImageError:
        raise _bad(where, "not an image any decoder accepts (Pillow cannot identify its format)") from None
    except Exception as e:  # a plugin's own header errors (a header cut short, a bad field)
        raise _bad(where, f"not an image any decoder accepts: its header cannot be read ({type(e).__name__}: {e})") from None
    with im:
        fmt = im.format or "unknown"
        png_exif = None
        if fmt in ("JPEG", "MPO"):
            check_jpeg(data, where)
        elif fmt == "PNG":
            png_exif = walk_png(data, where)
        elif fmt == "GIF":
            check_gif(data, where)
        elif fmt == "WEBP":
            check_webp(data, where)
        try:
            orientation = _orientation(im, png_exif)
        except Exception as e:  # a malformed EXIF block: exif_transpose would fail on it at load time
            raise _bad(where, f"its EXIF block cannot be read ({type(e).__name__}: {e})") from None
        w, h = im.size
    if w < 1 or h < 1:
        raise _bad(where, f"an image of {w}x{h} pixels")
    shown = (h, w) if orientation in SWAPPING_ORIENTATIONS else (w, h)
    return ImageHeader(format=fmt, width=shown[0], height=shown[1], stored_width=w, stored_height=h,
                       orientation=orientation)
