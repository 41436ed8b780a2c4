"""The one error a media item raises: a typed reject the pipeline maps to a reject line.

``reason`` is one of ``REASONS``: ``media_missing`` (no file or object at the reference),
``media_unreadable`` (the bytes cannot be read, no decoder accepts them, or they end early),
``media_unsupported`` (a readable image the model's processor refuses, such as an aspect
ratio over 200 for the Qwen family).
"""

from __future__ import annotations

from ..errors import RecordError

MEDIA_MISSING = "media_missing"
MEDIA_UNREADABLE = "media_unreadable"
MEDIA_UNSUPPORTED = "media_unsupported"
REASONS = (MEDIA_MISSING, MEDIA_UNREADABLE, MEDIA_UNSUPPORTED)


class MediaError(RecordError):
    """A media item rejects its record: ``reason`` (one of ``REASONS``), ``where`` the
    reference as the record gave it, the message what is wrong and how to fix it."""

    def __init__(self, reason: str, message: str, where: str = "", record: int | None = None):
        super().__init__(reason, message, where=where, record=record)
