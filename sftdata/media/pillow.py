"""The ``vision`` extra's modules (Pillow, PyAV), imported when media is first read, or one line
naming the extra."""

from __future__ import annotations

import importlib

from ..errors import InputError

EXTRA = "vision"
INSTALL_HINT = f"pip install 'sftdata[{EXTRA}]'"


def needed(module: str, what: str, package: str, pip_name: str):
    """``module`` imported; a missing one is one ``InputError`` line naming the extra:
    ``{what} needs {package}: pip install 'sftdata[vision]' (or pip install {pip_name})``."""
    try:
        importlib.import_module(module.partition(".")[0])  # the package first: a blocked one refuses its modules
        return importlib.import_module(module)
    except ImportError:
        raise InputError(f"{what} needs {package}: {INSTALL_HINT} (or pip install {pip_name})") from None


def pillow():
    """The ``PIL.Image`` module (Pillow)."""
    return needed("PIL.Image", "reading images", "Pillow", "Pillow")
