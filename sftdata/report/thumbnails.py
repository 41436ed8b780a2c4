"""Small pictures of the images the report's sampled episodes hold: each read again from its
uri, EXIF orientation applied, shrunk to ``THUMB_PIXELS`` on its longer side and embedded as
a JPEG ``data:`` URL. Only the sampled episodes' images are decoded (a few dozen at most);
an image that cannot be read (moved, an inline ``data:`` item, no Pillow) has none, and the
page shows its label alone."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from ..errors import SftDataError
from ..media import read_media
from ..media.item import IMAGE, MediaSpan
from ..media.pillow import pillow
from .views import media_label, media_numbers

THUMB_PIXELS = 96


@dataclass
class Thumb:
    """One media item of a sampled episode: its label and, for an image that could be
    read, its thumbnail as a ``data:`` URL."""

    label: str
    uri: str
    src: str | None


def thumbnail(uri: str) -> str | None:
    """A JPEG ``data:`` URL of the image at ``uri``, at most ``THUMB_PIXELS`` a side, or None."""
    if uri.startswith("data:"):
        return None
    try:
        Image = pillow()
        from PIL import ImageOps

        with Image.open(io.BytesIO(read_media(uri).data)) as im:
            im = ImageOps.exif_transpose(im).convert("RGB")
            im.thumbnail((THUMB_PIXELS, THUMB_PIXELS))
            out = io.BytesIO()
            im.save(out, "JPEG", quality=80)
    except (SftDataError, OSError, ValueError):
        return None
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def thumbs(spans: list[MediaSpan]) -> list[Thumb]:
    """The label and thumbnail of each of one episode's (segment's) ``spans``."""
    return [Thumb(media_label(s, k), s.item.uri, thumbnail(s.item.uri) if s.item.kind == IMAGE else None)
            for s, k in zip(spans, media_numbers(spans))]
