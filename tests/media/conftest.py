"""Images made in the test, with Pillow: any size, mode, format and EXIF orientation."""

from __future__ import annotations

import io
import random

import pytest


def _encode(width: int, height: int, fmt: str = "JPEG", mode: str = "RGB", orientation: int | None = None,
            noise: bool = False, seed: int = 0) -> bytes:
    from PIL import Image  # the fixture is only requested by modules that skip without Pillow

    if noise:  # incompressible pixels: a long scan, so a cut lands inside the image data
        raw = random.Random(seed).randbytes(width * height * len(mode))
        im = Image.frombytes(mode, (width, height), raw)
    else:
        im = Image.new(mode, (width, height))
    kwargs = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    out = io.BytesIO()
    im.save(out, fmt, **kwargs)
    return out.getvalue()


@pytest.fixture
def encode_image():
    """``encode_image(width, height, fmt="JPEG", mode="RGB", orientation=None, noise=False)`` -> bytes."""
    pytest.importorskip("PIL.Image")
    return _encode
