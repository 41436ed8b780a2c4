"""Pillow, imported when media is first read, or one line naming the ``vision`` extra."""

from __future__ import annotations

from ..errors import InputError

EXTRA = "vision"
INSTALL_HINT = f"pip install 'sftdata[{EXTRA}]'"


def pillow():
    """The ``PIL.Image`` module; a missing Pillow is one ``InputError`` line naming the extra."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError(f"reading images needs Pillow: {INSTALL_HINT} (or pip install Pillow)") from None
    return Image
