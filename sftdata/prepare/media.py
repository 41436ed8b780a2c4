"""The media step of a chunk of records, in the worker, after parsing and before rendering:
each reference read (``media.read_media``: the record file's folder, or ``--media-root``),
an image's size read from its header (EXIF orientation applied, its bytes checked whole), a
video's frame count, frame rate and size from its container (``media.video_info``: no pixel
decoded, its bytes checked whole), its tokens counted under the run's processor settings
(a video: the Qwen family's only; another family rejects it by name), as a ``MediaItem``. Identical
references (with the same base folder) are read once per chunk; a bad item rejects its
record by its reason (``media_missing``, ``media_unreadable``, ``media_unsupported``),
never the run.

    >>> step = MediaStep(profile.processor, media_root)       # once per chunk
    >>> step.record_media(conv, rec.where)                     # {MediaRef: MediaItem}, or MediaError
"""

from __future__ import annotations

import posixpath

from ..errors import RecordError
from ..media import MEDIA_UNSUPPORTED, MediaError, image_count, image_header, read_media, video_count, video_info
from ..media.item import IMAGE, MediaItem
from ..media.settings import FAMILY_NAMES, QWEN
from ..records.conversation import Conversation
from ..records.turns import MediaRef
from ..util.urls import url_protocol


def record_refs(conv: Conversation) -> list[MediaRef]:
    """Every media reference of a conversation, in order (its turns as given, then any a
    repair added), each once."""
    return list(dict.fromkeys(r for turns in (conv.given_turns, conv.turns) for t in turns for r in t.media))


def record_base(where: str) -> str | None:
    """The folder of the record file ``where`` names (``file:line N``): what a relative
    reference is read from. A URL input's folder is a URL."""
    path = where.rsplit(":", 1)[0] if ":" in where else ""
    if not path:
        return None
    return posixpath.dirname(path) if url_protocol(path) not in (None, "file") else (posixpath.dirname(path) or ".")


class MediaStep:
    """A chunk's media, read and counted under ``settings`` (the processor's, pinned); each
    (reference, base) once: the item, or the ``MediaError`` it raised."""

    def __init__(self, settings: dict, media_root: str | None = None):
        self.settings, self.media_root = settings, media_root
        self.cache: dict[tuple[str, str, str | None], MediaItem | MediaError] = {}

    def item(self, ref: MediaRef, base: str | None) -> MediaItem:
        key = (ref.kind, ref.ref, base)
        got = self.cache.get(key)
        if got is None:
            try:
                got = self._read(ref, base)
            except MediaError as e:
                got = e
            self.cache[key] = got
        if isinstance(got, MediaError):
            raise got
        return got

    def _read(self, ref: MediaRef, base: str | None) -> MediaItem:
        name = ref.ref
        if self.media_root is None and base is not None and url_protocol(base) not in (None, "file") \
                and url_protocol(name) is None and not name.startswith(("data:", "/")):
            name, base = f"{base}/{name}", None  # a relative reference beside a URL input
        got = read_media(name, base=base, media_root=self.media_root)
        try:
            if ref.kind == IMAGE:
                head = image_header(got.data, ref.ref)
                size, stored = (head.width, head.height), (head.stored_width, head.stored_height)
                count = image_count(self.settings, head.width, head.height)
            else:
                if self.settings.get("family") not in QWEN:
                    raise MediaError(MEDIA_UNSUPPORTED, f"{FAMILY_NAMES.get(self.settings.get('family'), 'this model')}"
                                     " takes no video in sftdata: video is counted for the Qwen family only; leave "
                                     "the video out of the record, or give its frames as images")
                info = video_info(got.data, ref.ref)
                size = stored = (info.width, info.height)
                count = video_count(self.settings, info)
        except MediaError as e:
            raise MediaError(e.reason, e.detail, where=e.where or ref.ref) from None
        return MediaItem(ref.kind, got.uri, got.sha256, len(got.data), size, stored, count)

    def record_media(self, conv: Conversation, where: str) -> dict[MediaRef, MediaItem] | None:
        """Each reference of ``conv`` (read from ``where``'s folder) as its item; None when it
        has none. Raises ``RecordError`` (a ``MediaError``'s reason, naming the reference)."""
        refs = record_refs(conv)
        if not refs:
            return None
        base = record_base(where)
        out = {}
        for ref in refs:
            try:
                out[ref] = self.item(ref, base)
            except MediaError as e:
                named = f"{ref.kind} {e.where}: " if e.where else f"{ref.kind}: "
                raise RecordError(e.reason, named + e.detail, where) from None
        return out
